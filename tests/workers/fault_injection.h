// fsdp-cpp tests: faults injected into the example trainers (tiny, gpt) that
// the worker runs (`fsdp_test_worker tiny|gpt FLAGS...`, trainer_scenarios.cpp),
// for the tests of the straggler monitor and the watchdog. The trainers
// call them through examples::StepHooks.
// defines: fsdp::testing::inject_step_delay, fsdp::testing::inject_data_hang,
//          fsdp::testing::fault_hooks
//
// With the environment FSDP_INJECT_STEP_DELAY="RANK:MS" (e.g. 1:50), sleeps
// MS milliseconds when called on rank RANK and does nothing elsewhere; the
// trainers call it once per step, at its start. Unset: no-op. A malformed
// value throws fsdp::UsageError naming the variable.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "fsdp/errors.h"
#include "step_hooks.h"
#include "usage.h"

namespace fsdp::testing {

inline void inject_step_delay(int rank) {
  const char* v = std::getenv("FSDP_INJECT_STEP_DELAY");
  if (!v || !*v) return;
  const std::string s(v);
  const auto colon = s.find(':');
  char* end = nullptr;
  long r = -1;
  double ms = -1;
  if (colon != std::string::npos && colon > 0) {
    r = std::strtol(s.c_str(), &end, 10);
    if (end != s.c_str() + colon) r = -1;
    ms = std::strtod(s.c_str() + colon + 1, &end);
    if (colon + 1 == s.size() || *end != '\0' || !std::isfinite(ms)) ms = -1;
  }
  if (r < 0 || ms < 0 || ms > 3.6e6)
    throw fsdp::UsageError(fsdp::detail::cat("FSDP_INJECT_STEP_DELAY='", s,
                                       "': expected RANK:MS (a rank >= 0 and milliseconds 0..3600000 of sleep per step "
                                       "on that rank, e.g. 1:50); unset it to train without an injected delay"));
  if (r == rank) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

// With FSDP_INJECT_DATA_HANG="RANK:STEP" (e.g. 2:3), loops forever (busy,
// as a data loader stuck in a retry loop does) when called on rank RANK at
// step STEP; the trainers call it in their data phase. Unset: no-op. A
// malformed value throws fsdp::UsageError naming the variable.
inline void inject_data_hang(int rank, int64_t step) {
  const char* v = std::getenv("FSDP_INJECT_DATA_HANG");
  if (!v || !*v) return;
  const std::string s(v);
  const auto colon = s.find(':');
  char* end = nullptr;
  long r = -1;
  long long at = -1;
  if (colon != std::string::npos && colon > 0) {
    r = std::strtol(s.c_str(), &end, 10);
    if (end != s.c_str() + colon) r = -1;
    at = std::strtoll(s.c_str() + colon + 1, &end, 10);
    if (colon + 1 == s.size() || *end != '\0') at = -1;
  }
  if (r < 0 || at < 0)
    throw fsdp::UsageError(fsdp::detail::cat("FSDP_INJECT_DATA_HANG='", s,
                                             "': expected RANK:STEP (a rank >= 0 and a step >= 0 at which that rank's "
                                             "data loading never returns, e.g. 2:3); unset it to train normally"));
  if (r != rank || at != step) return;
  volatile uint64_t spin = 0;
  for (;;) spin = spin + 1;  // a data loader that never returns
}

// Both, for a trainer's StepHooks. Each reads its variable at every call,
// so a malformed value fails the first step, before any collective of it.
inline examples::StepHooks fault_hooks() {
  examples::StepHooks h;
  h.step = [](int rank, int64_t) { inject_step_delay(rank); };
  h.data = [](int rank, int64_t step) { inject_data_hang(rank, step); };
  return h;
}

}  // namespace fsdp::testing
