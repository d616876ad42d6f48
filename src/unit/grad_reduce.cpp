// fsdp-cpp: reduce — the engine's side of the reduce-scatter: the reductions
// in flight, no_sync, the end-of-backward callback.
//
// defines: Engine::on_grad_ready, post_backward, wait_pending,
//          fold_finished_reduces, finish_reduces, end_of_backward,
//          wait_for_snapshot
//
// When the last gradient of a unit has landed (a post-hook on every
// parameter's AccumulateGrad node; the end-of-backward callback covers
// units whose parameters got no gradient), the unit's post_backward
// (unit.cpp) reshards it and hands back its gradients as one flat buffer;
// the engine issues their reduce-scatter (AVG over ranks; NO_SHARD: an
// all-reduce) and keeps it pending.
//
// Lifetimes: the reduce runs on the communication thread, which holds its
// input buffer until the transfer completed and then frees it; the output
// is added into `shard_grad` when the engine next looks (every unit's pre-
// and post-backward fold the finished ones in; one stays in flight, an
// older one is waited for, so held buffers do not grow with the number of
// units; the rest at the end of backward, clip, ledger). Inside no_sync()
// nothing is issued; the first backward outside no_sync reduces the sum.
#include <vector>

#include "unit/engine.h"

namespace fsdp::detail {

// --- The engine's side: pending reductions, no_sync, the callback ---

void Engine::on_grad_ready(Unit& u) {
  if (u.grad_ready()) post_backward(u);
}

void Engine::post_backward(Unit& u) {
  torch::Tensor in = u.post_backward(no_sync);
  if (u.n_grad_params == 0) return;
  if (opts.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch_after(u, /*backward=*/true);
  if (no_sync) {
    accumulated_no_sync = true;
    return;
  }
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
