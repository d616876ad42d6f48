// fsdp-cpp: collectives over two tiers: cross-memory attach inside each
// host, Gloo TCP between hosts.
// defines: TierLayout, tier_layout, Tiers, connect_tiers, TierCompression, tier_compression, QuantizedCall,
//          tier_all_gather, tier_reduce_scatter, tier_all_reduce,
//          tier_shared_all_gather, tier_shared_reduce_scatter
//
// A communicator whose ranks sit on H > 1 hosts with the same S > 1 ranks
// on each (in any order: a host's ranks need not be consecutive) runs
// all_gather, reduce_scatter and all_reduce as two collectives on two
// internal meshes, made like the groups of Communicator::split:
//   intra  the S ranks of this rank's host (local index s = its place
//          among them, in rank order), by CMA (cma.h);
//   inter  the H ranks that have this rank's local index, one per host, by
//          the Gloo TCP ring (ring.h).
// Order, so that only 1/S of a host's bytes cross its link per rank:
//   all_gather      inter all-gather of the shards of same-local-index ranks
//                   straight into the output, then intra all-gather of those
//                   H blocks per rank (strided in the output: no staging);
//   reduce_scatter  intra reduce-scatter where local rank s gets the host's
//                   sum of the H chunks it will forward (staged: H chunks),
//                   then inter reduce-scatter of those into the output;
//   all_reduce      intra reduce-scatter of chunk s (in place), inter
//                   all-reduce of it, intra all-gather of the chunks.
// Both tiers use the communicator's sequence number, deadline and progress
// (a tier's mesh is used only by its communicator's thread, so its slots
// never meet another collective's). Messages name the communicator's ranks
// (Wire::names).
//
// Host-shared (host_shared.h; FSDP_SHARE_HOST on and every host's ranks
// able to map each other's memory): each host keeps one copy of a unit,
// mapped by its S ranks, and the two collectives whose buffers lie there
// move no byte inside a host:
//   all_gather      the inter all-gather writes the H blocks of this rank's
//                   local index where they lie in its host's copy, then the
//                   host's ranks meet at a barrier;
//   reduce_scatter  local rank s sums the H chunks it forwards over its
//                   host's gradient blocks where they lie (in rank order),
//                   then the inter reduce-scatter as above.
// Only the inter tier's bytes move; counted as without sharing.
//
// Compressed (CommOptions::compress, FSDP_COMPRESS; path::Choice::compressed):
// a compressible call (CollectiveInfo::compressible) of fp32, bf16 or fp16
// runs its inter tier through quantized.h and nothing else changes:
//   all_gather      each rank quantizes its own shard (TierCompression::
//                   weights), the quantized shards go round the inter ring,
//                   every rank decodes all H of them, its own too, into
//                   their places; then the intra tier copies those decoded
//                   blocks, so every rank of the world holds the same bits;
//   reduce_scatter  the intra tier's host sums (exact, as uncompressed) plus
//                   this buffer's residual, quantized per destination
//                   (grads), the all-to-all of quantized.h, decoded and summed
//                   in fp32 in inter rank order, divided once; the residual
//                   becomes what was meant minus what was sent (error feedback,
//                   keyed by the call's label, numel and dtype).
//   all_reduce      the intra tier's host sum of chunk s (exact), then
//                   quantized_all_reduce of it over the inter ring (grads,
//                   then the reduced chunks in int8; two residuals, quantized.h),
//                   then the intra tier copies the decoded chunks: every rank
//                   of the world holds the same bits.
// With error feedback off (TierCompression::error_feedback) the same
// without residuals.
// Counted: the bytes sent (inter: quantized); Traffic::inter_logical the
// uncompressed inter tier's. The host-shared reduce-scatter compresses its
// inter tier the same way (its output is the rank's own shard). The
// host-shared all-gather stays exact (the host's fp32 copy holds the
// master shard itself, which a decoded copy must not overwrite).
//
// Summation: a chunk is summed first over the ranks of each host (in the
// CMA ring order of that host), then over the hosts' partial sums (the TCP
// ring order of the inter tier). Integers and values exact in the dtype
// give the flat path's bits; other floating-point values differ from the
// flat ring's order by rounding (bf16/fp16: rounded after each addition).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/cma.h"
#include "comm/mesh.h"
#include "comm/quantize.h"
#include "comm/rendezvous.h"
#include "comm/world_env.h"

