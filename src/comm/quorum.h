// fsdp-cpp: replica groups that come and go — the coordinator, a rank's
// connection to it, and the link between the ranks that hold one shard.
// defines: GroupIdentity, QuorumView, StepOutcome, QuorumClient, ReplicaLink,
//          CoordinatorOptions, Coordinator
//
// A replica group is S ranks launched together (their own `fsdp run`)
// that shard one copy of the model; R groups train the same model on
// different data (HYBRID_SHARD's replicas, launched apart). A coordinator
// that no group hosts (`fsdp coordinator`) keeps the quorum: the groups
// that take part in each step. Everything goes through the TCPStore the
// coordinator hosts, under "fsdp-ft/":
//
//   cfg              {"heartbeat_ms", "epoch"}: the coordinator's settings
//   nreg, reg/<i>    the i-th rank that said hello: {"group", "rank"}
//   hb/<g>/<r>       rank r of group g's heartbeat (a counter it bumps)
//   mb/<g>/<r>       its mailbox: its last message (JSON with "seq": hello,
//                    req: a quorum for its next step, vote, bye)
//   ans/<g>/<inc>/<round>   the coordinator's answer to group g's request
//                    (<inc>: the group's incarnation, so a restarted
//                    group never reads its previous life's answers)
//   dec/<q>          quorum q's outcome: commit, or drop and why
//   q<c>/r<r>/       the Gloo links of the quorum's communicator c for
//                    shard r (rank r of every member group)
//
// A quorum forms when every live member of the previous one that holds its
// state asks for the next step (every rank of the group asked; after a
// dropped step the survivors are waited for a moment only); groups that
// asked and were not members join it. A group is live while every rank's heartbeat moves;
// one silent for the heartbeat timeout is lost (named: group, rank, host,
// pid). A step commits only when every rank of every member voted that its
// gradients were averaged; any failure or loss drops it everywhere.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::comm {

class Mesh;
class StoreClient;
struct TransportChoice;

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
};
ReplicaPlace resolve_replica_place(const std::string& coordinator, int group);

// What a group is: the coordinator refuses a group whose model, sharding or
// size differs from the groups that are training.
struct GroupIdentity {
  int group = 0;             // the replica group's id (>= 0)
  int rank = 0;              // this rank in its group
  int group_size = 1;        // ranks in the group
  int64_t incarnation = 0;   // the same on every rank of one launch of the group; a later launch's is larger
  std::string model;         // e.g. "12 tensors, 2410 elements, names 5d41..."
  std::string sharding;      // e.g. "FULL_SHARD, fp32"
};

// A quorum as one group sees it.
struct QuorumView {
  int64_t id = -1;           // quorum id (one per step attempt)
  int64_t comm = -1;         // its communicator's id: changes when the members do, or after a failure
  int64_t step = 0;          // the step the members take (the most any member committed)
  std::vector<int> members;  // group ids, ascending
  std::vector<int> sources;  // members that hold step `step` whole (heal sources)
  bool heal = false;         // this group must copy the state from a source first
  int index = -1;            // this group's position in `members`
};

struct StepOutcome {
  bool commit = false;
  std::string why;  // for a drop: who failed or was lost
};

// A rank's connection to the coordinator: its heartbeat runs on a thread
// of its own from construction; requests and votes wait for the answer.
class QuorumClient {
 public:
  // Connects to the coordinator at addr:port (waits up to `connect_budget`)
  // and says hello. Throws fsdp::Error when it cannot be reached.
  QuorumClient(const ReplicaPlace& place, GroupIdentity id, std::chrono::milliseconds connect_budget);
  ~QuorumClient();  // says bye
  QuorumClient(const QuorumClient&) = delete;
  QuorumClient& operator=(const QuorumClient&) = delete;

  // Asks for a quorum for the step after `committed` steps; waits for it.
  // Throws fsdp::Error when the coordinator refuses this group (the message
  // names what differs) or stops answering.
  QuorumView join(int64_t committed);
  // This rank's vote on quorum `q` (ok: its gradients were averaged), then
  // the outcome once the coordinator has every vote or lost a member. The
  // vote asks for the next quorum too (for the step after the outcome), so
  // the coordinator forms it as it decides and join() finds it waiting.
  StepOutcome vote(const QuorumView& q, bool ok, const std::string& why);

