// fsdp-cpp: memory the ranks of one host share, and the two collectives
// that need no bytes moved over it.
// defines: HostShared, Memfd, map_peer_memfd, probe_host_sharing
//
// Ranks on one host that may read each other's memory (the CMA path,
// cma.h) can also map it. Then a unit's flat parameter lives once per host
// (Communicator::shared_tensor): one memfd that every rank maps, laid out
// shard 0 .. shard N-1, so a rank's shard is its slice of it and the
// all-gather is a barrier. Gradients are reduced where they lie
// (Communicator::peer_tensor): each rank's backward writes its unit's
// gradients in a block of its own memfd (the unit's full_grad, unit.h), and
// each rank sums its chunk over every rank's block, mapped, in rank order (0, 1, ..., N-1, bf16/fp16 in fp32, rounded
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
// it behind (no /dev/shm file, nothing to unlink). Every memfd is sealed
// once sized (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): a process that
// tries to shrink it gets an error, where it would have turned every other
// rank's next touch of its mapping into a SIGBUS; and a rank
// checks the size and the seals of every descriptor it takes before it maps
// it. Peers map a rank's gradient blocks read-only: they only sum them.
//
// Synchronisation: no message and no Gloo. The host's ranks meet in a
// control segment (one memfd per HostShared, made by rank 0 as the
// communicator is set up, mapped read-write by every rank): each rank has a
// slot there holding the number of the last barrier it reached, whether it
// gave up (a collective of its failed), and what it tells its peers at each
// barrier (a block's descriptor, a request's size), double-buffered by the
// barrier's parity, so a fast rank writing its next post never overwrites
// one a slow peer still reads. A rank that arrives rings one futex word
// (FUTEX_WAKE, shared: the word lies in the memfd) when a peer sleeps on it.
// A rank that waits sleeps on that word (FUTEX_WAIT) at most kLook at a
// time, and between sleeps checks the deadline and whether the rank it
// waits for gave up or is gone (its pidfd, taken as the communicator was
// set up):
//   - a rank frozen at a barrier (never arrives) leaves the others waiting
//     until the collective's deadline; they throw naming it, and the
//     diagnosis (diagnosis.h) reads its heartbeat as in any collective
//     (the flight::Progress of the call names the rank waited on);
//   - a rank that died fails the others within kLook, naming it "gone";
//   - a rank whose collective failed (a timeout, a dead peer elsewhere,
//     a desync) marks its slot (abandon(), by the communicator, as Gloo
//     fails every link of a mesh), and its peers fail at once too.
// Each barrier runs inside its collective, on the communicator's thread,
// so the flight recorder shows it as the all_gather or reduce_scatter it
// is; each post carries the collective's sequence number and which
// barrier of which collective it is, so a barrier of collective k is never
// taken for one of k + 1 (the ranks that disagree throw, naming the other
// collective). A reduce_scatter returns only after every rank has read
// every block (a second barrier), so its input may be freed or rewritten
// at once.
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

// A memfd of `bytes` (page-rounded), created sealable, sized, then sealed
// (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), and mapped read-write; `what`
// names it in errors. Every memfd of this file is made here. Owns both: the
// destructor unmaps and closes what it still holds, so a throw between the
// making and the handing over leaks neither.
class Memfd {
 public:
  Memfd(int64_t bytes, const char* what);
  ~Memfd();
  Memfd(Memfd&& o) noexcept;
  Memfd& operator=(Memfd&&) = delete;
  Memfd(const Memfd&) = delete;

  int fd() const { return fd_; }
  char* base() const { return base_; }
  int64_t bytes() const { return bytes_; }  // page-rounded
  // Hands the mapping over (the caller unmaps it); the descriptor stays
  // owned, closed by the destructor (once every peer took its own).
  char* take_mapping();
  // Hands both over: the caller closes the descriptor and unmaps the mapping.
  void release();

 private:
  int fd_ = -1;
  char* base_ = nullptr;
  int64_t bytes_ = 0;
};

// A peer's memfd, taken: the process of `pidfd` (pidfd_open(2)) holds it as
// its descriptor `fd`; it is duplicated into this process, checked (at
// least `bytes`, page-rounded, as this rank asked; sealed as Memfd seals),
// mapped with `prot` (PROT_READ for memory this rank only reads), and the
// duplicate is closed. Every mapping of a peer's memory is made here. Null,
// and *why says what failed, when any step did.
char* map_peer_memfd(int pidfd, int fd, int64_t bytes, int prot, std::string* why);

