// Helpers shared by the C++ unit tests (the *_test.cc files); the engine never
// includes this header.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "core/error.h"

namespace chute::test {

// ThreadSanitizer does not follow a signal handler that leaves by
// siglongjmp, nor keep its state straight across one that remaps the
// faulting page (see scripts/sanitize.sh): tests that drive a SIGBUS out
// of a file mapping skip under it; the other sanitizers and plain builds
// run them.
#if defined(__SANITIZE_THREAD__)
constexpr bool kSigbusTests = false;
#else
constexpr bool kSigbusTests = true;
#endif

// The chute::Error that `fn` throws, or nothing when it returns normally.
// Any other exception propagates, and gtest reports it as a failure.
template <typename Fn>
std::optional<Error> error_from(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

// A fresh directory under $TMPDIR (or /tmp), removed with its contents when
// the object dies.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") +
                       "/chute-unit-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "cannot create " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

  // Writes `bytes` to `name` inside the directory; returns the full path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string file = path_ + "/" + name;
    std::FILE* f = std::fopen(file.c_str(), "wb");
    if (f == nullptr) {
      ADD_FAILURE() << "cannot create " << file;
      return file;
    }
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (std::fclose(f) != 0 || !ok) ADD_FAILURE() << "cannot write " << file;
    return file;
  }

 private:
  std::string path_;
};

}  // namespace chute::test
