// fsdp-cpp: the counting CPU allocator behind the ledger.
// defines: memory::install, memory::stats, memory::reset_peak, memory::set_limit,
//          memory::OutOfMemory, memory::Stats
//
// Installed with c10::SetCPUAllocator before the model is built (by
// fsdp::init, init.h, or by calling install() yourself; nothing installs it
// implicitly), it wraps the default CPU allocator and
// carries each block's size in its DataPtr context, so current and peak bytes
// are exact for every tensor allocated afterwards. With a limit set, an
// allocation that would pass it throws memory::OutOfMemory (like a GPU's
// memory), whose message the FSDP layer turns into a ledger diagnosis.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "fsdp/errors.h"

namespace fsdp::memory {

struct Stats {
  int64_t current = 0;      // bytes held by live tensors allocated since install
  int64_t peak = 0;         // max of current since install or reset_peak()
  int64_t allocations = 0;  // count of allocations
  int64_t limit = 0;        // 0 = none
};

// Idempotent. Returns true when the counting allocator is active. Without
// it, stats() stays zero, the ledger's peak/current are 0 and set_limit has
// no effect.
bool install();
bool installed();
Stats stats();
void reset_peak();

// 0 removes the limit.
void set_limit(int64_t bytes);

// Called (outside the allocator lock) to explain an over-limit allocation;
// the FSDP layer installs one that names the ledger term that overflowed.
void set_oom_explainer(std::function<std::string(int64_t requested, const Stats&)> fn);

class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// "1.50 MiB"
std::string format_bytes(int64_t bytes);

}  // namespace fsdp::memory
