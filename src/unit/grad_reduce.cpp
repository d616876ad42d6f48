// fsdp-cpp: reduce — gradients leave the unit as 1/N shards.
//
// During a unit's backward autograd allocates each parameter's gradient as
// it computes it (.grad starts undefined), so the unit's gradients grow to
// P_block only by the end of its backward, when its activations are already
// released; no zeroed buffer waits from the start, and no weight gradient is
// computed into a temporary and then added into a buffer. When the last
// gradient of a unit has landed (a post-hook on every parameter's
// AccumulateGrad node; the end-of-backward callback covers units whose
// parameters got no gradient), the unit is resharded, its gradients are
// copied into one flat buffer in the reduce dtype (`full_grad` layout) and
// freed, and the buffer is reduce-scattered (AVG over ranks) into the shard
// gradient; NO_SHARD all-reduces it instead.
//
// Lifetimes: the reduce runs on the communication thread, which holds its
// input buffer until the transfer completed and then frees it; the output
// is added into `shard_grad` when the engine next looks (every unit's pre-
// and post-backward fold the finished ones in; one stays in flight, an
// older one is waited for, so held buffers do not grow with the number of
// units; the rest at the end of backward, clip, ledger). Inside no_sync() the
// gradients are collected into `full_grad` (param dtype) and .grad points
// into it, so later backwards accumulate in place; the first backward
// outside no_sync reduces the sum.
#include <algorithm>
#include <vector>

#include "compat/torch_compat.h"
#include "unit/engine.h"

namespace fsdp::detail {

// Folds every parameter's .grad into full_grad (allocated zeroed, in the
// param dtype, when missing) and points .grad at its slice: accumulation
// across no_sync backwards then happens in place.
void Unit::collect_into_full_grad() {
  torch::NoGradGuard ng;
  if (!full_grad.defined()) {
    AllocPurpose purpose("unsharded gradients", *this);
    full_grad = torch::zeros({padded_numel}, torch::TensorOptions(param_dtype).device(device));
  }
  for (auto& s : params_) {
    if (!s.requires_grad) continue;
    auto g = s.param.grad();
    if (g.defined() && g.data_ptr() == static_cast<char*>(full_grad.data_ptr()) +
                                           s.offset * full_grad.element_size())
      continue;  // still pointing into the buffer (no_sync accumulation)
    if (g.defined()) full_grad.narrow(0, s.offset, s.numel).add_(g.reshape(-1));
    s.param.mutable_grad() = alias(full_grad, s.offset, s.shape);
  }
}

// The reduce input: the unit's gradients as one flat [padded] buffer in the
// reduce dtype, zeros where no gradient landed (padding included). The
// parameters' .grad are dropped.
torch::Tensor Unit::flat_grads_for_reduce() {
  torch::NoGradGuard ng;
  torch::Tensor flat;
  if (full_grad.defined()) {
    // Gradients accumulated under no_sync (plus any that bypassed the buffer).
    collect_into_full_grad();
    flat = full_grad.scalar_type() == reduce_dtype ? full_grad : full_grad.to(reduce_dtype);
  } else {
    // Written once: every landed gradient is copied in, and only what no
    // gradient covers (padding, gaps, parameters without one) is zeroed, so
    // the buffer (P_block, reused from the allocator's cache) is not first
    // cleared in full and then overwritten.
    AllocPurpose purpose("unsharded gradients", *this);
    flat = torch::empty({padded_numel}, torch::TensorOptions(reduce_dtype).device(device));
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
  PendingReduce p{this, nullptr, torch::Tensor(), nullptr, torch::Tensor()};
  // On a GPU: on the reduce stream, after compute produced the gradients;
  // the output is allocated there (wait_reduce orders compute after it).
  owner->streams.on_reduce([&] {
    if (keeps_unsharded) {
      p.output = grads;
      p.work = comm->all_reduce(grads, ReduceOp::AVG, {display_name()});
    } else {
      p.output = torch::empty({shard_numel}, grads.options());
      p.work = comm->reduce_scatter(grads, p.output, ReduceOp::AVG, {display_name()});
    }
  });
  if (owner->streams.active()) p.input = std::move(grads);
  grads = torch::Tensor();
  return p;
}

namespace {
bool views_alias(const Unit& u) {
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
  if (views_alias(*this)) {
    // The optimizer's grads still alias shard_grad (zeroed in place or
    // accumulating over micro-steps): add.
    shard_grad.add_(g);
  } else {
    // First gradient since the optimizer reset them (zero_grad with
    // set_to_none, or none yet): adopt the reduced buffer.
    shard_grad = g;
    for (auto& s : params_) {
      if (!s.requires_grad) continue;
      const int64_t off = s.hi > s.lo ? s.offset + s.lo - shard_begin : 0;
      s.shard_view.mutable_grad() = alias(shard_grad, off, {s.hi - s.lo});
    }
  }
}

void Unit::end_backward() {
  expect(__FILE__, __LINE__, "end_backward", {TrainingState::IDLE, TrainingState::BACKWARD_DONE});
  if (!keeps_unsharded) reshard();
  training_ = TrainingState::IDLE;
}

// --- The engine's side: pending reductions, no_sync, the callback ---

void Engine::on_grad_ready(Unit& u) {
  if (u.grad_ready()) post_backward(u);
}

void Engine::post_backward(Unit& u) {
  torch::Tensor in = u.post_backward(no_sync);
  if (u.n_grad_params == 0) return;
  if (opts.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch_after(u, /*backward=*/true);
  if (no_sync) return;
  pending.push_back(u.reduce(std::move(in)));
  if (!opts.async_reduce) {
    wait_pending();
  } else {
    // One reduction in flight: the one just issued runs while the next unit
    // computes; an older one still running (its input, P_block, is held
    // until it completes) is waited for now. Finished ones are folded in.
    // So async reduce adds at most one unit's gradients (P_block + its
    // output P_block/N) to the peak, whatever the number of units; the
    // comm thread runs collectives in issue order, so waiting for the older
    // one never delays the newer.
    size_t done = 0;
    while (done < pending.size() && (reduce_finished(pending[done]) || pending.size() - done > 1)) ++done;
    if (done > 0) finish_reduces(done);
  }
}

void Engine::wait_pending() { finish_reduces(pending.size()); }

void Engine::fold_finished_reduces() {
  size_t done = 0;
  while (done < pending.size() && reduce_finished(pending[done])) ++done;
  if (done > 0) finish_reduces(done);
}

// Waits for the first `count` pending reductions and adds them into the
// shard gradients.
void Engine::finish_reduces(size_t count) {
  for (size_t i = 0; i < count; ++i) {
    auto& p = pending[i];
    wait_reduce(p);
    p.unit->accept_reduced(p.output);
  }
  pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(count));
}

void Engine::end_of_backward() {
  callback_queued = false;
  // Units that ran forward with grad but whose gradients never completed
  // (unused parameters, outputs not in the loss) still reduce, so every rank
  // issues the same collectives in the same order.
  for (auto& up : units) {
    Unit& u = *up;
    if (u.training() == TrainingState::FORWARD_DONE) {
      fold_finished_reduces();
      u.join_backward();
    }
    if (u.training() == TrainingState::BACKWARD) post_backward(u);
  }
  wait_pending();
  for (auto& up : units) up->end_backward();
  wait_for_snapshot();  // the optimizer step comes next
}

void Engine::wait_for_snapshot() {
  if (background_save) background_save->wait_for_snapshot();
}

}  // namespace fsdp::detail
