// fsdp-cpp: memory the ranks of one host share, and the two collectives
// that need no bytes moved over it.
// defines: HostShared, probe_host_sharing
//
// Ranks on one host that may read each other's memory (the CMA path,
// cma.h) can also map it. Then a unit's flat parameter lives once per host
// (Communicator::shared_tensor): one memfd that every rank maps, laid out
// shard 0 .. shard N-1, so a rank's shard is its slice of it and the
// all-gather is a barrier. Gradients are reduced where they lie
// (Communicator::peer_tensor): each rank writes its unit's gradients into a
// block of its own memfd, and each rank sums its chunk over every rank's
// block, mapped, in rank order (0, 1, ..., N-1, bf16/fp16 in fp32, rounded
// once), so the result is the same at any world size with the same data.
//
// Across hosts (the tiers, tiers.h) the same holds inside each host: the
// HostShared of a rank spans its host's ranks (the intra tier's mesh), each
// host maps its own copy of a unit, and the blocks of the ranks of other
// hosts arrive in it over TCP (tier_shared_all_gather); a reduce sums the
// chunks a rank forwards over its host's blocks (sum_chunks) before they
// cross hosts.
//
// Nothing is named: the memory is a memfd (memfd_create(2)), which a peer
// reaches through pidfd_getfd(2) (the same permission as cross-memory
// attach), maps and closes its copy of. A unit's segment is closed by rank
// 0 too once every rank mapped it; a rank keeps its own gradient blocks'
// descriptors for its peers to take until it exits. So the memory lives only
// as long as a process of the job maps or holds it, and no crash can leave
// it behind (no /dev/shm file, nothing to unlink).
//
// Ordering: every exchange runs on the communicator's thread under the
// collective's sequence number (the Gloo messages of slots::kHostShared,
// the barrier's of ring.h), so a rank that is frozen or dead at a barrier
// is named like one frozen or dead in any collective (diagnosis.h), and the
// flight recorder shows each barrier as the all_gather or reduce_scatter it
// is. A reduce_scatter returns only after every rank has read every block
// (a second exchange), so its input may be freed or rewritten at once.
//
// Bytes counted are the TCP ring's for the same call, as on the CMA path:
// the counters measure the algorithm's traffic whatever the transport
// (docs/COMM.md).
#pragma once

#include <sys/types.h>

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/ring.h"

namespace fsdp::comm {

class Mesh;

// Collective over `mesh` at sequence number 0 (a communicator being set up):
// every rank maps one page of every peer's memory through a memfd and checks
// the value it holds. "" when every rank could, else one sentence naming the
// first rank that could not and why (the same on every rank). `names`:
// the communicator's rank of each rank of `mesh` (Wire::names), when it is
// one tier's.
std::string probe_host_sharing(Mesh* mesh, const std::vector<pid_t>& pid,
                               std::chrono::steady_clock::time_point deadline, const std::vector<int>* names = nullptr);

class HostShared : public std::enable_shared_from_this<HostShared> {
 public:
  // `pid`: every rank's process, in rank order (CmaPeers).
  HostShared(std::vector<pid_t> pid, int rank);
  ~HostShared();
  HostShared(const HostShared&) = delete;
  HostShared& operator=(const HostShared&) = delete;

  // On the communication thread, collective: `bytes` zeroed bytes that every
  // rank maps (rank 0 makes the memfd, the others take it). Returns this
  // rank's mapping; release() it (the tensors' deleter does).
  void* map_common(const Wire& w, int64_t bytes);
  // Any thread, not collective: `bytes` of this rank's own memory that its
  // peers can map; release() it.
  void* take_block(int64_t bytes);
  // Any thread: a common mapping is unmapped, a block goes back to the pool.
  void release(void* p);

  // Whether [p, p + bytes) lies in one common mapping (all_gather's output).
  bool is_common(const void* p, int64_t bytes) const;
  // Whether [p, p + bytes) lies in one of this rank's blocks (reduce_scatter's input).
  bool is_block(const void* p, int64_t bytes) const;

  // The two collectives (algorithms.h's contracts), when is_common(out) /
  // is_block(in) on every rank.
  Traffic all_gather(const Wire& w, const void* in, void* out, int64_t block_bytes);
  Traffic reduce_scatter(const Wire& w, const void* in, void* out, int64_t count, c10::ScalarType dtype, int divisor);
  // reduce_scatter's general form (the tiers' inside each host, tiers.h):
  // every rank passes a block `in` of `in_bytes` (is_block) and the same
  // element offsets `chunks`; out + k * count holds the sum of chunk k over
  // every rank's block, in rank order, divided by `divisor`. Returns after
  // every rank has read every block.
  Traffic sum_chunks(const Wire& w, const void* in, int64_t in_bytes, const std::vector<int64_t>& chunks,
                     int64_t count, void* out, c10::ScalarType dtype, int divisor);

  // Bytes mapped that every rank shares (the units' parameters), and this
  // rank's own peer-readable blocks (gradients), for the memory ledger.
  int64_t common_bytes() const;
  int64_t block_bytes() const;

 private:
  struct Block {
    uint64_t serial;  // this rank's, in order of creation
    int fd;           // kept open: peers take it with pidfd_getfd
    char* base;
    int64_t bytes;
    bool busy;
  };
  struct Mapping {
    char* base;
    int64_t bytes;
  };
  const Block* block_of(const void* p, int64_t bytes) const;  // mu_ held
  // A peer's block, mapped once (communication thread only).
  const char* peer_block(const Wire& w, int q, uint64_t serial, int fd, int64_t bytes);
  int pidfd(int q);  // communication thread only

  const std::vector<pid_t> pid_;
  const int rank_;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;      // guarded by mu_
  std::vector<Mapping> commons_;   // guarded by mu_
  uint64_t next_serial_ = 1;       // guarded by mu_
  // Communication thread only.
  std::map<std::pair<int, uint64_t>, Mapping> peer_blocks_;
  std::vector<int> pidfd_;
};

}  // namespace fsdp::comm
