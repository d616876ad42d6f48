// fsdp-cpp: collectives between ranks of one host by cross-memory attach.
// defines: CmaPeers, choose_transport, TransportChoice, read_peer,
//          cma_all_gather, cma_reduce_scatter, cma_all_reduce, Segment,
//          cma_gather_segments, cma_reduce_segments
//
// A rank reads what it needs straight out of its peers' buffers with
// process_vm_readv(2): one copy, by the kernel, from the peer's pages into
// ours. Nothing is shared by name (no /dev/shm file, no futex word), so a
// rank that dies leaves nothing behind, and a reader of a dead rank gets
// ESRCH at once instead of waiting on memory nobody will ever write.
//
// Each collective, on the existing Gloo pairs and slots of its sequence
// number (the steps Wire::cma_steps names, slots.h, apart from the rings'
// and the call check's):
//   1. every rank sends every peer a Post (the address and byte count of
//      the buffer the peer will read), and receives theirs;
//   2. reads what it needs, in pieces, with the call's deadline checked
//      between pieces;
//   3. sends every peer "done" and waits for every peer's: a buffer is
//      returned to its owner (freed, reused, written) only when no peer
//      can still be reading it.
// all_reduce has one more such exchange between its two phases.
//
// Bytes counted are the TCP ring's for the same call (see ring.h), so the
// counters measure the algorithm's traffic whatever the transport: for
// all_gather and reduce_scatter that is exactly what this rank reads.
//
// Summation order (reduce_scatter, all_reduce): chunk c is summed as the
// ring sums it, starting at rank c+1 and ending at rank c,
//   ((in[c+1] + in[c+2]) + ...) + in[c]      (ranks mod N),
// each addition by add_into in the dtype (bf16/fp16 widened to fp32 and
// rounded after each addition, AVG divided at the last), so results are
// bitwise those of the ring for any input.
#pragma once

#include <sys/types.h>

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/ring.h"

namespace fsdp::comm {

using Clock = std::chrono::steady_clock;

// The process ids of every rank of a communicator that moves bytes by CMA.
struct CmaPeers {
  std::vector<pid_t> pid;
};

struct TransportChoice {
  bool cma = false;
  CmaPeers peers;   // filled when cma
  std::string why;  // one sentence: why this transport
  // Every rank's host identity (FSDP_HOST_ID, or host name, boot id and
  // namespaces), whatever the transport: the traffic tiers and the groups'
  // local ranks are counted from it.
  std::vector<std::string> host;
  bool one_host = false;  // every rank has the same host identity
};

// Collective (every rank calls it once, right after the Gloo mesh is up, at
// sequence number 0): exchanges each rank's host identity and FSDP_TRANSPORT
// (`mode`: auto, tcp, cma), then each rank reads a random value from every
// peer's memory. CMA when every rank is on this host and every probe read
// the right value (`cma` true; else `why` says what failed). Every rank
// reaches the same facts; the communicator chooses the path from them
// (common/collective_path.h). Throws fsdp::Error when the ranks disagree on
// the mode. Messages name the ranks by `global` and `group` (a group's
// name; "" for a world).
// `host_id`: FSDP_HOST_ID ("" unset), host_identity's argument.
TransportChoice choose_transport(Mesh* mesh, const std::string& mode, const std::string& host_id,
                                 Clock::time_point deadline, const std::vector<int>& global = {},
                                 const std::string& group = "");

// Copies `nbytes` from address `remote` of rank q (process `pid`) to `dst`
// in pieces of at most 4 MiB, checking the deadline between pieces. Throws
// std::runtime_error naming rank q (gone, not permitted, bad address,
// timed out).
void read_peer(const Wire& w, int q, pid_t pid, void* dst, uint64_t remote, int64_t nbytes);

// The peers whose process no longer exists ("rank 1 (pid 4242)", comma
// separated; empty when all live), for the diagnosis of a failed call: a
// process that has exited (even one not yet reaped) has no memory to
// read, which process_vm_readv reports as ESRCH before it looks at the
// address.
std::string cma_gone_peers(const CmaPeers& p, int self, const std::vector<int>* names = nullptr);

// Whether process `pid` of this host is gone for good: no such process, a
// zombie (dead, not yet reaped by its launcher), or exiting with its memory
// already torn down (process_vm_readv says ESRCH then, before its state in
// /proc shows it: right after a SIGKILL).
bool process_gone(pid_t pid);

// What tells this host apart from others (FSDP_HOST_ID, or the host name,
// the kernel's boot id and this process's pid and network namespaces):
// ranks with equal identities share a host (docs/COMM.md). `host_id`
// (FSDP_HOST_ID, ResolvedOptions::host_id) replaces it when not empty.
std::string host_identity(const std::string& host_id);

// Same contracts as ring_all_gather / ring_reduce_scatter / the ring
// all_reduce of gloo_communicator.cpp; return the ring's byte counts.
// all_gather: `in` holds this rank's block (block_bytes), which lands at
// out + r * block_bytes (in may be exactly there).
int64_t cma_all_gather(const Wire& w, const CmaPeers& p, const void* in, void* out, int64_t block_bytes);
// Writes the reduction of every rank's chunk r (count elements) of `in` to
// `out`; out may be chunk r of `in`, nothing else of `in` is written.
int64_t cma_reduce_scatter(const Wire& w, const CmaPeers& p, const void* in, void* out, int64_t count,
                           c10::ScalarType dtype, int divisor);
// In place, chunks as ring_chunks(numel, N).
int64_t cma_all_reduce(const Wire& w, const CmaPeers& p, void* data, int64_t numel, c10::ScalarType dtype,
                       int divisor);

// The same two collectives over ranges that need not be one block per rank
// (the intra-host tier of a composed collective, tiers.h): seg[q] lists
// rank q's ranges, in bytes for the gather and in elements for the reduce.
struct Segment {
  int64_t offset, count;
};
using Segments = std::vector<std::vector<Segment>>;
// Every rank's `buf` has the same `total_bytes` layout; afterwards each
// holds every rank q's ranges seg[q], read from q's buf at the same
// offsets (rank q has them already). Returns what a ring all-gather of
// these blocks sends: every rank's bytes but those of the right neighbour.
int64_t cma_gather_segments(const Wire& w, const CmaPeers& p, void* buf, int64_t total_bytes, const Segments& seg);
// Writes to `out` the reduction over every rank's `in` (numel elements) of
// this rank's ranges seg[r], one after the other, each summed in the
// ring's order. `out` must not overlap `in`, except that with one range
// it may be exactly that range of `in` (in place). Returns what a ring
// reduce-scatter of these chunks sends: every rank's elements but ours.
int64_t cma_reduce_segments(const Wire& w, const CmaPeers& p, const void* in, int64_t numel, void* out,
                            const Segments& seg, c10::ScalarType dtype, int divisor);

}  // namespace fsdp::comm
