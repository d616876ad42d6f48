// fsdp-cpp: prefetch — the engine unshards the unit that computes next
// while the current one computes.
//
// defines: Engine::unsharded_prefetch_count, Engine::prefetch_after
//
// The order is the forward order recorded in the first forward: forward
// prefetch gathers the next unit, backward prefetch (BACKWARD_PRE before the
// current unit's gradients are computed, BACKWARD_POST after) the previous
// one. limit_all_gathers bounds the units unsharded at once besides the root,
// so the peak stays P/N + limit * P_block + A. The all-gather itself is the
// unit's checked transition (Unit::unshard, unit.cpp).
#include <algorithm>

#include "unit/engine.h"

namespace fsdp::detail {

int Engine::unsharded_prefetch_count() const {
  int n = 0;
  for (auto& u : units)
    if (u->index != 0 && !u->keeps_unsharded && u->state() != UnitState::SHARDED) ++n;
  return n;
}

// Issue the all-gather of the unit that computes next (forward: the next one
// in the recorded forward order; backward: the previous one), bounded by
// limit_all_gathers so the peak stays P/N + limit * P_block + A.
void Engine::prefetch_after(Unit& u, bool backward) {
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
  if (next->index == 0 || next->state() != UnitState::SHARDED || next->empty()) return;
  if (backward && next->training() != TrainingState::FORWARD_DONE) return;  // no backward coming
  if (unsharded_prefetch_count() >= opts.limit_all_gathers) return;
  next->unshard(/*prefetch=*/true);
}

}  // namespace fsdp::detail
