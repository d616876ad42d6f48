// fsdp-cpp: EngineAccess — the state-dict code's one interface to a wrapped
// model's engine (see engine_access.h), gather_flat, and average_across
// (unit/across.h).
//
// defines: EngineAccess, gather_flat, average_across
#include "unit/engine_access.h"

#include <unordered_set>

#include "unit/engine.h"

namespace fsdp::detail {

EngineAccess::EngineAccess(const FullyShardedModel& m) : engine_(m.engine_.get()) {}
std::vector<const Unit*> EngineAccess::units() const {
  std::vector<const Unit*> out;
  out.reserve(engine_->units.size());
  for (auto& u : engine_->units) out.push_back(u.get());
  return out;
}
std::vector<const ParamSlot*> EngineAccess::slots() const {
  std::vector<const ParamSlot*> out;
  std::unordered_set<const ParamSlot*> seen;
  for (auto& [name, slot] : engine_->named_slots)
    if (seen.insert(slot).second) out.push_back(slot);
  return out;
}
void EngineAccess::finish_pending_reductions() const { engine_->wait_pending(); }

CommPtr EngineAccess::checkpoint_comm() const {
  if (!engine_->checkpoint_comm)
    engine_->checkpoint_comm = engine_->comm->split(0, {"checkpoint", std::chrono::milliseconds(0)});
  return engine_->checkpoint_comm;
}

std::unique_ptr<ckpt::BackgroundSave> EngineAccess::take_background_save() const {
  return std::move(engine_->background_save);
}

void EngineAccess::keep_background_save(std::unique_ptr<ckpt::BackgroundSave> s) const {
  FSDP_CHECK(!engine_->background_save, "a background save is kept already");
  engine_->snapshot_bytes = s->snapshot_bytes();
  engine_->background_save = std::move(s);
}

void EngineAccess::wait_for_snapshot() const { engine_->wait_for_snapshot(); }

void EngineAccess::average_across(AcrossFn f) const {
  FSDP_CHECK(engine_->pending.empty(), "average_across: reductions are in flight");
  engine_->across = std::move(f);
}

void average_across(FullyShardedModel& m, AcrossFn f) { EngineAccess(m).average_across(std::move(f)); }

void EngineAccess::use_memory_source(std::unique_ptr<MemorySource> source) const {
  FSDP_CHECK(source != nullptr, "use_memory_source: a null source");
  engine_->memory_source = std::move(source);
}

torch::Tensor gather_flat(const Unit& u, const torch::Tensor& shard_flat, int to_rank, const std::string& what) {
  const bool keep = to_rank < 0 || u.owner->rank() == to_rank;
  if (u.keeps_unsharded) return keep ? shard_flat : torch::Tensor();
  const CollectiveInfo info{what + " " + u.display_name()};
  // HYBRID: the unit's shards are those of this rank's shard group; only
  // the group holding `to_rank` gathers (each group's copy is whole).
  const int root = to_rank < 0 ? -1 : u.owner->shard_rank_of(to_rank);
  if (to_rank >= 0 && root < 0) return torch::Tensor();
  torch::Tensor full = keep ? torch::empty({u.padded_numel}, shard_flat.options()) : torch::Tensor();
  if (to_rank < 0) u.comm->all_gather(shard_flat, full, info)->wait();
  else u.comm->gather(shard_flat, full, root, info)->wait();
  return full;
}

}  // namespace fsdp::detail
