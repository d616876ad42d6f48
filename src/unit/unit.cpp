// fsdp-cpp: Unit — every checked transition of one unit's two state machines.
//
// defines: to_string(UnitState), to_string(TrainingState), and Unit's
//          transitions: unshard, wait_for_unshard, reshard (the all-gather);
//          pre_forward, post_forward, forward_failed, forget_forward,
//          pre_backward (the compute around it); grad_ready, join_backward,
//          post_backward, reduce, accept_reduced, end_backward (the
//          reduce-scatter); begin_recompute, end_recompute (activation
//          recomputation)
//
// Each transition checks the state it starts from (an illegal one is an
// internal error naming the unit, the state and the states expected, never
// a silent return) and says which calls are idempotent (unit.h). What spans
// units, the engine's side, calls these from its entry points: the prefetch
// (prefetch.cpp), the hooks around fsdp::call (unit_call.cpp), the pending
// reductions (grad_reduce.cpp), the recompute's autograd node
// (recompute.cpp). The layout and the tensors' first values are layout.cpp's.
//
// Lifetimes:
//   `full`'s storage is allocated right before the all-gather writes into it
//   and freed in reshard(); tensors that autograd saved during forward (e.g.
//   weight.t()) share that StorageImpl, so they see the re-gathered bytes in
//   backward. Never free while an all-gather into `full` is in flight.
//   During a unit's backward autograd allocates each parameter's gradient as
//   it computes it (.grad starts undefined), so the unit's gradients grow to
//   P_block only by the end of its backward, when its activations are
//   already released. post_backward copies them into one flat buffer in the
//   reduce dtype and drops them; the communication thread holds that buffer
//   (the reduce input) until the transfer completed and then frees it. Under
//   no_sync they are collected into `full_grad` (param dtype) and .grad points
//   into it, so later backwards accumulate in place.
//   Host-shared units reducing in the parameter dtype (grads_in_peer_memory)
//   skip the copy: pre_backward takes `full_grad` as a zeroed block of this
//   rank's peer memory (Communicator::peer_tensor) and points every .grad
//   into it, autograd adds each gradient there in place (AccumulateGrad with
//   a .grad defined), and post_backward hands that block to the reduce,
//   which its peers read where it lies. The block is held from the unit's
//   pre_backward until its reduce completed (the communicator drops it, and
//   it goes back to the pool), about what the private gradients held before.
#include <algorithm>
#include <vector>

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

// --- All-gather: the parameters come and go ---

