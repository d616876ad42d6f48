// fsdp-cpp: HYBRID_SHARD — shard inside a group, replicate across groups.
//
// With S ranks per shard group and R = N / S groups, rank r is rank r % S
// of shard group r / S (consecutive ranks: one host under `fsdp run
// --nnodes`) and rank r / S of replica group r % S (the ranks holding the
// same shard, one per shard group). A unit is laid out and all-gathered
// over its shard group exactly as FULL_SHARD (HYBRID_SHARD_ZERO2:
// SHARD_GRAD_OP) at world size S; its gradients are reduce-scattered (AVG)
// inside the group, and then the shard of reduced gradients is all-reduced
// (AVG) across the replica group: the mean over all N ranks, and the only
// bytes that cross hosts, 2 (R-1)/R x P/S per rank per step.
//
// Ordering: each group has its own communication thread, so a shard's
// all-reduce must not be issued before its reduce-scatter finished (it
// reads that output). It is issued by the first look at the pending
// reductions after that (issue_stages), and never before every older
// reduction's, so every rank of a replica group issues the all-reduces in
// the same order, the units' reduce order. (Looking at each reduction on
// its own was not enough: an older one could complete between the look at
// it and the look at a newer one, which was then issued first.)
//
// Replica groups (fsdp/replicas.h) add a last stage the same way: the mean
// of the reduced shard across the step's groups (Engine::across), issued
// once the stages before it completed, in the same order on every group.
// defines: Engine::make_groups, shard_rank_of, issue_stages,
//          reduce_finished, wait_reduce
#include "unit/engine.h"

namespace fsdp::detail {

Engine::Groups Engine::make_groups(const CommPtr& comm, const FsdpOptions& opts) {
  if (!is_hybrid(opts.strategy)) return {comm, nullptr};
  const int n = comm->world_size(), r = comm->rank();
  const int s = opts.shard_group_size > 0 ? opts.shard_group_size : comm->local_world_size();
  if (s < 1 || n % s != 0)
    throw Error(detail::cat(
        "fully_shard(", to_string(opts.strategy), "): the shard group size must divide the world size; found ",
        "shard group ", s, opts.shard_group_size > 0 ? " (FsdpOptions.shard_group_size)" : " (LOCAL_WORLD_SIZE)",
        " for a world of ", n, ". Fix: set FsdpOptions.shard_group_size (gpt: --shard-group S) to a divisor of ",
        n, ", e.g. the ranks of one host"));
  // Every rank splits in the same order: shard groups first.
  CommPtr shard = comm->split(r / s, {"shard " + std::to_string(r / s), std::chrono::milliseconds(0)});
  CommPtr replica = comm->split(r % s, {"replica " + std::to_string(r % s), std::chrono::milliseconds(0)});
  return {std::move(shard), std::move(replica)};
}

int Engine::shard_rank_of(int world_rank) const {
  if (!replica_comm) return world_rank;
  const int s = shard_world();
  return world_rank / s == rank() / s ? world_rank % s : -1;
}

namespace {
// Whether a reduction's output goes on to HYBRID's all-reduce across the
// replicas (a NO_SHARD unit's reduce is over the whole world already).
bool replicated(const CommPtr& replica_comm, const PendingReduce& p) {
  return replica_comm && !p.unit->keeps_unsharded;
}

// Waits for `w` (one stage of unit u's reduction) inside a "wait" span, when
// it has not completed yet; a stage's error is rethrown by its own wait().
void wait_in_span(Work& w, const Unit& u, const char* stage) {
  if (w.is_completed()) return;
  trace::Span span("wait", "comm");
  if (span.active()) span.arg("unit", u.name).arg("for", stage);
  w.wait();
}
}  // namespace

void Engine::issue_stages() {
  bool older_replica = true, older_across = true;  // every older reduction issued that stage
  for (auto& p : pending) {
    const bool hybrid = replicated(replica_comm, p);
    if (hybrid && !p.replica_work && older_replica && p.work->is_completed()) {
      p.work->wait();  // rethrows the reduce-scatter's error before the output is used
      // Compressible: one rank per host, so with FSDP_COMPRESS its bytes
      // cross hosts quantized; the unit's name keys its residuals.
      p.replica_work =
          replica_comm->all_reduce(p.output, ReduceOp::AVG, {p.unit->display_name(), /*compressible=*/true});
    }
    older_replica = older_replica && (!hybrid || p.replica_work);
    if (across && !p.across_work && older_across) {
      const WorkPtr& before = hybrid ? p.replica_work : p.work;
      if (before && before->is_completed()) {
        before->wait();  // rethrows its error before the output is used
        p.across_work = across(p.output, p.unit->display_name());
      }
    }
    older_across = older_across && (!across || p.across_work);
    if (!older_replica && !older_across) return;
  }
}

bool Engine::reduce_finished(PendingReduce& p) {
  issue_stages();
  if (!p.work->is_completed()) return false;
  if (replicated(replica_comm, p) && !(p.replica_work && p.replica_work->is_completed())) return false;
  return !across || (p.across_work && p.across_work->is_completed());
}

// Called oldest first (finish_reduces): every older reduction issued all
// its stages, so issue_stages issues this one's as each stage completes.
void Engine::wait_reduce(PendingReduce& p) {
  wait_in_span(*p.work, *p.unit, "reduce_scatter");
  p.work->wait();  // rethrows its error, if any
  if (replicated(replica_comm, p)) {
    issue_stages();
    FSDP_CHECK(p.replica_work != nullptr, "wait_reduce: the all-reduce across replicas was not issued in order");
    wait_in_span(*p.replica_work, *p.unit, "all_reduce across replicas");
    p.replica_work->wait();  // rethrows its error, if any
  }
  if (across) {
    issue_stages();
    FSDP_CHECK(p.across_work != nullptr, "wait_reduce: the mean across replica groups was not issued in order");
    wait_in_span(*p.across_work, *p.unit, "mean across replica groups");
  }
  // GPU: the optimizer (on compute) reads the output after the reduce
  // stream's work; its block stays allocated until compute is done with it.
  streams.compute_waits_for_reduce();
  streams.keep_until_done(p.output);
  p.input = torch::Tensor();  // compute is ordered after the reduce's reads now
}

}  // namespace fsdp::detail
