// fsdp-cpp: a rank's connection to the coordinator of replica groups — the
// rank-side protocol (rank_side.h) driven over the coordinator's store.
// defines: ReplicaPlace, resolve_replica_place, take_launch, QuorumClient
//
// Two connections: one for the rank's messages and the waits for answers
// (in order: a mailbox write never overtakes an earlier one), and one the
// heartbeat thread owns, which beats every tenth of the heartbeat timeout,
// reports where the rank stands, and registers the rank with every new
// coordinator it finds (a new epoch in the settings). A wait that finds the
// coordinator gone waits for it to come back (up to the coordinator
// timeout); one that finds a new coordinator sends its latest message again
// and goes on waiting for the same key in the new store.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "replicas/rank_side.h"

namespace fsdp::comm {
class StoreClient;
}

namespace fsdp::replicas {

// Where the coordinator is and which group this process is: `coordinator`
// ("host:port") and `group` when given, else FSDP_COORDINATOR and
// FSDP_REPLICA_GROUP. Throws fsdp::Error naming what is missing.
struct ReplicaPlace {
  std::string host;
  int port = 0;
  int group = -1;
  // How the links across groups move bytes (FSDP_TRANSPORT) and which
  // ranks count as one host (FSDP_HOST_ID), read with the rest, once.
  std::string transport = "auto";
  std::string host_id;
  // FSDP_JOB_TOKEN: a coordinator started with a token serves only ranks
  // that hold the same (its keys are under it); one started without serves
  // every rank under the token-less keys.
  std::string job_token;
  // How long a rank waits for a coordinator that stopped answering.
  std::chrono::milliseconds coordinator_timeout{60000};
};
ReplicaPlace resolve_replica_place(const std::string& coordinator, int group,
                                   std::chrono::milliseconds coordinator_timeout);

// A new launch number from the coordinator's counter (rank 0 of a launch
// takes it; the group agrees on it by broadcast). Throws fsdp::Error when
// no coordinator answers within `budget`, or it is another job's.
int64_t take_launch(const ReplicaPlace& place, std::chrono::milliseconds budget);

class QuorumClient {
 public:
  // Connects (waits up to `connect_budget`), checks the coordinator is this
  // job's and speaks this protocol, says hello and starts the heartbeat.
  // Throws fsdp::Error when it cannot.
  QuorumClient(const ReplicaPlace& place, GroupIdentity id, int64_t start_step,
               std::chrono::milliseconds connect_budget);
  // Says bye, and stays (at most the coordinator timeout) until every rank of
  // its last quorum read the outcome: a coordinator that restarts meanwhile
  // learns it from this rank. Not while an exception unwinds.
  ~QuorumClient();
  QuorumClient(const QuorumClient&) = delete;
  QuorumClient& operator=(const QuorumClient&) = delete;

  // Asks for the quorum of the step after committed() and waits for it.
  // Throws fsdp::Error when the coordinator refuses this group (the message
  // names what differs) or stays away past the coordinator timeout.
  QuorumView join();
  // The group installed the source's state: this rank holds the quorum's step.
  void healed();
  // This rank's vote on the quorum it is in, then the outcome (applied to
  // committed() when it commits). Asks for the next quorum too.
  Outcome vote(bool ok, const std::string& why);

  int64_t committed() const;
  const GroupIdentity& identity() const;
  const ReplicaPlace& place() const { return place_; }
  const Keys& keys() const { return keys_; }
  // The coordinator's heartbeat timeout: how long a collective across
  // groups may take before it counts as failed.
  std::chrono::milliseconds heartbeat_timeout() const { return heartbeat_timeout_; }
  // How many times a new coordinator was found since this rank started.
  int64_t coordinator_restarts() const { return restarts_; }

  struct Shared;  // with the heartbeat thread

 private:
  void send(const RankMessage& m);
  // The value of `key` once the coordinator wrote it (see the file's note).
  // Throws fsdp::Error when the coordinator stays away past the timeout, or
  // `give_up` passes.
  std::string wait_key(const std::string& key, const char* what, bool outcome_pending,
                       std::chrono::steady_clock::time_point give_up = std::chrono::steady_clock::time_point::max());

  ReplicaPlace place_;
  Keys keys_;
  std::chrono::milliseconds heartbeat_timeout_{10000};
  std::string epoch_;  // the settings this thread last saw (another value: another coordinator)
  int64_t restarts_ = 0;
  bool unsent_ = false;  // the latest message did not reach the store: sent again while waiting
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<comm::StoreClient> client_;     // messages and waits
  std::unique_ptr<comm::StoreClient> heartbeat_;  // the heartbeat thread's
  std::thread watch_;                             // notices this process held up (Shared::watch_cv)
};

}  // namespace fsdp::replicas
