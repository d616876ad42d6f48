// fsdp-cpp: FullyShardedModel — the public face of the engine: its shards
// for the optimizer, no_sync, the unit table, the full state dict.
//
// defines: FullyShardedModel's constructor, parameters, named_shards,
//          NoSyncGuard, wait_pending, units, describe_units, full_state and
//          accessors (the rest of its methods: clip_grad_norm in
//          src/optim/clip.cpp, ledger in ledger.cpp, recomputed in
//          recompute.cpp)
#include <iomanip>
#include <sstream>
#include <unordered_set>

#include "fsdp/memory.h"
#include "unit/engine.h"
#include "unit/engine_access.h"

namespace fsdp {

using detail::Engine;
using detail::Unit;

FullyShardedModel::FullyShardedModel(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FsdpOptions opts)
    : engine_(std::make_unique<Engine>(std::move(root), std::move(comm), std::move(opts))) {}

FullyShardedModel::~FullyShardedModel() = default;

std::vector<torch::Tensor> FullyShardedModel::parameters() const {
  std::vector<torch::Tensor> out;
  std::unordered_set<const detail::ParamSlot*> seen;
  for (auto& [name, slot] : engine_->named_slots)
    if (seen.insert(slot).second) out.push_back(slot->shard_view);
  return out;
}

std::vector<NamedShard> FullyShardedModel::named_shards() const {
  std::vector<NamedShard> out;
  std::unordered_set<const detail::ParamSlot*> seen;
  for (auto& [name, slot] : engine_->named_slots) {
    if (!seen.insert(slot).second) continue;
    int unit = 0;
    for (auto& u : engine_->units)
      if (&u->params().front() <= slot && slot <= &u->params().back()) unit = u->index;
    out.push_back({slot->name, slot->shape, slot->lo, slot->hi, unit, slot->shard_view});
  }
  return out;
}

FullyShardedModel::NoSyncGuard::NoSyncGuard(FullyShardedModel* m) : m_(m), prev_(m->engine_->no_sync) {
  m_->engine_->no_sync = true;
}
FullyShardedModel::NoSyncGuard::~NoSyncGuard() {
  if (m_) m_->engine_->no_sync = prev_;
}

void FullyShardedModel::wait_pending() { engine_->wait_pending(); }

std::vector<UnitInfo> FullyShardedModel::units() const {
  std::vector<UnitInfo> out;
  for (auto& u : engine_->units) {
    UnitInfo i;
    i.index = u->index;
    i.name = u->name;
    for (auto& s : u->params()) i.param_names.push_back(s.name);
    i.numel = u->numel;
    i.padded_numel = u->padded_numel;
    i.shard_numel = u->shard_numel;
    i.unsharded_bytes = u->padded_numel * static_cast<int64_t>(c10::elementSize(u->param_dtype));
    i.shard_bytes = u->shard_numel * 4;
    out.push_back(std::move(i));
  }
  return out;
}

std::string FullyShardedModel::describe_units() const {
  std::ostringstream os;
  os << "FSDP units (" << to_string(engine_->opts.strategy) << ", world " << engine_->world()
     << ", wrap: " << engine_->opts.wrap.description << ")\n";
  os << std::left << std::setw(4) << "#" << std::setw(22) << "unit" << std::right << std::setw(12)
     << "params" << std::setw(12) << "padded" << std::setw(12) << "shard" << std::setw(14) << "unsharded"
     << "\n";
  for (auto& i : units())
    os << std::left << std::setw(4) << i.index << std::setw(22) << (i.name.empty() ? "<root>" : i.name)
       << std::right << std::setw(12) << i.numel << std::setw(12) << i.padded_numel << std::setw(12)
       << i.shard_numel << std::setw(14) << memory::format_bytes(i.unsharded_bytes) << "\n";
  return os.str();
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedModel::full_state(int to_rank) const {
  engine_->wait_pending();
  torch::NoGradGuard ng;
  const int r = engine_->rank();
  const bool keep = to_rank < 0 || r == to_rank;
  std::unordered_map<const detail::ParamSlot*, torch::Tensor> values;
  for (auto& u : engine_->units) {
    if (u->empty()) continue;
    torch::Tensor full = detail::gather_flat(*u, u->shard, to_rank, "full_state");
    if (keep)
      for (auto& s : u->params()) values[&s] = full.narrow(0, s.offset, s.numel).view(s.shape).clone();
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (!keep) return out;
  for (auto& [name, slot] : engine_->named_slots) out.emplace_back(name, values.at(slot));
  for (auto& b : engine_->root->named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value().clone());
  return out;
}

const FsdpOptions& FullyShardedModel::options() const { return engine_->opts; }
const CommPtr& FullyShardedModel::comm() const { return engine_->comm; }
const CommPtr& FullyShardedModel::shard_group() const { return engine_->shard_comm; }
const CommPtr& FullyShardedModel::replica_group() const { return engine_->replica_comm; }
torch::nn::Module& FullyShardedModel::module() const { return *engine_->root; }

}  // namespace fsdp
