// fsdp-cpp: all-gather — unshard a unit before it computes, reshard after.
//
// Lifetimes: `full`'s storage is allocated right before the all-gather writes
// into it and freed in reshard(); tensors that autograd saved during forward
// (e.g. weight.t()) share that StorageImpl, so they see the re-gathered bytes
// in backward. Never free while an all-gather into `full` is in flight.
#include "compat/torch_compat.h"
#include "unit/sharded_state.h"

namespace fsdp::detail {


void ShardedState::unshard_async(Unit& u) {
  if (u.empty() || u.keeps_unsharded || u.state != UnitState::SHARDED) return;
  torch::NoGradGuard ng;
  {
    AllocPurpose purpose("all-gather output (unsharded parameters)", u);
    compat::alloc_storage(u.full, u.padded_numel * c10::elementSize(u.param_dtype));
  }
  // The input must stay alive until the gather completes.
  u.gather_input = u.param_dtype == torch::kFloat32 ? u.shard : u.shard.to(u.param_dtype);
  u.gather_work = comm->all_gather(u.gather_input, u.full, {u.display_name()});
  u.state = UnitState::UNSHARDING;
}

void ShardedState::wait_unsharded(Unit& u) {
  if (u.state != UnitState::UNSHARDING) return;
  if (!u.gather_work->is_completed()) {
    trace::Span span("wait", "comm");
    if (span.active()) span.arg("unit", u.name).arg("for", "all_gather");
    u.gather_work->wait();
  }
  u.gather_work->wait();
  u.gather_work.reset();
  u.gather_input = torch::Tensor();
  u.state = UnitState::UNSHARDED;
}

void ShardedState::unshard(Unit& u) {
  unshard_async(u);
  wait_unsharded(u);
}

void ShardedState::reshard(Unit& u) {
  if (u.empty() || u.keeps_unsharded || u.state == UnitState::SHARDED) return;
  wait_unsharded(u);  // the comm thread may still be writing into `full`
  compat::free_storage(u.full);
  u.state = UnitState::SHARDED;
  u.prefetched = false;
}

int ShardedState::unsharded_prefetch_count() const {
  int n = 0;
  for (auto& u : units)
    if (u->index != 0 && !u->keeps_unsharded && u->state != UnitState::SHARDED) ++n;
  return n;
}

// Issue the all-gather of the unit that computes next (forward: the next one
// in the recorded forward order; backward: the previous one), bounded by
// limit_all_gathers so the peak stays P/N + limit * P_block + A.
void ShardedState::prefetch_after(Unit& u, bool backward) {
  if (!forward_order_final) return;
  auto it = std::find(forward_order.begin(), forward_order.end(), &u);
  if (it == forward_order.end()) return;
  Unit* next = nullptr;
  if (backward) {
    if (it == forward_order.begin()) return;
    next = *(it - 1);
  } else {
    if (it + 1 == forward_order.end()) return;
    next = *(it + 1);
  }
  if (next->index == 0 || next->state != UnitState::SHARDED || next->empty()) return;
  if (backward && next->training != TrainingState::FORWARD_DONE) return;  // no backward coming
  if (unsharded_prefetch_count() >= opts.limit_all_gathers) return;
  unshard_async(*next);
  next->prefetched = true;
}

}  // namespace fsdp::detail
