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
#include "compat/torch_compat.h"
#include "unit/sharded_state.h"

namespace fsdp::detail {

torch::Tensor alias(const torch::Tensor& base, int64_t offset, c10::IntArrayRef shape);


namespace {

// Folds every parameter's .grad into u.full_grad (allocated zeroed, in the
// param dtype, when missing) and points .grad at its slice: accumulation
// across no_sync backwards then happens in place.
void collect_into_full_grad(Unit& u) {
  torch::NoGradGuard ng;
  if (!u.full_grad.defined()) {
    AllocPurpose purpose("unsharded gradients", u);
    u.full_grad = torch::zeros({u.padded_numel}, u.param_dtype);
  }
  for (auto& s : u.params) {
    if (!s.requires_grad) continue;
    auto g = s.param.grad();
    if (g.defined() && g.data_ptr() == static_cast<char*>(u.full_grad.data_ptr()) +
                                           s.offset * u.full_grad.element_size())
      continue;  // still pointing into the buffer (no_sync accumulation)
    if (g.defined()) u.full_grad.narrow(0, s.offset, s.numel).add_(g.reshape(-1));
    s.param.mutable_grad() = alias(u.full_grad, s.offset, s.shape);
  }
}

// The reduce input: the unit's gradients as one flat [padded] buffer in the
// reduce dtype, zeros where no gradient landed (padding included). The
// parameters' .grad are dropped.
torch::Tensor flat_grads_for_reduce(Unit& u) {
  torch::NoGradGuard ng;
  torch::Tensor flat;
  if (u.full_grad.defined()) {
    // Gradients accumulated under no_sync (plus any that bypassed the buffer).
    collect_into_full_grad(u);
    flat = u.full_grad.scalar_type() == u.reduce_dtype ? u.full_grad : u.full_grad.to(u.reduce_dtype);
  } else {
    AllocPurpose purpose("unsharded gradients", u);
    flat = torch::zeros({u.padded_numel}, u.reduce_dtype);
    for (auto& s : u.params) {
      if (!s.requires_grad) continue;
      const auto& g = s.param.grad();
      if (g.defined()) flat.narrow(0, s.offset, s.numel).copy_(g.reshape(-1));
    }
  }
  for (auto& s : u.params)
    if (s.requires_grad) s.param.mutable_grad().reset();
  u.full_grad = torch::Tensor();  // the reduce holds the flat buffer until it completes
  return flat;
}

}  // namespace

// Pre-backward: reductions that finished meanwhile are folded in (their
// outputs join shard_grad now rather than at the end of backward);
// gradients accumulated under no_sync stay where they are and .grad keeps
// pointing into them; otherwise nothing is allocated here.
void ShardedState::prepare_grads(Unit& u) {
  size_t done = 0;
  while (done < pending.size() && pending[done].work->is_completed()) ++done;
  if (done > 0) finish_reduces(done);
  if (u.n_grad_params == 0 || !u.full_grad.defined()) return;
  collect_into_full_grad(u);
}

void ShardedState::on_grad_ready(Unit& u) {
  if (u.training != TrainingState::BACKWARD) {
    // A gradient arrived without this unit's pre-backward hook (its
    // parameters were used outside its outputs' graph): collect it at the
    // end of backward, where post_backward folds stray grads in.
    if (u.training == TrainingState::FORWARD_DONE || u.training == TrainingState::IDLE)
      u.training = TrainingState::BACKWARD;
    return;
  }
  if (++u.grads_ready == u.n_grad_params) post_backward(u);
}

void ShardedState::post_backward(Unit& u) {
  if (u.training == TrainingState::BACKWARD_DONE) return;
  u.training = TrainingState::BACKWARD_DONE;
  if (u.backward_span) {
    u.backward_span->end();
    u.backward_span.reset();
  }
  if (u.n_grad_params == 0) {
    if (!u.keeps_unsharded) reshard(u);
    return;
  }
  // Parameters first: their bytes go before the gradient buffer arrives.
  if (!u.keeps_unsharded) reshard(u);
  if (no_sync) {
    // Gradients stay unsharded in full_grad; .grad keeps pointing there.
    collect_into_full_grad(u);
    if (opts.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch_after(u, /*backward=*/true);
    return;
  }
  torch::Tensor in = flat_grads_for_reduce(u);
  if (opts.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch_after(u, /*backward=*/true);

  torch::NoGradGuard ng;
  // The input is not kept here: the communicator holds it for the transfer
  // and drops it the moment the reduce-scatter completed, so the unsharded
  // gradients are freed then, not when the result is folded in.
  PendingReduce p{&u, nullptr, torch::Tensor()};
  if (u.keeps_unsharded) {
    p.output = in;
    p.work = comm->all_reduce(in, ReduceOp::AVG, {u.display_name()});
  } else {
    p.output = torch::empty({u.shard_numel}, in.options());
    p.work = comm->reduce_scatter(in, p.output, ReduceOp::AVG, {u.display_name()});
  }
  in = torch::Tensor();
  pending.push_back(std::move(p));
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
    while (done < pending.size() && (pending[done].work->is_completed() || pending.size() - done > 1)) ++done;
    if (done > 0) finish_reduces(done);
  }
}

namespace {
bool views_alias(const Unit& u) {
  if (!u.shard_grad.defined()) return false;
  for (auto& s : u.params) {
    if (!s.requires_grad) continue;
    const auto& g = s.shard_view.grad();
    if (!g.defined() || g.storage().unsafeGetStorageImpl() != u.shard_grad.storage().unsafeGetStorageImpl())
      return false;
  }
  return true;
}
}  // namespace

void ShardedState::wait_pending() { finish_reduces(pending.size()); }

// Waits for the first `count` pending reductions and adds them into the
// shard gradients.
void ShardedState::finish_reduces(size_t count) {
  torch::NoGradGuard ng;
  for (size_t i = 0; i < count; ++i) {
    auto& p = pending[i];
    if (!p.work->is_completed()) {
      trace::Span span("wait", "comm");
      if (span.active()) span.arg("unit", p.unit->name).arg("for", "reduce_scatter");
      p.work->wait();
    }
    p.work->wait();  // rethrows its error, if any
    Unit& u = *p.unit;
    torch::Tensor g = p.output.scalar_type() == torch::kFloat32 ? p.output : p.output.to(torch::kFloat32);
    if (views_alias(u)) {
      // The optimizer's grads still alias shard_grad (zeroed in place or
      // accumulating over micro-steps): add.
      u.shard_grad.add_(g);
    } else {
      // First gradient since the optimizer reset them (zero_grad with
      // set_to_none, or none yet): adopt the reduced buffer.
      u.shard_grad = g;
      const int64_t base = u.keeps_unsharded ? 0 : int64_t(rank()) * u.shard_numel;
      for (auto& s : u.params) {
        if (!s.requires_grad) continue;
        const int64_t off = s.hi > s.lo ? s.offset + s.lo - base : 0;
        s.shard_view.mutable_grad() = alias(u.shard_grad, off, {s.hi - s.lo});
      }
    }
  }
  pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(count));
}

void ShardedState::end_of_backward() {
  callback_queued = false;
  // Units that ran forward with grad but whose gradients never completed
  // (unused parameters, outputs not in the loss) still reduce, so every rank
  // issues the same collectives in the same order.
  for (auto& up : units) {
    Unit& u = *up;
    if (u.training == TrainingState::FORWARD_DONE) {
      prepare_grads(u);  // zeros: nothing reached this unit's parameters
      u.training = TrainingState::BACKWARD;
    }
    if (u.training == TrainingState::BACKWARD) post_backward(u);
  }
  wait_pending();
  for (auto& up : units) {
    if (!up->keeps_unsharded) reshard(*up);
    up->training = TrainingState::IDLE;
  }
}

}  // namespace fsdp::detail
