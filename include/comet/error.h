// comet/error.h: the error type every host-side failure throws, and the status that
// "can this run?" questions return.
//
// Contract: library code never calls exit() or abort() on bad input. A precondition that a
// caller can violate throws comet::Error with the failed condition, file:line and a message
// a user can act on. Functions that answer "is this configuration possible?" return a Status
// instead, so callers can print the reason without catching.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace comet {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A timeout in the signal protocol: a wait whose signal never reached its expected value.
// Derived from Error so callers that only care about "failed" need not know the difference.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message) : Error(message) {}
};

struct Status {
  bool ok = true;
  std::string reason;  // empty when ok

  static Status success() { return {}; }
  static Status failure(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

namespace detail {
[[noreturn]] inline void throw_check_failure(const char* condition, const char* file, int line,
                                             const std::string& message) {
  std::ostringstream os;
  os << message << " (check `" << condition << "` failed at " << file << ":" << line << ")";
  throw Error(os.str());
}
}  // namespace detail

}  // namespace comet

// COMET_CHECK(cond, stream-expression): throw comet::Error when cond is false.
//   COMET_CHECK(t < max_tokens, "rank " << r << " has " << t << " tokens, more than T_max");
#define COMET_CHECK(cond, msg)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::ostringstream comet_check_os_;                                                   \
      comet_check_os_ << msg;                                                               \
      ::comet::detail::throw_check_failure(#cond, __FILE__, __LINE__, comet_check_os_.str()); \
    }                                                                                       \
  } while (0)