namespace fsdp::comm {

class HostShared;

// Where each rank of a communicator sits in the two tiers.
struct TierLayout {
  int hosts = 0, per_host = 0;           // H, S
  std::vector<int> host, local;          // of each rank: host index, local index
  std::vector<std::vector<int>> intra;   // [h]: the ranks of host h, in rank order
  std::vector<std::vector<int>> inter;   // [s]: the ranks of local index s, in rank order
};

// The layout when `host_index` (hosts of the ranks, as Communicator::hosts)
// composes: H > 1 and every host has the same S > 1 ranks. Else nullopt,
// and *why says which condition failed.
// `global`: the global rank of each rank (messages).
std::optional<TierLayout> tier_layout(const std::vector<int>& host_index, const std::vector<int>& global,
                                      std::string* why);

// The two meshes of one rank, constant after connect_tiers.
struct Tiers {
  TierLayout layout;
  int rank = 0;  // this rank, in the communicator
  std::unique_ptr<Rendezvous> intra_rdv, inter_rdv;
  std::shared_ptr<Mesh> intra_mesh, inter_mesh;
  CmaPeers peers;  // of the intra mesh
  // The memory this host's ranks share (over the intra mesh), when every
  // host's ranks can map each other's and FSDP_SHARE_HOST is on; else null.
  std::shared_ptr<HostShared> shared;
  // Why not, when FSDP_SHARE_HOST is on ("" shared; every rank agrees on
  // whether it is empty, and a rank of the host at fault says why).
  std::string share_blocked;
  // The communicator's rank of each rank of the two meshes.
  const std::vector<int>& intra_ranks() const { return layout.intra[layout.host[rank]]; }
  const std::vector<int>& inter_ranks() const { return layout.inter[layout.local[rank]]; }
  // The communicator's collective `w` on one tier's mesh.
  Wire intra_wire(const Wire& w) const {
    return {intra_mesh.get(), w.seq, w.deadline, w.progress, &intra_ranks(), w.piece_bytes, w.cma_steps};
  }
  Wire inter_wire(const Wire& w) const {
    return {inter_mesh.get(), w.seq, w.deadline, w.progress, &inter_ranks(), w.piece_bytes, w.cma_steps};
  }
  // Clean shutdown of both meshes' store keys (as a group's).
  void leave(std::chrono::milliseconds budget);
};

// Collective over the communicator (every rank calls it, with the same
// layout): joins the two meshes under `parent`'s keys (tags "tier/h<h>/",
// "tier/l<s>/"), probes CMA inside the host, then agrees with every rank on
// the communicator's own mesh `mesh` (at sequence number 0). Returns null
// when some host cannot use CMA (*why says which and why); every rank then
// gets null. With opts.share_host it also probes whether each host's ranks
// can map each other's memory (probe_host_sharing) and agrees on the answer:
// Tiers::shared, or Tiers::share_blocked. `global`: the global rank of each
// rank (messages).
std::unique_ptr<Tiers> connect_tiers(const Rendezvous& parent, const WorldEnv& world, Mesh* mesh,
                                     const TierLayout& layout, const std::vector<int>& global,
                                     const ResolvedOptions& opts, std::string* why);

// The compression of a path's bytes across hosts (the tiers' inter tier, or
// the flat ring of one rank per host, algorithms.h): formats, and the
// residuals of the gradients' buffers. Owned by one communicator's path,
// used by its thread only.
struct TierCompression {
  QuantFormat weights;  // the all-gather's
  QuantFormat grads;    // the reduce-scatter's, and the all-reduce's first stage
  QuantFormat reduced;  // the all-reduce's second stage (the reduced chunks' all-gather): int8 always
  // CommOptions::error_feedback (FSDP_COMPRESS_FEEDBACK): false sends plain
  // quantized values and keeps no residual.
  bool error_feedback = true;
  ErrorFeedback feedback;
  // The residuals' store when error feedback is on, else null.
  ErrorFeedback* residuals() { return error_feedback ? &feedback : nullptr; }
};
// The formats of FSDP_COMPRESS's values (fsdp/comm.h Compression; not OFF).
TierCompression tier_compression(Compression c, bool error_feedback = true);

// One compressible call on the tiers: its formats and residuals, and the
// key of its buffer's residual.
struct QuantizedCall {
  TierCompression* with = nullptr;
  std::string key;
  c10::ScalarType dtype = c10::kFloat;  // fp32, bf16 or fp16
};

// The communicator's contracts (fsdp/comm.h, gloo_communicator.cpp).
// Counted: the inter tier's ring bytes (all across hosts) plus what a ring
// of the intra tier would send for the same blocks (cma.h's convention).
// `q`: compressed (above); null: exact.
Traffic tier_all_gather(const Wire& w, const Tiers& t, const void* in, void* out, int64_t block_bytes,
                        const QuantizedCall* q = nullptr);
Traffic tier_reduce_scatter(const Wire& w, const Tiers& t, const void* in, void* out, int64_t count,
                            c10::ScalarType dtype, int divisor, const QuantizedCall* q = nullptr);
Traffic tier_all_reduce(const Wire& w, const Tiers& t, void* data, int64_t numel, c10::ScalarType dtype,
                        int divisor, const QuantizedCall* q = nullptr);
// The host-shared forms (above), when t.shared and on every rank `out` is
// one of its common mappings (HostShared::is_common) / `in` one of its
// blocks (is_block). Counted as tier_all_gather / tier_reduce_scatter.
Traffic tier_shared_all_gather(const Wire& w, const Tiers& t, const void* in, void* out, int64_t block_bytes);
Traffic tier_shared_reduce_scatter(const Wire& w, const Tiers& t, const void* in, void* out, int64_t count,
                                   c10::ScalarType dtype, int divisor, const QuantizedCall* q = nullptr);

}  // namespace fsdp::comm
