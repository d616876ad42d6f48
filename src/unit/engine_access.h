// fsdp-cpp: what the state-dict code reads of a wrapped model's engine.
// defines: EngineAccess, gather_flat
//
// The public API (include/fsdp/fully_shard.h) hands out no engine internals.
// Saving and loading shards (src/state/state_dict.cpp, and through it the
// checkpoint layer and the tools) needs more than it: each unit's layout
// (which [lo, hi) of which parameter this rank holds, the master shard) and a
// gather of a unit's flat buffer. This is that interface, and all of it:
// read-only (const units and slots), except finish_pending_reductions(),
// which writes: it completes the reductions in flight into the shard
// gradients, the three that keep the model's background checkpoint, and
// use_memory_source (tests). (Replica groups reach the engine through
// unit/across.h alone.)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint.h"
#include "unit/across.h"
#include "unit/memory_source.h"
#include "unit/unit.h"

namespace fsdp::detail {

class EngineAccess {
 public:
  explicit EngineAccess(const FullyShardedModel& m);  // m outlives this

  // Units in pre-order, the root first; their layout and shards, read-only.
  std::vector<const Unit*> units() const;
  // Distinct parameter slots in the unwrapped model's named_parameters()
  // order (a tied parameter once, under its canonical name).
  std::vector<const ParamSlot*> slots() const;
  // Writes: blocks until every reduction in flight landed in the shard
  // gradients (Engine::wait_pending), so what is read next is final.
  void finish_pending_reductions() const;

  // Writes: the model's background saves (CheckpointOptions::async).
  // The communicator they run over: split from the model's at the first
  // call, which is then collective.
  CommPtr checkpoint_comm() const;
  // Hands over the model's background save (null when none); the engine
  // forgets it, so the caller waits for it.
  std::unique_ptr<ckpt::BackgroundSave> take_background_save() const;
  // The engine keeps `s` until it is taken or the engine is destroyed
  // (which waits for it). None may be kept already.
  void keep_background_save(std::unique_ptr<ckpt::BackgroundSave> s) const;
  // Blocks until the kept background save's snapshot is copied (at once when
  // none is kept): Engine::wait_for_snapshot.
  void wait_for_snapshot() const;

  // Writes: unit/across.h's stage (average_across there).
  void average_across(AcrossFn f) const;

  // Writes: the allocator the ledger measures from now on (memory_source.h);
  // a test plays a device's allocator with it.
  void use_memory_source(std::unique_ptr<MemorySource> source) const;

 private:
  Engine* const engine_;
};

// Unit u's flat buffer [padded] assembled from every rank's `shard_flat`
// [shard_numel] (the master shard, or optimizer state laid out like it), on
// `to_rank` only (every rank when to_rank < 0); undefined elsewhere. NO_SHARD:
// shard_flat is already the whole. Collective.
torch::Tensor gather_flat(const Unit& u, const torch::Tensor& shard_flat, int to_rank, const std::string& what);

}  // namespace fsdp::detail
