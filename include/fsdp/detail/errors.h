// fsdp-cpp, implementation detail of fsdp/errors.h: what FSDP_CHECK and
// FSDP_USER_CHECK expand to. Not public API: include fsdp/errors.h instead.
//
// defines: detail::current_rank_for_errors, set_rank_for_errors,
//          internal_error, cat
#pragma once

#include <sstream>
#include <string>

namespace fsdp::detail {

// The rank internal errors name; -1 when unknown.
int current_rank_for_errors();
// Set by make_communicator_from_env (the rank it read from RANK).
void set_rank_for_errors(int rank);
// Throws fsdp::InternalError with file:line, the rank and `msg`.
[[noreturn]] void internal_error(const char* file, int line, const std::string& msg);

// The message parts, streamed one after the other into one string.
template <class... Ts>
std::string cat(const Ts&... xs) {
  std::ostringstream os;
  (os << ... << xs);
  return os.str();
}

}  // namespace fsdp::detail
