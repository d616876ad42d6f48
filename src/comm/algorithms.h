// fsdp-cpp: the path a Gloo communicator's collectives take, as one object
// chosen once.
// defines: Compressible, Algorithms, divisor, PathInputs, ChosenPath, choose_algorithms
//
// path::choose (common/collective_path.h) decides once per communicator how
// its all_gather, reduce_scatter and all_reduce move bytes: the flat TCP
// ring (ring.h), cross-memory attach inside one host (cma.h), or the two
// tiers across hosts (tiers.h). choose_algorithms turns the answer into the
// object the communicator calls, as FSDP2 injects its collectives into a
// parameter group, so no collective branches on the path again:
//
//   return algorithms_->reduce_scatter(w, in, out, count, dtype, divisor(op, n));
//
// On the CMA path with host-shared memory (host_shared.h) an all_gather
// into a shared tensor is a barrier and a reduce_scatter from peer memory
// sums where the gradients lie; other buffers take the CMA algorithms. On
// the tiers the same happens inside each host (tiers.h).
//
// broadcast, gather, barrier and the FSDP_DEBUG=detail check run the direct
// and ring algorithms (ring.h) on the communicator's own mesh whatever the
// path: they are small, or once per run.
#pragma once

#include <sys/types.h>

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/cma.h"
#include "comm/quantize.h"
#include "comm/ring.h"
#include "comm/world_env.h"
#include "common/collective_path.h"

namespace fsdp::comm {

class Rendezvous;
class HostShared;

// A call that may cross hosts compressed (CollectiveInfo::compressible, of
// fp32, bf16 or fp16): what a compressing path needs beside the bytes.
struct Compressible {
  std::string label;  // with numel and dtype, the key of a reduce-scatter's residual
  c10::ScalarType dtype = c10::kFloat;
};

// One path's collectives over a communicator's ranks. Called only by the
// communicator's thread, with a Wire on the communicator's own mesh.
class Algorithms {
 public:
  virtual ~Algorithms() = default;

  // fsdp/comm.h's contracts on raw buffers; each returns what this rank sent
  // (Traffic::inter -1: count the ring neighbour's tier).
  // `in` holds this rank's block (block_bytes), which lands at
  // out + rank * block_bytes (in may be exactly there).
  // `lossy`: the call may travel compressed (only where the path's choice
  // says compressed: the tiers' inter tier, the flat ring of one rank per
  // host); null: exact. The same on every rank.
  virtual Traffic all_gather(const Wire& w, const void* in, void* out, int64_t block_bytes,
                             const Compressible* lossy = nullptr) = 0;
  // Writes the reduction of every rank's chunk `rank` (count elements) of
  // `in` to `out`, divided by `divisor` (divisor()); out may be that chunk
  // of `in`, nothing else of `in` is written.
  virtual Traffic reduce_scatter(const Wire& w, const void* in, void* out, int64_t count, c10::ScalarType dtype,
                                 int divisor, const Compressible* lossy = nullptr) = 0;
  // In place, chunks as ring_chunks(numel, N).
  virtual Traffic all_reduce(const Wire& w, void* data, int64_t numel, c10::ScalarType dtype, int divisor,
                             const Compressible* lossy = nullptr) = 0;

  virtual path::Path path() const = 0;
  // How describe() names the path: "gloo/tcp", "cma+gloo", "cma+tcp tiers".
  virtual const char* name() const = 0;
  // The word in front of a failed call's own error: "gloo", "cma+gloo",
  // "cma+tcp tiers".
  virtual const char* error_source() const { return name(); }

  // For the diagnosis of a failed call. The peers whose process is gone,
  // "rank 1 (pid 4242), ..." ("" when none, or when this path reads no
  // peer's memory).
  virtual std::string gone_peers() const { return ""; }
  // The process of rank q when this path reads its memory (this host's
  // ranks), else -1.
  virtual pid_t pid_of(int q) const { return -1; }

  // A clean shutdown of what the path connected beside the communicator's
  // own mesh (the tiers' meshes and their store keys).
  virtual void leave(std::chrono::milliseconds budget) {}

  // The residuals of error feedback (quantize.h) this path keeps for its
  // compressed calls (CommOptions::compress), keyed by buffer (an
  // all_reduce's two: its key and key + " gather"); null when it compresses
  // nothing, empty with CommOptions::error_feedback off. Touched by the
  // communicator's thread only.
  virtual ErrorFeedback* feedback() { return nullptr; }

  // The memory this path's ranks share (host_shared.h), when the choice
  // says so (path::Choice::host_shared); null otherwise.
  virtual std::shared_ptr<HostShared> host_shared() const { return nullptr; }
  // Collective, when host_shared(): `bytes` zeroed bytes that every rank of
  // this rank's host maps (HostShared::map_common over that host's ranks:
  // all of them on the CMA path, the intra tier's on the tiers).
  virtual void* map_common(const Wire& w, int64_t bytes) { return nullptr; }
};

// What turns a sum over `ranks` ranks into `op`'s result: the one place AVG
// becomes a division (by the world size; SUM by 1).
inline int divisor(ReduceOp op, int ranks) { return op == ReduceOp::AVG ? ranks : 1; }

// What the path is chosen from: the communicator's settings, its ranks, its
// own mesh and what choose_transport found on it.
struct PathInputs {
  const ResolvedOptions& opts;
  const WorldEnv& world;   // the communicator's own rank and size
  Rendezvous& rdv;         // the tiers' meshes join under its keys
  Mesh* mesh;              // the communicator's own
  const TransportChoice& transport;
  const std::vector<int>& host_index;  // the host of each rank, numbered in rank order
  const std::vector<int>& global;      // the global rank of each rank (messages)
  const std::string& group;            // a group's name; "" for a world
};

struct ChosenPath {
  path::Choice choice;                    // the path and why (the same on every rank)
  std::unique_ptr<Algorithms> algorithms;  // never null
};

// Collective over the communicator when the facts point at the tiers
// (connecting them is): gathers the facts, asks path::choose, connects the
// tiers when that is the answer (and asks again when they cannot be), and
// records the choice in the trace's metadata ("collective_path", per group
// "collective_path/<name>"). FSDP_TRANSPORT=cma that cannot be honoured
// throws fsdp::Error, on every rank alike.
ChosenPath choose_algorithms(const PathInputs& in);

}  // namespace fsdp::comm
