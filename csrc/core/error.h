// One exception type for the engine, thrown through one macro that records
// where in the engine it was raised. The message itself must name the data
// location (shard/file, member/row, byte offset); the bindings map the kind to
// a Python exception class. What the failure is about (its scope) and where
// in the data it lies (url, member, sample key) travel beside the message as
// data, set by the code that knows them, so that nothing downstream has to
// read them out of the words; so is the OS error a failed system call gave.
#pragma once

#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace chute {

enum class ErrorKind {
  kData,     // the input is malformed: corrupt image, bad tar header, shape mismatch
  kIo,       // the OS failed us: missing file, read error, pipe command failed
  kUsage,    // the caller asked for something impossible: bad spec, index out of range
  kTimeout,  // a wait exceeded its limit
  kMemory,   // an allocation failed: the memory asked for is not there
};

// Which stage of a pipeline a failure belongs to, which decides the handler
// webdataset would give it.
enum class ErrorScope {
  kOther,   // none of those below (not known where it was raised)
  kRead,    // opening or reading a shard or file, its tar structure or compression
  kMember,  // a member (a row's column) that does not decode
  kField,   // a sample lacks the member a field needs
  kBatch,   // a sample that does not fit the batch being formed
};

// Where in the data a failure lies; an empty string is not known.
struct ErrorPlace {
  std::string url;     // the shard or file
  std::string member;  // the member's full name, or the column of a row
  std::string key;     // the sample's key
};

// The failed system call a kIo error comes from: its errno (0: the failure
// is not an OS error, e.g. a pipe command that exited with a status) and the
// file the call was about (empty where it was about none: a pipe, a poll).
// Written into a CHUTE_CHECK message it adds ": <the errno's description>"
// and gives the error raised the number and path as data, so that the words
// and the number cannot disagree (a number 0 adds nothing):
//   CHUTE_CHECK(fd >= 0, kIo, "cannot open '" << path << "'" << OsFailure(err, path));
// (A constructor rather than braces: a comma inside braces would split the
// macro's arguments.)
struct OsFailure {
  OsFailure() = default;
  explicit OsFailure(int number, std::string path = {}) : number(number), path(std::move(path)) {}
  int number = 0;
  std::string path;
};
std::ostream& operator<<(std::ostream& os, const OsFailure& failure);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, const char* file, int line,
        ErrorScope scope = ErrorScope::kOther, ErrorPlace place = {},
        OsFailure os_failure = {});
  ErrorKind kind() const { return kind_; }
  ErrorScope scope() const { return scope_; }
  const ErrorPlace& place() const { return place_; }
  const OsFailure& os_failure() const { return os_failure_; }
  // The message without the "[file:line]" suffix.
  const std::string& message() const { return message_; }
  // Where it was raised: the source file's base name and line.
  const char* file() const { return file_; }
  int line() const { return line_; }

  // The same error (kind, and the place it was raised) with `prefix` in
  // front of the message: how a caller that knows where in the data it
  // happened adds that, without the error seeming to come from the caller.
  Error with_prefix(const std::string& prefix) const;

  // The same error with `scope` and `place` where it had none: the code
  // nearest the failure that knows them sets them, and code further out
  // (which sees more kinds of failure pass) fills in only what is left:
  // a place's fields one by one, the scope when it is still kOther.
  Error scoped(ErrorScope scope, const ErrorPlace& place) const;

 private:
  ErrorKind kind_;
  ErrorScope scope_;
  ErrorPlace place_;
  OsFailure os_failure_;
  std::string message_;
  const char* file_;  // a string literal (__FILE__): lives for the program
  int line_;
};

[[noreturn]] void raise_error(ErrorKind kind, const std::string& message, const char* file,
                              int line, OsFailure os_failure = {});

// The stream a CHUTE_CHECK writes its message into: it also keeps the
// OsFailure written there, for the error raised.
class ErrorMessage : public std::ostringstream {
 public:
  const OsFailure& os_failure() const { return os_failure_; }

 private:
  friend std::ostream& operator<<(std::ostream& os, const OsFailure& failure);
  OsFailure os_failure_;
};

// Message parts that may be empty, so that a message never shows an empty
// field (": : corrupt PNG", "corrupt JPEG: "):
//   os << At{where} << "corrupt PNG" << Detail{reason};
// At writes "where: ", or nothing for no where: a decoder that does not know
// where its bytes lie starts with its own words and the caller that knows
// puts the place in front (Error::with_prefix). Detail writes ": reason", or
// nothing for no reason.
struct At {
  const std::string& where;
};
struct Detail {
  std::string_view text;
};
std::ostream& operator<<(std::ostream& os, const At& at);
std::ostream& operator<<(std::ostream& os, const Detail& detail);

}  // namespace chute

// CHUTE_CHECK(cond, kData, "shard '" << name << "' ...");
#define CHUTE_CHECK(cond, kind, stream_expr)                                                \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      ::chute::ErrorMessage chute_check_os_;                                                \
      chute_check_os_ << stream_expr;                                                       \
      ::chute::raise_error(::chute::ErrorKind::kind, chute_check_os_.str(), __FILE__, __LINE__, \
                           chute_check_os_.os_failure());                                   \
    }                                                                                       \
  } while (0)
