// fsdp-cpp: the links between rank r of every member group of one quorum:
// the gradients' mean, and the heal's copies.
// defines: ReplicaLink
//
// A Gloo mesh connected through the coordinator's store (keys under
// Keys::link(comm, r)); cross-memory attach when every member is on this
// host. Each wait is bounded by the heartbeat timeout; a failure throws
// fsdp::CollectiveError or fsdp::Error naming the group at fault.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "replicas/rank_side.h"

namespace fsdp::comm {
class Mesh;
struct TransportChoice;
}  // namespace fsdp::comm

namespace fsdp::replicas {

class QuorumClient;

class ReplicaLink {
 public:
  ReplicaLink(const QuorumClient& client, const QuorumView& q);
  ~ReplicaLink();
  // Whether these are the links of quorum `q` (its communicator, of its
  // coordinator's era: a coordinator that restarted numbers them anew).
  bool serves(const QuorumView& q) const { return q.comm == comm_ && q.era == era_; }
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
  int64_t comm_, era_;
  int rank_;  // the shard: this rank in its group
  std::chrono::milliseconds timeout_;
  std::vector<int> members_;
  std::shared_ptr<comm::Mesh> mesh_;
  std::unique_ptr<comm::TransportChoice> transport_;
  uint64_t seq_ = 1;                    // all-reduces
  std::map<int, uint64_t> copies_;      // point-to-point messages per peer
  int64_t sent_ = 0;
};

}  // namespace fsdp::replicas
