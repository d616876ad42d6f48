// fsdp-cpp: the counting CPU allocator behind the ledger.
// defines: memory::install, memory::stats, memory::reset_peak, memory::set_limit,
//          memory::empty_cache, memory::set_caching, memory::OutOfMemory, memory::Stats,
//          memory::ProcessMemory, memory::process_memory, memory::CommBuffers,
//          memory::BackgroundWork
//
// Installed with c10::SetCPUAllocator before the model is built (by
// fsdp::init, init.h, or by calling install() yourself; nothing installs it
// implicitly), it wraps the default CPU allocator and
// carries each block's size in its DataPtr context, so current and peak bytes
// are exact for every tensor allocated afterwards. Blocks of 64 KiB and more
// are cached and reused (a training step repeats the sizes of the last one),
// so a steady-state step asks the system for almost nothing: no page faults
// for fresh zeroed pages. With a limit set, an
// allocation that would pass it throws memory::OutOfMemory (like a GPU's
// memory), whose message the FSDP layer turns into a ledger diagnosis.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "fsdp/errors.h"

// The counting CPU allocator: exact bytes held, peaks, a cache and a limit.
namespace fsdp::memory {

// A snapshot of the allocator's counters (all zero while it is not
// installed).
struct Stats {
  int64_t current = 0;      // bytes held by live tensors allocated since install
  int64_t peak = 0;         // max of current since install or reset_peak()
  int64_t high_water = 0;   // max of current since install, never reset (construction included)
  int64_t allocations = 0;  // count of allocations
  int64_t limit = 0;        // 0 = none
  // The cache (blocks of 64 KiB and more kept for reuse instead of returned
  // to the system). Never part of current/peak: the process holds about
  // current + cached.
  int64_t cached = 0;              // bytes in free blocks the cache keeps now
  int64_t cache_hits = 0;          // allocations served from the cache
  int64_t system_allocations = 0;  // allocations that went to the system (malloc)
  int64_t cache_released = 0;      // cached bytes given back (bound, limit, empty_cache)
  // Communication buffers (CommBuffers): part of current, apart.
  int64_t comm_current = 0;
  int64_t comm_high = 0;  // the most at once since install
  // Work running beside training (BackgroundWork: a background checkpoint's
  // snapshot and writes): part of current, apart. foreground_current is the
  // rest, kept in a counter of its own, so a block another thread frees
  // never shows half counted in it: what a measurement of training's own
  // bytes reads (the ledger's A).
  int64_t background_current = 0;
  // Bytes allocated outside BackgroundWork now: about current -
  // background_current, counted on its own.
  int64_t foreground_current = 0;
  // What the allocator holds from the system (tensors, cache, headers,
  // rounding) now.
  int64_t footprint = 0;
  // The most it has held from the system at once.
  int64_t footprint_high = 0;
};

// Idempotent. Returns true when the counting allocator is active. Without
// it, stats() stays zero, the ledger's peak/current are 0 and set_limit has
// no effect.
bool install();
// Whether the counting allocator is active.
bool installed();
// The counters now.
Stats stats();
// Starts Stats::peak again from the current bytes (high_water is never reset).
void reset_peak();

// 0 removes the limit. The limit bounds held plus cached bytes: cached blocks
// are released (oldest first) before an allocation is refused, so a refusal
// means the tensors themselves need more.
void set_limit(int64_t bytes);

// Gives every cached block back to the system; returns the bytes released.
int64_t empty_cache();
// Caching is on by default (fsdp::init turns it off for
// InitOptions::allocator_cache = false or FSDP_ALLOC_CACHE=off);
// turning it off empties the cache.
void set_caching(bool on);
// Whether freed blocks are cached for reuse.
bool caching();

// Called (outside the allocator lock) to explain an over-limit allocation;
// the FSDP layer installs one that names the ledger term that overflowed.
void set_oom_explainer(std::function<std::string(int64_t requested, const Stats&)> fn);

// Thrown by an allocation over set_limit(). The tensors need more than the
// limit (the cache was released first); the message names the ledger term
// that overflowed when the FSDP layer's explainer is installed.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// The process's resident high-water mark (VmHWM in /proc/self/status): what
// the system saw, cache and every library included. 0 where unknown.
int64_t process_peak_rss();

// Allocations this thread makes while one lives count as communication
// buffers (ProcessMemory::comm, Stats::comm_current) instead of tensors. The
// communicators' threads hold one for their life; a program's own
// communication thread can too.
class CommBuffers {
 public:
  // This thread's allocations count as communication buffers from here.
  CommBuffers();
  // Until the outermost one on this thread goes.
  ~CommBuffers();
  CommBuffers(const CommBuffers&) = delete;
  CommBuffers& operator=(const CommBuffers&) = delete;
};

// Allocations this thread makes while one lives belong to work running
// beside training, whatever thread later frees them: they count in current
// and peak like any tensor, and apart in Stats::background_current, so a
// measurement of training's own bytes (Stats::foreground_current) is not
// moved by them. A background checkpoint save holds one on its thread and
// while the caller copies its snapshot (checkpoint/background_save.cpp).
class BackgroundWork {
 public:
  // This thread's allocations belong to background work from here.
  BackgroundWork();
  // Until the outermost one on this thread goes.
  ~BackgroundWork();
  BackgroundWork(const BackgroundWork&) = delete;
  BackgroundWork& operator=(const BackgroundWork&) = delete;
};

// The process's peak resident memory (VmHWM) broken into its parts: what a
// per-process budget must hold beside the tensors the ledger counts (fsdp
// plan --budget-rss). The counting allocator samples the process's resident
// size each time its own footprint (tensors + cache) reaches a new high; the
// parts are those of the largest sample. 0s without the counting allocator.
struct ProcessMemory {
  int64_t vmhwm = 0;        // the process's resident high-water mark (VmHWM)
  int64_t at_start = 0;     // resident when the counting allocator was installed: libtorch's code
                            // and data, the C++ runtime (what fsdp::init finds)
  int64_t code_since = 0;   // library pages (file-backed: code, read-only data) first touched after
                            // that, at the sample: kernels first used in training
  int64_t shared = 0;       // host-shared memory mapped at the sample (units' parameters and peer
                            // gradients that every rank of the host maps: Communicator::
                            // shares_host_memory); each rank counts it whole, the host holds it once
  int64_t tensors = 0;      // bytes held by tensors at the sample, communication buffers excluded
  int64_t comm = 0;         // communication buffers at the sample (CommBuffers)
  int64_t cache = 0;        // the allocator's cache at the sample: freed blocks kept, headers, rounding
  int64_t malloc_other = 0; // in use in malloc's heap besides the allocator's blocks at the sample:
                            // libtorch's and the program's objects (autograd graph, strings, maps)
  int64_t malloc_free = 0;  // freed memory malloc keeps at the sample (not returned to the system)
  int64_t unexplained = 0;  // resident at the sample minus the parts above: thread stacks, other mappings
  int64_t sample = 0;       // resident at the sample (<= vmhwm)
  int64_t elsewhere = 0;    // vmhwm - sample: a peak reached at another moment (or between samples)
  int64_t comm_high = 0;    // the most communication buffers held at once (not a part of the sum)
  int64_t pss = -1;         // proportional set size when asked (not a part): shared pages divided
                            // among the processes mapping them, so a host's ranks sum to what it
                            // holds; -1 where the kernel does not say
  // VmHWM less the allocator's footprint at the sample (tensors, comm,
  // cache): what a process holds beside what a --max-memory limit bounds.
  int64_t fixed() const;
  std::string str() const;  // the table the examples print, a row per part
};
// VmHWM now, and its parts at the largest sample (see ProcessMemory).
ProcessMemory process_memory();

// "1.50 MiB"
std::string format_bytes(int64_t bytes);

}  // namespace fsdp::memory
