// fsdp-cpp: rendezvous through libtorch's c10d::TCPStore.
// defines: Rendezvous
//
// Rank 0 hosts the TCPStore server at MASTER_PORT; every rank (rank 0 too)
// talks to it as a client. The store is shared by every communicator of the
// process (each under its own key prefix) and lives until the process ends,
// so a later communicator never races a server being torn down.
//
// Nothing here blocks past a deadline: a key is awaited by polling
// check() instead of TCPStore::wait, because a TCPStore wait that times out
// leaves its connection out of step (the late reply answers the next request).
//
// Binding: rank 0 (or the launcher hosting the store) binds the store's
// listening socket to MASTER_ADDR itself and hands it to TCPStore
// (TCPStoreOptions::masterListenFd), so the store does not listen on every
// interface (FSDP_STORE_BIND=all makes it); see store_listen.h. Keys live under the job's secret
// FSDP_JOB_TOKEN (set by `fsdp run`), so a process outside the job cannot
// name them. docs/RELIABILITY.md says what else to do on shared networks.
//
// Keys, under "fsdp/[<token>/]c<generation>/":
//   job             (no token in the path) a hash of the token, so a rank of
//                   another job that reaches this port fails at once
//   world_size      rank 0's WORLD_SIZE, checked by every rank
//   abort           the first rank that finds a mismatch writes why
//   joined/<r>      rank r arrived (host and pid)
//   seq/<r>         "<seq>|<wall s>|<step>|<phase>|<what>": the last collective
//                   rank r entered ("0": none; comm/watchdog.h)
//   left            ranks that finished cleanly (rank 0 waits for all)
//   gloo/...        Gloo's own address exchange
//   s<k>/<color>/   the same keys (no job) for group <color> of this
//                   communicator's k-th split
// and, under "fsdp/[<token>/]" (the process's, not one communicator's):
//   hb/<r>          rank r's heartbeat (JSON, fsdp/watchdog.h)
//   verdict/<r>     rank r's reading of the collective that failed on it
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/world_env.h"

namespace fsdp::comm {

class Mesh;
using Clock = std::chrono::steady_clock;

// A client connection of its own to the world's store (the heartbeat thread).
c10::intrusive_ptr<c10d::TCPStore> connect_store_client(const WorldEnv& w, std::chrono::milliseconds timeout);
// A client connection to the store at addr:port (the launcher's reader).
c10::intrusive_ptr<c10d::TCPStore> connect_store_client(const std::string& addr, int port,
                                                        std::chrono::milliseconds timeout);
// A store server on addr:port, bound like rank 0's (watchdog::StoreHost):
// to addr's interface, or with `bind_all` (FSDP_STORE_BIND=all) to every one.
c10d::TCPStore* host_store(const std::string& addr, int port, std::chrono::milliseconds timeout, bool bind_all);
void close_hosted_store(c10d::TCPStore* store);
// A full mesh of Gloo TCP links between `size` ranks through `store`'s
// keys under `prefix` (waits polled, as the rendezvous's), on the address
// of this host toward addr:port. Throws fsdp::Error naming the address.
std::shared_ptr<Mesh> connect_mesh_through(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                           int rank, int size, const std::string& addr, int port,
                                           std::chrono::milliseconds timeout);

class Rendezvous {
 public:
  // Connects to (rank 0: starts, unless opts.store_hosted) the store, checks
  // that every rank agrees on the world size and waits until all have joined
  // (opts.rendezvous_timeout; keys under opts.job_token). Throws fsdp::Error
  // that names the ranks that never arrived, or the disagreement.
  Rendezvous(const WorldEnv& world, const ResolvedOptions& opts);
  // A group of `parent`'s ranks (Communicator::split): the parent's store
  // and job, keys under the parent's prefix + `tag` ("s<k>/<color>/");
  // `group` is the group's own rank and size, `global` its ranks' global
  // ranks (the messages name those). Waits until every member joined.
  Rendezvous(const Rendezvous& parent, const std::string& tag, const WorldEnv& group,
             const std::vector<int>& global);

  // A full mesh of Gloo TCP links (c10d::ProcessGroupGloo; device on
  // `ifname`, or on the address that reaches MASTER_ADDR). Collective
  // timeouts are passed per wait.
  std::shared_ptr<Mesh> connect_gloo(const std::string& ifname);

  // The last collective a rank entered: its sequence number and what it is.
  struct Progress {
    int64_t seq = -1;  // -1: unknown (store unreachable)
    std::string what;  // e.g. "all_reduce 'blocks.3' (bf16, ...)"
  };
  // A cheap one-way store write (no reply awaited); errors are swallowed:
  // progress only feeds diagnoses.
  void record_entered(uint64_t seq, const std::string& what);
  // Every rank's progress, read within `budget`.
  std::vector<Progress> read_progress(std::chrono::milliseconds budget);

  // Clean shutdown: count this rank out; rank 0 then waits (bounded) until
  // every rank did, so its store outlives the others' last use of it.
  void leave(std::chrono::milliseconds budget);

  const std::string& describe_store() const { return where_; }
  // The world's store (NCCL's communicators exchange their ids through it,
  // under prefix()).
  const c10::intrusive_ptr<c10d::TCPStore>& store() const { return store_; }
  // "fsdp/[<token>/]": the job's keys (heartbeats, verdicts) live under it.
  const std::string& key_base() const { return base_; }
  // This communicator's keys: key_base() + "c<generation>/".
  const std::string& prefix() const { return prefix_; }
  int generation() const { return generation_; }

 private:
  // Marks this rank joined (and in no collective yet) under prefix_, then
  // waits for every rank's mark; returns the ranks still missing at the
  // deadline (empty: all joined). Throws when the abort key appears.
  std::vector<int> join(Clock::time_point deadline);
  bool has(const std::string& key);
  std::string get(const std::string& key);
  // Missing keys at the deadline (empty: all present). Stops early and throws
  // when the abort key appears.
  std::vector<std::string> wait_keys(const std::vector<std::string>& keys, Clock::time_point deadline);

  // Constant after construction.
  WorldEnv world_;
  std::chrono::milliseconds timeout_;
  std::string base_;    // "fsdp/[<token>/]"
  std::string prefix_;  // base_ + "c<generation>/"
  int generation_ = 0;
  std::string where_;   // "127.0.0.1:29500"
  std::vector<int> global_;  // a group's global ranks; empty for a world
  c10::intrusive_ptr<c10d::TCPStore> store_;  // process-wide, never freed (see above)
};

}  // namespace fsdp::comm
