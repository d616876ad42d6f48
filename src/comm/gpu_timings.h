// fsdp-cpp: a GPU communicator's counters, the parts that are not obvious.
// defines: wire_bytes_per_element, GpuTimings
//
// What a rank sends: bf16/fp16 reductions travel as fp32 (the Communicator
// sums half floats in fp32), so their bytes on the wire are 4 per element,
// not 2. How long a collective took: its kernels run on the GPU after the
// call returned and wait() only orders streams, so host time around either
// says nothing; ProcessGroupNCCL's start and end events do, once the
// collective completed (Work::getDuration). GpuTimings keeps the issued
// works and hands each completed one's duration over exactly once.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <deque>
#include <mutex>
#include <vector>

#include "fsdp/comm.h"

namespace fsdp::comm {

// Bytes per element a collective of `dtype` puts on the wire (a reduction of
// a half float is summed, and sent, in fp32).
inline int64_t wire_bytes_per_element(c10::ScalarType dtype, CollectiveKind kind) {
  const bool reduces = kind == CollectiveKind::REDUCE_SCATTER || kind == CollectiveKind::ALL_REDUCE;
  if (reduces && (dtype == c10::kBFloat16 || dtype == c10::kHalf)) return 4;
  return static_cast<int64_t>(c10::elementSize(dtype));
}

class GpuTimings {
 public:
  void issued(c10::intrusive_ptr<c10d::Work> work, CollectiveKind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({std::move(work), kind});
  }

  // Calls add(kind, seconds) once for every collective that completed since
  // the last call, in issue order; stops at the first one still running (a
  // communicator's collectives complete in the order they were issued). A
  // collective without a duration (it failed; its error reaches wait()) is
  // dropped uncounted.
  template <class Add>
  void harvest(Add&& add) {
    std::vector<Entry> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!pending_.empty() && pending_.front().work->isCompleted()) {
        done.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
    }
    for (auto& e : done) {
      double ms = 0;
      try {
        ms = e.work->getDuration();
      } catch (const std::exception&) {
        continue;
      }
      add(e.kind, ms / 1000.0);
    }
  }

 private:
  struct Entry {
    c10::intrusive_ptr<c10d::Work> work;
    CollectiveKind kind;
  };
  std::mutex mu_;
  std::deque<Entry> pending_;  // guarded by mu_: issued, not yet harvested
};

}  // namespace fsdp::comm
