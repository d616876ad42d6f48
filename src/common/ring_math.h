// fsdp-cpp: how the ring collectives cut their blocks into pieces, in one
// place and torch-free.
// defines: ring::kDefaultPieceBytes, ring::pieces_for, ring::piece,
//          ring::piece_numel, ring::kReduceStagingSlots,
//          ring::reduce_scatter_staging_bytes
//
// The TCP ring (src/comm/ring.cpp), the cross-memory-attach reduction
// (src/comm/cma.cpp) and the planner's staging term (src/plan/plan.cpp) all
// cut with these, so the staging the planner predicts is the staging the
// collectives allocate. A piece is at most the target size
// (CommOptions::ring_piece_bytes, FSDP_RING_PIECE_KIB; 1 MiB by default) and
// at least one element; the pieces of a block differ by at most one element.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/shard_math.h"

namespace fsdp::ring {

// Big enough that the per-message handshake is noise, small enough that the
// reduce-scatter's staging is a few MiB at most.
inline constexpr int64_t kDefaultPieceBytes = int64_t(1) << 20;

// Pieces that cut `count` elements of `elem_bytes` bytes into pieces of at
// most `target_bytes` (at least one element each): at least 1.
constexpr int64_t pieces_for(int64_t count, int64_t elem_bytes, int64_t target_bytes) {
  const int64_t target = std::max(elem_bytes, target_bytes);
  return std::max<int64_t>(1, (count * elem_bytes + target - 1) / target);
}

// Piece j of `count` elements cut into `pieces`: elements [lo, hi).
constexpr shard::Range piece(int64_t count, int64_t pieces, int64_t j) {
  const int64_t base = count / pieces, extra = count % pieces;
  const int64_t lo = j * base + std::min(j, extra);
  return {lo, lo + base + (j < extra ? 1 : 0)};
}

// Elements of the largest piece of `count` cut for `target_bytes`.
constexpr int64_t piece_numel(int64_t count, int64_t elem_bytes, int64_t target_bytes) {
  const int64_t p = pieces_for(count, elem_bytes, target_bytes);
  return (count + p - 1) / p;
}

// The reduce-scatter ring's staging at N > 2: 2 receive and 2 send slots of
// one piece each. At N = 2 every step is the last and partials land straight
// in the output; one rank has no ring.
inline constexpr int64_t kReduceStagingSlots = 2 + 2;
constexpr int64_t reduce_scatter_staging_bytes(int64_t shard_numel, int64_t elem_bytes, int world,
                                               int64_t target_bytes) {
  if (world <= 2 || shard_numel == 0) return 0;
  return kReduceStagingSlots * piece_numel(shard_numel, elem_bytes, target_bytes) * elem_bytes;
}

}  // namespace fsdp::ring
