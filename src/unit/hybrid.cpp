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
// reduction after that (reduce_finished), always oldest first, so every
// rank of a replica group issues the all-reduces in the same order, the
// units' reduce order.
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

bool Engine::reduce_finished(PendingReduce& p) {
  if (!p.work->is_completed()) return false;
  if (!replica_comm || p.unit->keeps_unsharded) return true;
  if (!p.replica_work) {
    p.work->wait();  // rethrows the reduce-scatter's error before the output is used
    p.replica_work = replica_comm->all_reduce(p.output, ReduceOp::AVG, {p.unit->display_name()});
  }
  return p.replica_work->is_completed();
}

void Engine::wait_reduce(PendingReduce& p) {
  if (!p.work->is_completed()) {
    trace::Span span("wait", "comm");
    if (span.active()) span.arg("unit", p.unit->name).arg("for", "reduce_scatter");
    p.work->wait();
  }
  p.work->wait();  // rethrows its error, if any
  if (!reduce_finished(p)) {
    trace::Span span("wait", "comm");
    if (span.active()) span.arg("unit", p.unit->name).arg("for", "all_reduce across replicas");
    p.replica_work->wait();
  }
  if (p.replica_work) p.replica_work->wait();  // rethrows its error, if any
  // GPU: the optimizer (on compute) reads the output after the reduce
  // stream's work; its block stays allocated until compute is done with it.
  streams.compute_waits_for_reduce();
  streams.keep_until_done(p.output);
  p.input = torch::Tensor();  // compute is ordered after the reduce's reads now
}

}  // namespace fsdp::detail
