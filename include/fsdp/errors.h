// fsdp-cpp: the two tiers of errors.
// defines: Error, UsageError, FSDP_CHECK, FSDP_USER_CHECK
//
// - Internal invariants (FSDP_CHECK): a bug in fsdp-cpp; the message carries
//   file:line, the rank and both values.
// - User errors (fsdp::Error / UsageError): something the user can fix; the
//   message says what was expected, what was found and what to do.
// The library never calls exit(); every failure is an exception.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fsdp {

// A failure the user caused and can fix (bad option, bad file, misuse).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A command-line usage error (bad flag or value): tools exit with code 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

namespace detail {
int current_rank_for_errors();  // -1 when unknown
[[noreturn]] void internal_error(const char* file, int line, const std::string& msg);

template <class... Ts>
std::string cat(const Ts&... xs) {
  std::ostringstream os;
  (os << ... << xs);
  return os.str();
}
}  // namespace detail

}  // namespace fsdp

// Internal invariant: fails with file:line, rank and the message parts.
#define FSDP_CHECK(cond, ...)                                                      \
  do {                                                                             \
    if (!(cond))                                                                   \
      ::fsdp::detail::internal_error(__FILE__, __LINE__,                           \
                                     ::fsdp::detail::cat("check failed: " #cond " ", \
                                                         ##__VA_ARGS__));          \
  } while (0)

// User-facing check: throws fsdp::Error with the concatenated message.
#define FSDP_USER_CHECK(cond, ...)                                     \
  do {                                                                 \
    if (!(cond)) throw ::fsdp::Error(::fsdp::detail::cat(__VA_ARGS__)); \
  } while (0)
