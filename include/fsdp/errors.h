// fsdp-cpp: the two tiers of errors, one hierarchy.
// defines: Error, InternalError, FSDP_CHECK, FSDP_USER_CHECK
//
// Every error fsdp-cpp raises derives from fsdp::Error, so one
//   catch (const fsdp::Error& e)
// handles all of them. The subclasses say what failed:
//   fsdp::CollectiveError      a collective failed (timeout, dead peer, misuse); comm.h
//   fsdp::memory::OutOfMemory  an allocation over memory::set_limit; memory.h
//   fsdp::InternalError        a bug in fsdp-cpp (FSDP_CHECK failed)
// - User errors (fsdp::Error itself): something the user can fix (bad option,
//   bad file, misuse); the message says what was expected, what was found
//   and what to do.
// - Internal invariants (FSDP_CHECK -> InternalError): the message carries
//   file:line, the rank and both values; report it.
// Errors of libtorch (c10::Error) and of the standard library pass through
// unchanged.
// The library never calls exit(); every failure is an exception.
#pragma once

#include <stdexcept>
#include <string>

#include "fsdp/detail/errors.h"

namespace fsdp {

// A failure the user caused and can fix (bad option, bad file, misuse).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failed internal invariant: a bug in fsdp-cpp, not in the caller's code.
class InternalError : public Error {
 public:
  using Error::Error;
};

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
