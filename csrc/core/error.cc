#include "core/error.h"

#include <cstring>
#include <system_error>
#include <utility>

namespace chute {
namespace {

const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

std::string with_location(const std::string& message, const char* file, int line) {
  std::ostringstream os;
  os << message << " [" << file << ":" << line << "]";
  return os.str();
}

}  // namespace

Error::Error(ErrorKind kind, const std::string& message, const char* file, int line,
             ErrorScope scope, ErrorPlace place, OsFailure os_failure)
    : std::runtime_error(with_location(message, basename_of(file), line)),
      kind_(kind),
      scope_(scope),
      place_(std::move(place)),
      os_failure_(std::move(os_failure)),
      message_(message),
      file_(basename_of(file)),
      line_(line) {}

Error Error::with_prefix(const std::string& prefix) const {
  return Error(kind_, prefix + message_, file_, line_, scope_, place_, os_failure_);
}

Error Error::scoped(ErrorScope scope, const ErrorPlace& place) const {
  ErrorPlace filled = place_;
  if (filled.url.empty()) filled.url = place.url;
  if (filled.member.empty()) filled.member = place.member;
  if (filled.key.empty()) filled.key = place.key;
  return Error(kind_, message_, file_, line_, scope_ == ErrorScope::kOther ? scope : scope_,
               std::move(filled), os_failure_);
}

void raise_error(ErrorKind kind, const std::string& message, const char* file, int line,
                 OsFailure os_failure) {
  throw Error(kind, message, file, line, ErrorScope::kOther, {}, std::move(os_failure));
}

std::ostream& operator<<(std::ostream& os, const OsFailure& failure) {
  if (failure.number == 0) return os;
  if (auto* message = dynamic_cast<ErrorMessage*>(&os)) message->os_failure_ = failure;
  // strerror() is not thread-safe; the generic category's message is.
  return os << ": " << std::generic_category().message(failure.number);
}

std::ostream& operator<<(std::ostream& os, const At& at) {
  if (!at.where.empty()) os << at.where << ": ";
  return os;
}

std::ostream& operator<<(std::ostream& os, const Detail& detail) {
  if (!detail.text.empty()) os << ": " << detail.text;
  return os;
}

}  // namespace chute