class HostShared : public std::enable_shared_from_this<HostShared> {
 public:
  // How long a waiting rank sleeps between looks at the deadline and at its
  // peers' processes: a dead peer fails the others within about this long.
  static constexpr std::chrono::milliseconds kLook{10};

  // Collective over `mesh` at sequence number 0 (a communicator being set
  // up, after probe_host_sharing agreed on every rank): rank 0 makes the
  // control segment, every rank maps it and opens a pidfd of every peer.
  // Throws std::runtime_error on every rank when one could not. `pid`: every
  // rank's process, in rank order (CmaPeers); `names`: as probe_host_sharing's.
  static std::shared_ptr<HostShared> connect(Mesh* mesh, std::vector<pid_t> pid,
                                             std::chrono::steady_clock::time_point deadline,
                                             const std::vector<int>* names = nullptr);
  ~HostShared();
  HostShared(const HostShared&) = delete;
  HostShared& operator=(const HostShared&) = delete;

  // On the communication thread, collective: `bytes` zeroed bytes that every
  // rank maps (rank 0 makes the memfd, the others take it). Every rank
  // checks every rank's request, and the size of what it maps. Returns this
  // rank's mapping; release() it (the tensors' deleter does).
  void* map_common(const Wire& w, int64_t bytes);
  // Any thread, not collective: `bytes` of this rank's own memory that its
  // peers can map (read-only); release() it.
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
  // Collective, the host's ranks only: returns once every one of them has
  // written its part of a common mapping (all_gather's barrier; the tiers'
  // after their inter ring).
  void gathered(const Wire& w);

  // This rank gave up on collective `seq` (it failed: the communicator
  // calls this for every failed collective, host-shared or not): a peer
  // waiting for it at a barrier fails at once instead of at its deadline.
  // Any thread; idempotent.
  void abandon(uint64_t seq);

  // Bytes mapped that every rank shares (the units' parameters), and this
  // rank's own peer-readable blocks (gradients: those in use and those kept
  // in the pool), for the memory ledger (Communicator::peer_memory_bytes).
  int64_t common_bytes() const;
  int64_t block_bytes() const;

  // What one rank tells its peers at one barrier (the control segment's
  // posts; public for the layout's static checks).
  struct Post {
    uint64_t seq;    // the collective's sequence number
    int32_t op;      // which barrier of which collective (Op, host_shared.cpp)
    int32_t fd;      // a descriptor of the poster's to take (-1: none)
    uint64_t serial; // of that block
    int64_t offset;  // of the buffer in its block
    int64_t bytes;   // of the block (the mapping), or a common request's
    int64_t value;   // the input's bytes; "mapped" 1 or 0
  };

 private:
  struct Control;
  HostShared(std::vector<pid_t> pid, int rank, char* control, int64_t control_bytes);

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
  // A peer's block, mapped read-only once (communication thread only).
  const char* peer_block(const Wire& w, int q, uint64_t serial, int fd, int64_t bytes);
  // Collective (communication thread): writes `mine` where the host's ranks
  // read it, arrives at the next barrier, and waits for every other rank
  // to arrive (bounded: see the header's comment). Returns every rank's
  // post, by rank, after checking that each is barrier `op` of collective
  // w.seq.
  std::vector<Post> meet(const Wire& w, int op, Post mine);
  // Waits for rank q to reach barrier `b` (of barrier `op`, for messages).
  void wait_for(const Wire& w, int q, uint64_t b, int op);
  // Why rank q will never reach a barrier ("" while it may): it gave up,
  // or its process is gone.
  std::string lost(const Wire& w, int q);

  // Constant after construction.
  const std::vector<pid_t> pid_;
  const int rank_;
  Control* const control_;        // mapped read-write by every rank of the host
  const int64_t control_bytes_;
  std::vector<int> pidfd_;        // of every peer (-1: this rank); closed by the destructor

  mutable std::mutex mu_;
  std::vector<Block> blocks_;      // guarded by mu_
  std::vector<Mapping> commons_;   // guarded by mu_
  uint64_t next_serial_ = 1;       // guarded by mu_
  // Communication thread only.
  std::map<std::pair<int, uint64_t>, Mapping> peer_blocks_;
  uint64_t barriers_ = 0;  // barriers this rank reached (the same count on every rank of the host)
};

}  // namespace fsdp::comm
