// fsdp-cpp: where the ledger's measured bytes come from.
// defines: MemoryReading, MemorySource, memory_source_for
//
// The ledger's measured terms (A, A_recompute, the peak, current, cached)
// are differences and peaks of one allocator's counters: the allocator that
// holds the job's tensors. On the CPU that is fsdp's counting allocator
// (fsdp/memory.h); on a GPU it is libtorch's CUDA caching allocator of the
// job's device (fsdp/device.h, device_memory), where the host's counters
// read next to nothing. The engine picks its source once, from
// FsdpOptions::device, and every measurement reads it; a test may hand the
// engine another (EngineAccess::use_memory_source) to play a device.
//
// A background save runs beside training: on the CPU the counting allocator
// keeps its blocks apart (memory::BackgroundWork), so training's own bytes
// read exactly whatever the save's thread allocates or frees meanwhile. A
// GPU's caching allocator cannot tell them apart: there the save's device
// copies, freed by its thread, can still move a difference; the ledger then
// reports a measurement that cannot be (Ledger::notes) instead of failing.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

namespace fsdp::detail {

struct MemoryReading {
  int64_t current = 0;  // held by tensors now
  int64_t peak = 0;     // most held since the last reset_peak
  int64_t cached = 0;   // kept by the allocator for reuse, not held by tensors
  // Of current, what training holds: less the work running beside it (a
  // background checkpoint's snapshot and writes, memory::BackgroundWork),
  // read from one counter of its own. -1: the source cannot tell them apart.
  int64_t foreground = -1;
  // What the ledger's differences (A, A_recompute) are taken of: a save in
  // flight copies and frees its snapshot while training measures, and must
  // not move them.
  int64_t training() const { return foreground >= 0 ? foreground : current; }
};

class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual MemoryReading read() const = 0;
  // Starts a new peak from the current bytes.
  virtual void reset_peak() = 0;
  // What the ledger names as its source, e.g. "counting allocator".
  virtual std::string name() const = 0;
};

// CPU: the counting allocator; cuda:K: that device's caching allocator.
std::unique_ptr<MemorySource> memory_source_for(const c10::Device& device);

}  // namespace fsdp::detail