  const GroupIdentity& identity() const { return id_; }
  const std::string& address() const { return place_.host; }
  int port() const { return place_.port; }
  const ReplicaPlace& place() const { return place_; }
  // The coordinator's heartbeat timeout: how long a collective across
  // groups may take before it counts as failed.
  std::chrono::milliseconds heartbeat_timeout() const { return heartbeat_timeout_; }

 private:
  // Writes this rank's mailbox (a JSON object; "seq" and "kind" added).
  void send(const std::string& kind, std::string body_json);
  // The value of `key` once the coordinator wrote it; throws when the
  // coordinator stops answering or restarted meanwhile.
  std::string wait_key(const std::string& key, const char* what);

  ReplicaPlace place_;
  GroupIdentity id_;
  std::chrono::milliseconds heartbeat_timeout_{10000};
  std::string cfg_;  // the coordinator's settings as first read: another value is another coordinator
  int64_t seq_ = 0;
  int64_t round_ = 0;
  bool asked_ = false;  // the last vote asked for round_ already
  std::unique_ptr<StoreClient> client_;            // requests and votes
  std::unique_ptr<StoreClient> heartbeat_client_;  // the heartbeat's own connection
};

// The links between rank r of every member group of one quorum: the
// gradients' mean, and the heal's copies. Each wait is bounded by the
// heartbeat timeout; a failure throws fsdp::CollectiveError.
class ReplicaLink {
 public:
  ReplicaLink(const QuorumClient& client, const QuorumView& q);
  ~ReplicaLink();
  int64_t comm() const { return comm_; }
  int size() const;
  int index() const;
  // In place: the mean over the members (ring reduce-scatter + all-gather).
  void all_reduce_mean(torch::Tensor flat);
  // Point to point, in issue order (each a message of its own). The
  // tensors must be contiguous; the _all forms keep many in flight.
  void send(int to_index, const torch::Tensor& t);
  void recv(int from_index, torch::Tensor t);
  void send_all(int to_index, const std::vector<torch::Tensor>& ts);
  void recv_all(int from_index, const std::vector<torch::Tensor>& ts);
  // A bulk copy: `lend` makes `ts` (contiguous) available to `to_index`
  // and returns once it took them; `take` fills `ts` with what `from_index`
  // lent (the same sizes, in order). Cross-memory attach when both ranks
  // are on this host (the peer reads straight out of the lender's tensors),
  // else the TCP messages of send_all / recv_all.
  void lend(int to_index, const std::vector<torch::Tensor>& ts);
  void take(int from_index, const std::vector<torch::Tensor>& ts);
  // Whether the members share this host and move bytes by cross-memory attach.
  bool cross_memory() const;
  int64_t bytes_sent() const { return sent_; }

 private:
  std::chrono::steady_clock::time_point deadline() const;
  // send_all / recv_all: `ts` posted in windows, each waited for.
  void post_all(int peer, const std::vector<torch::Tensor>& ts, bool sending);
  int64_t comm_;
  int rank_;  // the shard: this rank in its group
  std::chrono::milliseconds timeout_;
  std::vector<int> members_;
  std::shared_ptr<Mesh> mesh_;
  std::unique_ptr<TransportChoice> transport_;
  uint64_t seq_ = 1;                    // all-reduces
  std::map<int, uint64_t> copies_;      // point-to-point messages per peer
  int64_t sent_ = 0;
};


struct CoordinatorOptions {
  std::string host = "127.0.0.1";  // the address it listens on
  int port = 29400;                // 0: a free port (Coordinator::port())
  bool bind_all = false;           // listen on every interface
  std::chrono::milliseconds heartbeat_timeout{10000};
  int min_groups = 1;              // groups the first quorum waits for
  // Each event ("group 1 joined", "quorum 7: step 12, groups 0,2", ...).
  std::function<void(const std::string&)> log;
};

// The coordinator: hosts the store and decides the quorums (one thread:
// run()).
class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions o);
  ~Coordinator();
  int port() const;
  // Serves until `stop` is set.
  void run(const std::atomic<bool>& stop);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace fsdp::comm