void Unit::unshard(bool prefetch) {
  if (keeps_unsharded) {
    if (state_ != UnitState::UNSHARDED) illegal(__FILE__, __LINE__, "unshard (NO_SHARD)", to_string(state_), "UNSHARDED");
    return;
  }
  if (empty() || state_ != UnitState::SHARDED) return;
  if (gather_work_) illegal(__FILE__, __LINE__, "unshard", "SHARDED with an all-gather in flight", "none in flight");
  torch::NoGradGuard ng;
  if (host_shared) {
    // `full` is resident (one copy per host): this rank writes its slice
    // (fp32: the shard is that slice already) and the all-gather is the
    // barrier after which every rank's slice is there.
    gather_input_ = full.narrow(0, shard_begin, shard_numel);
    if (param_dtype != torch::kFloat32) gather_input_.copy_(shard);
    gather_work_ = comm->all_gather(gather_input_, full, {display_name()});
    state_ = UnitState::UNSHARDING;
    if (prefetch) prefetched_ = true;
    return;
  }
  // On a GPU: on the all-gather stream, after what compute queued (the
  // optimizer's last write to the shard); `full` is allocated there.
  owner->streams.on_all_gather([&] {
    {
      AllocPurpose purpose("all-gather output (unsharded parameters)", *this);
      compat::alloc_storage(full, padded_numel * c10::elementSize(param_dtype));
    }
    // The input must stay alive until the gather completes.
    gather_input_ = param_dtype == torch::kFloat32 ? shard : shard.to(param_dtype);
    // Compressible: only this compute copy may cross hosts quantized; the
    // shard itself is never written (the host-shared form above is never
    // compressed: its fp32 slice is the shard).
    gather_work_ = comm->all_gather(gather_input_, full, {display_name(), /*compressible=*/true});
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
  // Host-shared: the memory stays (one copy per host); SHARDED says the
  // next use must gather again, after the optimizer changed the shards.
  if (!host_shared) compat::free_storage(full);
  state_ = UnitState::SHARDED;
  prefetched_ = false;
}

// --- Compute: around the unit's forward, and back for its backward ---

void Unit::pre_forward() {
  expect(__FILE__, __LINE__, "pre_forward", {TrainingState::IDLE, TrainingState::FORWARD_DONE});
  if (keeps_unsharded && !full_is_shard && training_ == TrainingState::IDLE) {
    // NO_SHARD with mixed precision: refresh the low-precision copy from the
    // fp32 master the optimizer updated.
    torch::NoGradGuard ng;
    full.copy_(shard);
  }
  unshard();
  wait_for_unshard();
  training_ = TrainingState::FORWARD;
}

void Unit::post_forward(bool will_backward, bool in_recompute) {
  expect(__FILE__, __LINE__, "post_forward", {TrainingState::FORWARD});
  // In a recompute the backward of this forward comes next: resharding now
  // would cost its pre_backward a second all-gather.
  // Host-shared units reshard too (their memory stays; SHARDED only says
  // the backward gathers again): the same collectives as every other path,
  // so traffic, plans and traces read alike, for one barrier per unit.
  if (!(will_backward && in_recompute) && (reshard_after_forward || !will_backward)) reshard();
  training_ = will_backward ? TrainingState::FORWARD_DONE : TrainingState::IDLE;
}

void Unit::forward_failed() {
  training_ = TrainingState::IDLE;
  if (!keeps_unsharded) reshard();
}

void Unit::forget_forward() {
  if (training_ == TrainingState::FORWARD_DONE) training_ = TrainingState::IDLE;
}

bool Unit::pre_backward(const std::function<void()>& after_unshard) {
  if (training_ == TrainingState::BACKWARD || training_ == TrainingState::BACKWARD_DONE) return false;
  expect(__FILE__, __LINE__, "pre_backward", {TrainingState::IDLE, TrainingState::FORWARD_DONE});
  if (trace::enabled()) backward_span_ = std::make_unique<trace::Span>("backward", "backward", nlohmann::json{{"unit", name}});
  unshard();
  wait_for_unshard();
  after_unshard();
  // Gradients accumulated under no_sync stay where they are and .grad keeps
  // pointing into them; with grads_in_peer_memory the buffer backward writes
  // is taken here, in peer memory; otherwise nothing is allocated here.
  if (n_grad_params > 0 && (full_grad.defined() || grads_in_peer_memory)) collect_into_full_grad();
  grads_ready_ = 0;
  training_ = TrainingState::BACKWARD;
  return true;
}

// --- Reduce-scatter: the gradients leave as 1/N shards ---

// Folds every parameter's .grad into full_grad (allocated zeroed, in the
// param dtype, when missing; grads_in_peer_memory: in this rank's peer
// memory, where the reduce reads it) and points .grad at its slice:
// accumulation across no_sync backwards, and autograd's writes, then happen
// in place.
void Unit::collect_into_full_grad() {
  torch::NoGradGuard ng;
  if (!full_grad.defined()) {
    AllocPurpose purpose("unsharded gradients", *this);
    // A pooled block holds the last step's values: zeroed here, once.
    full_grad = grads_in_peer_memory ? comm->peer_tensor(padded_numel, param_dtype).zero_()
                                     : torch::zeros({padded_numel}, torch::TensorOptions(param_dtype).device(device));
  }
  for (auto& s : params_) {
    if (!s.requires_grad) continue;
    auto g = s.param.grad();
    if (g.defined() && g.data_ptr() == static_cast<char*>(full_grad.data_ptr()) +
                                           s.offset * full_grad.element_size())
      continue;  // still pointing into the buffer (no_sync accumulation)
    if (g.defined()) full_grad.narrow(0, s.offset, s.numel).add_(g.reshape(-1));
    s.param.mutable_grad() = storage_slice(full_grad, s.offset, s.shape);
  }
}

// The reduce input: the unit's gradients as one flat [padded] buffer in the
// reduce dtype, zeros where no gradient landed (padding included). The
// parameters' .grad are dropped.
torch::Tensor Unit::flat_grads_for_reduce() {
  torch::NoGradGuard ng;
  torch::Tensor flat;
  if (full_grad.defined()) {
    // Gradients accumulated in the buffer (under no_sync, or written in
    // peer memory), plus any that bypassed it.
    collect_into_full_grad();
    if (grads_in_peer_memory) {
      // Already where the peers read it: the reduce input as backward wrote it.
      flat = full_grad;
    } else if (host_shared) {
      // Where the peers read it (unit.h); copy_ casts on the way, once.
      flat = comm->peer_tensor(padded_numel, reduce_dtype);
      flat.copy_(full_grad);
    } else {
      flat = full_grad.scalar_type() == reduce_dtype ? full_grad : full_grad.to(reduce_dtype);
    }
  } else {
    // Written once: every landed gradient is copied in, and only what no
    // gradient covers (padding, gaps, parameters without one) is zeroed, so
    // the buffer (P_block, reused from the allocator's cache) is not first
    // cleared in full and then overwritten.
    AllocPurpose purpose("unsharded gradients", *this);
    // Host-shared: in memory the peers map, where the reduce sums it.
    flat = host_shared ? comm->peer_tensor(padded_numel, reduce_dtype)
                       : torch::empty({padded_numel}, torch::TensorOptions(reduce_dtype).device(device));
    std::vector<const ParamSlot*> by_offset;
    by_offset.reserve(params_.size());
    for (auto& s : params_) by_offset.push_back(&s);
    std::stable_sort(by_offset.begin(), by_offset.end(),
                     [](const ParamSlot* a, const ParamSlot* b) { return a->offset < b->offset; });
    int64_t covered = 0;  // [0, covered) is written
    for (const ParamSlot* s : by_offset) {
      if (s->offset > covered) flat.narrow(0, covered, s->offset - covered).zero_();
      const int64_t begin = std::max(covered, s->offset), end = s->offset + s->numel;
      if (end <= begin) continue;
      const torch::Tensor g = s->requires_grad ? s->param.grad() : torch::Tensor();
      if (g.defined())
        flat.narrow(0, begin, end - begin).copy_(g.reshape(-1).narrow(0, begin - s->offset, end - begin));
      else
        flat.narrow(0, begin, end - begin).zero_();
      covered = end;
    }
    if (covered < padded_numel) flat.narrow(0, covered, padded_numel - covered).zero_();
  }
  for (auto& s : params_)
    if (s.requires_grad) s.param.mutable_grad().reset();
  full_grad = torch::Tensor();  // the reduce holds the flat buffer until it completes
  return flat;
}

bool Unit::grad_ready() {
  if (training_ != TrainingState::BACKWARD) {
    if (training_ == TrainingState::FORWARD_DONE || training_ == TrainingState::IDLE)
      training_ = TrainingState::BACKWARD;
    return false;
  }
  return ++grads_ready_ == n_grad_params;
}

void Unit::join_backward() {
  expect(__FILE__, __LINE__, "join_backward", {TrainingState::FORWARD_DONE});
  // Zeros: nothing reached this unit's parameters (no_sync keeps collecting).
  if (n_grad_params > 0 && full_grad.defined()) collect_into_full_grad();
  training_ = TrainingState::BACKWARD;
}

torch::Tensor Unit::post_backward(bool no_sync) {
  expect(__FILE__, __LINE__, "post_backward", {TrainingState::BACKWARD});
  training_ = TrainingState::BACKWARD_DONE;
  if (backward_span_) {
    backward_span_->end();
    backward_span_.reset();
  }
  // Parameters first: their bytes go before the gradient buffer arrives.
  if (!keeps_unsharded) reshard();
  if (n_grad_params == 0) return {};
  if (no_sync) {
    // Gradients stay unsharded in full_grad; .grad keeps pointing there.
    collect_into_full_grad();
    return {};
  }
  return flat_grads_for_reduce();
}

PendingReduce Unit::reduce(torch::Tensor grads) {
  torch::NoGradGuard ng;
  // On the CPU the input is not kept here: the communicator holds it for
  // the transfer and drops it the moment the reduce-scatter completed, so
  // the unsharded gradients are freed then, not when the result is folded
  // in. On a GPU it is kept until wait_reduce (PendingReduce::input).
  PendingReduce p{this, nullptr, torch::Tensor(), nullptr, torch::Tensor(), nullptr};
  // On a GPU: on the reduce stream, after compute produced the gradients;
  // the output is allocated there (wait_reduce orders compute after it).
  owner->streams.on_reduce([&] {
    if (keeps_unsharded) {
      p.output = grads;
      // Compressible (NO_SHARD): the unit's name keys its residuals.
      p.work = comm->all_reduce(grads, ReduceOp::AVG, {display_name(), /*compressible=*/true});
    } else {
      p.output = torch::empty({shard_numel}, grads.options());
      // Compressible: the unit's name keys its gradients' error feedback.
      p.work = comm->reduce_scatter(grads, p.output, ReduceOp::AVG, {display_name(), /*compressible=*/true});
    }
  });
  if (owner->streams.active()) p.input = std::move(grads);
  grads = torch::Tensor();
  return p;
}

namespace {
// Whether the optimizer's gradients (each shard view's .grad) still point
// into shard_grad: zeroed in place, or accumulating over micro-steps.
bool grads_in_shard_grad(const Unit& u) {
  if (!u.shard_grad.defined()) return false;
  for (auto& s : u.params()) {
    if (!s.requires_grad) continue;
    const auto& g = s.shard_view.grad();
    if (!g.defined() || g.storage().unsafeGetStorageImpl() != u.shard_grad.storage().unsafeGetStorageImpl())
      return false;
  }
  return true;
}
}  // namespace

void Unit::accept_reduced(const torch::Tensor& output) {
  torch::NoGradGuard ng;
  torch::Tensor g = output.scalar_type() == torch::kFloat32 ? output : output.to(torch::kFloat32);
  if (grads_in_shard_grad(*this)) {
    // The optimizer's grads still point into shard_grad: add.
    shard_grad.add_(g);
  } else {
    // First gradient since the optimizer reset them (zero_grad with
    // set_to_none, or none yet): adopt the reduced buffer.
    shard_grad = g;
    for (auto& s : params_) {
      if (!s.requires_grad) continue;
      const int64_t off = s.hi > s.lo ? s.offset + s.lo - shard_begin : 0;
      s.shard_view.mutable_grad() = storage_slice(shard_grad, off, {s.hi - s.lo});
    }
  }
}

void Unit::end_backward() {
  expect(__FILE__, __LINE__, "end_backward", {TrainingState::IDLE, TrainingState::BACKWARD_DONE});
  if (!keeps_unsharded) reshard();
  training_ = TrainingState::IDLE;
}

// --- Activation recomputation: the unit stays gathered while it recomputes ---

void Unit::begin_recompute() {
  expect(__FILE__, __LINE__, "begin_recompute", {TrainingState::BACKWARD});
  if (!empty() && state_ != UnitState::UNSHARDED)
    illegal(__FILE__, __LINE__, "begin_recompute", to_string(state_),
            "UNSHARDED (the recompute computes on pre_backward's all-gather)");
  ++recompute_depth_;
}

void Unit::end_recompute() {
  if (recompute_depth_ <= 0) illegal(__FILE__, __LINE__, "end_recompute", "not recomputing", "recomputing");
  --recompute_depth_;
}

}  // namespace fsdp::detail
