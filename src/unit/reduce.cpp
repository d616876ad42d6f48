// fsdp-cpp: reduce — gradients leave the unit as 1/N shards.
//
// Each parameter's .grad is preset to its slice of the unit's zeroed flat
// gradient buffer (`full_grad`), so autograd accumulates into it in place.
// When the last gradient of a unit has landed (a post-hook on every
// parameter's AccumulateGrad node; the end-of-backward callback covers units
// whose parameters got no gradient), the buffer is reduce-scattered (AVG over
// ranks) into the shard gradient; NO_SHARD all-reduces it instead.
//
// Lifetimes: the reduce runs on the communication thread; its input buffer
// is owned by the PendingReduce until the work completed, and only then is
// its output added into `shard_grad` (wait_pending: end of backward, clip,
// ledger). Inside no_sync() the flat gradients stay unsharded and keep
// accumulating; the first backward outside reduces their sum.
#include "compat/torch_compat.h"
#include "unit/sharded_state.h"

namespace fsdp::detail {

torch::Tensor alias(const torch::Tensor& base, int64_t offset, c10::IntArrayRef shape);


void ShardedState::prepare_grads(Unit& u) {
  if (u.n_grad_params == 0) return;
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
  prepare_grads(u);  // folds in any gradient that bypassed the buffer
  if (!u.keeps_unsharded) reshard(u);
  if (opts.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch_after(u, /*backward=*/true);
  if (no_sync) return;  // gradients stay in full_grad, .grad keeps pointing there

  torch::NoGradGuard ng;
  torch::Tensor in = u.full_grad.scalar_type() == u.reduce_dtype ? u.full_grad : u.full_grad.to(u.reduce_dtype);
  PendingReduce p{&u, nullptr, in, torch::Tensor()};
  if (u.keeps_unsharded) {
    p.output = in;
    p.work = comm->all_reduce(in, ReduceOp::AVG, {u.display_name()});
  } else {
    p.output = torch::empty({u.shard_numel}, in.options());
    p.work = comm->reduce_scatter(in, p.output, ReduceOp::AVG, {u.display_name()});
  }
  for (auto& s : u.params)
    if (s.requires_grad) s.param.mutable_grad().reset();
  u.full_grad = torch::Tensor();  // the PendingReduce holds the bytes until done
  pending.push_back(std::move(p));
  if (!opts.async_reduce) {
    wait_pending();
  } else {
    // Bound the reductions in flight: each holds a unit's unsharded
    // gradients, so finished ones are folded in now and at most
    // limit_all_gathers stay pending (the peak then does not grow with
    // the number of units).
    size_t done = 0;
    while (done < pending.size() && (pending[done].work->is_completed() ||
                                     pending.size() - done > static_cast<size_t>(opts.limit_all_gathers)))
      ++done;
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
