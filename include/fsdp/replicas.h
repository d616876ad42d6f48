// fsdp-cpp: replica groups that come and go — a lost replica costs one step,
// not a restart (docs/DESIGN.md, "Replica groups").
// defines: ReplicaOptions, StepQuorum, ReplicaGroups
//
// A replica group is the S ranks of one `fsdp run` that shard one copy of
// the model (FULL_SHARD, SHARD_GRAD_OP or NO_SHARD over their own
// communicator); R groups, each launched on its own with its own
// --max-restarts, train the same model on different data, as HYBRID_SHARD's
// replicas do. A coordinator that no group hosts (`fsdp coordinator`)
// keeps the quorum of each step. Each step is a transaction:
//
//   fsdp::ReplicaGroups replicas(*model, opt);        // FSDP_COORDINATOR, FSDP_REPLICA_GROUP
//   while (replicas.step() < steps) {
//     const auto& q = replicas.start_step();           // may heal this group from a peer first
//     auto loss = loss_of(model, batch(q.step, replicas.group()));
//     loss.backward();
//     if (replicas.commit()) opt.step();               // the mean over the quorum's groups
//     opt.zero_grad();
//   }
//
// Each shard's gradients are averaged over rank r of every group of the
// quorum (on a CPU model unit by unit as backward goes on, as HYBRID_SHARD
// does across its replicas; on a GPU model in commit()), then every rank
// votes in commit(); the step is applied only when every
// rank of every member averaged (true on all of them), and dropped on all
// of them otherwise (a member died, froze or failed): the program then
// zeroes the gradients and the loop asks for the next quorum, which the
// survivors form without the lost group. The divisor is the number of
// groups that took part: the global batch of a step shrinks with the
// quorum (each group's batch and step time stay what they are).
//
// A group that joins late, restarts or thaws copies the parameters, the
// optimizer's state and the buffers from a group that holds the current
// step (shard r from rank r of a source; sources spread over the shards),
// in start_step(), before its first step: no checkpoint is read. The copy
// lands in staging; only when every rank of the group has all of its shard
// is it installed (a source that dies half way leaves the group's state as
// it was, and the next quorum heals again).
//
// The coordinator may be restarted under a running job (on the same
// address): the ranks wait for it (FSDP_COORDINATOR_TIMEOUT, 60 s by
// default), tell the new one where they stand, and go on; no group restarts
// and no step is applied twice.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

class FullyShardedModel;

// How far a heal got on this rank (ReplicaOptions::on_heal): called once the
// header (which tensors follow) crossed, and once all of it did.
struct HealProgress {
  int64_t step = 0;       // the quorum's step
  bool lending = false;   // this rank lends its shard of the state (else it takes one)
  int peer_group = -1;    // the group it lends to, or takes from
  int64_t bytes = 0;      // bytes moved so far
  int64_t total = 0;      // bytes in all
};

// Where the coordinator is and which group this process belongs to.
struct ReplicaOptions {
  // The coordinator, "host:port"; empty: FSDP_COORDINATOR.
  std::string coordinator;
  // This replica group's id (>= 0, unique in the job); -1: FSDP_REPLICA_GROUP.
  int group = -1;
  // How long to wait for the coordinator to answer at construction.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // Steps this group's state has committed already (a run resumed from a
  // checkpoint at step k passes k); 0: a fresh model.
  int64_t start_step = 0;
  // How long a rank waits for a coordinator that stopped answering to come
  // back (FSDP_COORDINATOR_TIMEOUT overrides it).
  std::chrono::milliseconds coordinator_timeout{std::chrono::seconds(60)};
  // Called as a heal moves this rank's shard (logs, progress bars, tests
  // that stop a rank half way); on the calling thread, in start_step().
  std::function<void(const HealProgress&)> on_heal;
};

// One step's quorum, as this group took part in it.
struct StepQuorum {
  int64_t id = -1;               // the coordinator's quorum id
  int64_t step = 0;              // the step number (steps committed before it)
  std::vector<int> groups;       // the groups taking part, ascending
  bool healed = false;           // this group copied its state from a peer before the step
  int heal_source = -1;          // ... from rank r of this group (r: this rank)
  double heal_seconds = 0;       // how long the copy took, from the source's first byte
  double heal_wait_seconds = 0;  // before it: waiting for the source to reach the step
  int64_t heal_bytes = 0;        // bytes this rank received
  bool committed = false;        // set by commit()
  std::string dropped;           // why the step was dropped ("" when committed)
};

// This replica group's part in the job: the quorum of each step, the mean
// of the gradients across groups, the vote, and healing from a peer.
class ReplicaGroups {
 public:
  // Collective over model.comm() (every rank of the group at once): agrees
  // on the group's launch, connects to the coordinator and says hello. The
  // model and the optimizer (built on model.parameters()) outlive this.
  // Throws fsdp::Error when the coordinator cannot be reached, or the
  // options and the environment name no coordinator or group.
  ReplicaGroups(FullyShardedModel& model, torch::optim::Optimizer& opt, ReplicaOptions opts = {});
  ~ReplicaGroups();
  ReplicaGroups(const ReplicaGroups&) = delete;
  ReplicaGroups& operator=(const ReplicaGroups&) = delete;

  // Waits for the next step's quorum and heals this group when it is
  // behind. Throws fsdp::Error when the coordinator refuses the group (its
  // model, sharding or size differ from the others': the message says
  // which) or stops answering.
  const StepQuorum& start_step();
  // After backward: the gradients' mean over the quorum's groups (which on
  // a CPU model backward already ran, unit by unit), then the vote. true: apply the step (call the optimizer); false: it was dropped
  // on every group (zero the gradients and go on).
  bool commit();
  // Steps committed (the next step's number).
  int64_t step() const;
  // This replica group's id.
  int group() const;
  // The current (or last) step's quorum.
  const StepQuorum& quorum() const;
  // Bytes this rank sent to other groups (gradients and heals).
  int64_t bytes_sent() const;
  // How many times this rank found a new coordinator (one restarted on the
  // same address) and went on with it.
  int64_t coordinator_restarts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp
