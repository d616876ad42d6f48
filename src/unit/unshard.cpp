// fsdp-cpp: all-gather — unshard a unit before it computes, reshard after;
// the prefetch policy that unshards the next unit early.
//
// Lifetimes: `full`'s storage is allocated right before the all-gather writes
// into it and freed in reshard(); tensors that autograd saved during forward
// (e.g. weight.t()) share that StorageImpl, so they see the re-gathered bytes
// in backward. Never free while an all-gather into `full` is in flight.
#include "compat/torch_compat.h"
#include "unit/engine.h"

namespace fsdp::detail {

const char* to_string(UnitState s) {
  switch (s) {
    case UnitState::SHARDED: return "SHARDED";
    case UnitState::UNSHARDING: return "UNSHARDING";
    case UnitState::UNSHARDED: return "UNSHARDED";
  }
  return "?";
}

const char* to_string(TrainingState s) {
  switch (s) {
    case TrainingState::IDLE: return "IDLE";
    case TrainingState::FORWARD: return "FORWARD";
    case TrainingState::FORWARD_DONE: return "FORWARD_DONE";
    case TrainingState::BACKWARD: return "BACKWARD";
    case TrainingState::BACKWARD_DONE: return "BACKWARD_DONE";
  }
  return "?";
}

void Unit::illegal(const char* file, int line, const char* transition, const std::string& was,
                   const std::string& expected) const {
  internal_error(file, line,
                 cat("unit '", display_name(), "': ", transition, " in state ", was, ", expected ", expected));
}

void Unit::expect(const char* file, int line, const char* transition, std::initializer_list<TrainingState> ok) const {
  std::string expected;
  for (TrainingState s : ok) {
    if (s == training_) return;
    expected += (expected.empty() ? "" : " or ") + std::string(to_string(s));
  }
  illegal(file, line, transition, to_string(training_), expected);
}

void Unit::unshard(bool prefetch) {
  if (keeps_unsharded) {
    if (state_ != UnitState::UNSHARDED) illegal(__FILE__, __LINE__, "unshard (NO_SHARD)", to_string(state_), "UNSHARDED");
    return;
  }
  if (empty() || state_ != UnitState::SHARDED) return;
  if (gather_work_) illegal(__FILE__, __LINE__, "unshard", "SHARDED with an all-gather in flight", "none in flight");
  torch::NoGradGuard ng;
  // On a GPU: on the all-gather stream, after what compute queued (the
  // optimizer's last write to the shard); `full` is allocated there.
  owner->streams.on_all_gather([&] {
    {
      AllocPurpose purpose("all-gather output (unsharded parameters)", *this);
      compat::alloc_storage(full, padded_numel * c10::elementSize(param_dtype));
    }
    // The input must stay alive until the gather completes.
    gather_input_ = param_dtype == torch::kFloat32 ? shard : shard.to(param_dtype);
    gather_work_ = comm->all_gather(gather_input_, full, {display_name()});
  });
  state_ = UnitState::UNSHARDING;
  if (prefetch) prefetched_ = true;
}

void Unit::wait_for_unshard() {
  if (state_ != UnitState::UNSHARDING) return;
  if (!gather_work_) illegal(__FILE__, __LINE__, "wait_for_unshard", "UNSHARDING without an all-gather", "one in flight");
  if (!gather_work_->is_completed()) {
    trace::Span span("wait", "comm");
    if (span.active()) span.arg("unit", name).arg("for", "all_gather");
    gather_work_->wait();
  }
  gather_work_->wait();  // rethrows its error, if any
  // GPU: compute reads `full` only after the gather stream's work, and the
  // allocator holds `full`'s block until compute's use of it is done.
  owner->streams.compute_waits_for_all_gather();
  owner->streams.keep_until_done(full);
  gather_work_.reset();
  gather_input_ = torch::Tensor();
  state_ = UnitState::UNSHARDED;
}

void Unit::reshard() {
  if (empty() || keeps_unsharded || state_ == UnitState::SHARDED) return;
  // A recomputed module is recomputing on these parameters and its
  // backward needs them next (recompute.cpp).
  if (recompute_depth_ > 0) illegal(__FILE__, __LINE__, "reshard", "UNSHARDED, recomputing", "not recomputing");
  wait_for_unshard();  // the comm thread may still be writing into `full`
  compat::free_storage(full);
  state_ = UnitState::SHARDED;
  prefetched_ = false;
}

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
