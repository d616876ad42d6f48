// fsdp-cpp: the collective algorithms, on a mesh of point-to-point links.
// defines: Wire, remaining, post_send, post_recv, Traffic, ring_all_gather, ring_reduce_scatter,
//          ring_all_reduce, direct_broadcast, direct_gather, dissemination_barrier
//
// Rank r talks to its ring neighbours r+1 (right) and r-1 (left). A "step"
// is one round of a ring (or of the barrier). Each message travels in its
// own Gloo slot, derived from the collective's sequence number and the step
// (slots.h), so two collectives can never match each other's messages.
// Every wait is bounded by the call's deadline; Gloo throws on expiry and
// fails the whole mesh, which the caller turns into a CollectiveError.
//
// Bytes sent by rank r (what the counters record):
//   all_gather       sum of the blocks except block r+1    ((N-1)/N of output)
//   reduce_scatter   sum of the chunks except chunk r      ((N-1)/N of input)
//   broadcast        root: (N-1) x tensor, others 0
//   gather           others: their input, root 0
//   barrier          ceil(log2 N) single bytes
// Zero-byte blocks are neither sent nor received (both sides know the sizes).
#pragma once

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "comm/slots.h"
#include "common/ring_math.h"

namespace fsdp::flight {
struct Progress;
}

namespace fsdp::comm {

class Mesh;
class Transfer;

// One collective on the wire: the mesh it runs on, its sequence number (its
// slots), its deadline, and the counters its transfers update (the peer
// waited on, bytes arrived and sent; null: none). A wait that times out or
// fails throws naming the peer and the bytes that had arrived from it.
// Borrowed: the mesh and the progress outlive the collective.
struct Wire {
  Mesh* mesh = nullptr;
  uint64_t seq = 0;
  std::chrono::steady_clock::time_point deadline;
  flight::Progress* progress = nullptr;
  // The communicator's rank of each rank of mesh, when mesh is one tier of
  // a composed collective (tiers.h); messages and progress then name
  // those. Null: mesh is the communicator's own.
  const std::vector<int>* names = nullptr;
  // Target bytes of one piece (ResolvedOptions::ring_piece_bytes; the
  // cutting is common/ring_math.h's).
  int64_t piece_bytes = ring::kDefaultPieceBytes;
  // The steps of this collective's CMA messages (cma.h): a second CMA
  // exchange under the same sequence number takes slots::kCmaSecond.
  slots::Range cma_steps = slots::kCma;
  int name(int q) const { return names && q >= 0 ? (*names)[q] : q; }
};

// What is left of a collective's time, at least 1 ms: Gloo treats a
// non-positive timeout as "use the default"; 1 ms expires now.
inline std::chrono::milliseconds remaining(const Wire& w) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// Posts a send (receive) of `nbytes` at `p` to (from) `peer` of w.mesh,
// matched by `slot`. Every algorithm posts through these. A link that broke
// before the post (its peer died first) fails the post itself, not a later
// wait: the error then names the peer, and w.progress records it as the
// rank waited on, as a failed wait would (diagnosis.h's waited_on).
Transfer post_send(const Wire& w, int peer, uint64_t slot, const void* p, int64_t nbytes);
Transfer post_recv(const Wire& w, int peer, uint64_t slot, void* p, int64_t nbytes);

// Bytes this rank sent in one collective, and the part that crossed hosts
// (-1: count it from the ring's neighbour, as the flat algorithms).
struct Traffic {
  int64_t bytes = 0;
  int64_t inter = -1;
  // The host-shared forms (host_shared.h): nothing moved inside a host (the
  // trace's span says so: "host_shared": 1).
  bool host_shared = false;
  // What `inter` would have been uncompressed (quantized.h's logical bytes);
  // -1: `inter` itself, nothing crossed hosts quantized.
  int64_t inter_logical = -1;
  Traffic(int64_t b = 0, int64_t i = -1) : bytes(b), inter(i) {}  // NOLINT: an int64_t is a flat count
};

// Blocks are byte ranges of `buf`; rank r already holds block r. Afterwards
// every rank holds every block. Returns bytes sent. Messages take the steps
// of `steps` (slots.h; an all_reduce gathers from step N, after its
// reduce-scatter's; a set-up exchange at sequence number 0 names its own).
int64_t ring_all_gather(const Wire& w, void* buf, const std::vector<int64_t>& offset_bytes,
                        const std::vector<int64_t>& count_bytes, slots::Range steps = slots::kRing);

// Chunks are element ranges of `in`; writes the reduction of every rank's
// chunk r to `out_chunk` (which may alias chunk r of `in`; nothing else of
// `in` is written). divisor N turns the sum into a mean. Returns bytes sent.
int64_t ring_reduce_scatter(const Wire& w, const void* in, void* out_chunk,
                            const std::vector<int64_t>& offset, const std::vector<int64_t>& count,
                            c10::ScalarType dtype, int divisor);

// In place over `numel` elements of `dtype` at `data`, chunks as
// ring_chunks(numel, N): the ring reduce-scatter into this rank's chunk,
// then the ring all-gather of the chunks from step N. Returns bytes sent.
int64_t ring_all_reduce(const Wire& w, void* data, int64_t numel, c10::ScalarType dtype, int divisor);

// root's bytes land on every rank. Returns bytes sent.
int64_t direct_broadcast(const Wire& w, void* buf, int64_t nbytes, int root);

// Every rank's `nbytes` at `in` land at root's out + r*nbytes (root copies
// its own). Non-roots send once; root posts N-1 receives. Returns bytes sent.
int64_t direct_gather(const Wire& w, const void* in, void* out, int64_t nbytes, int root);

// Returns once every rank entered; bytes sent.
int64_t dissemination_barrier(const Wire& w);

}  // namespace fsdp::comm
