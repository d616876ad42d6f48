// fsdp-cpp: the padding and shard arithmetic, in one place and torch-free.
// defines: shard::padded_numel, shard::shard_numel, shard::FlatLayout,
//          shard::flat_layout, shard::Range, shard::param_range, shard::even_range
//
// The engine (src/unit/layout.cpp), the planner (src/plan/) and the
// checkpoint code (src/checkpoint/, src/state/state_dict.cpp) all size and cut
// shards with these functions, so a checkpoint saved by the engine, a plan
// and an offline reshard always agree on who owns which element.
//
// For a unit with `numel` flat elements on N ranks (docs/DESIGN.md#vocabulary):
//   padded numel  = ceil(numel / N) * N        NO_SHARD: numel (no padding)
//   shard numel S = padded / N                 NO_SHARD: numel (a replica)
//   rank r's shard = flat[r*S, (r+1)*S)        NO_SHARD: flat[0, numel)
// A parameter occupies flat[offset, offset + n); rank r holds elements
// [lo, hi) of it (parameter-local), possibly none.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fsdp::shard {

// ceil(numel / world) * world: the flat buffer padded so every rank holds
// the same count. numel 0 stays 0.
constexpr int64_t padded_numel(int64_t numel, int world) { return (numel + world - 1) / world * world; }

// ceil(numel / world): each rank's share of the padded buffer.
constexpr int64_t shard_numel(int64_t numel, int world) { return padded_numel(numel, world) / world; }

// One unit's flat buffer on one rank.
struct FlatLayout {
  int64_t numel = 0;         // original elements
  int64_t padded_numel = 0;  // all-gather output / reduce-scatter input size
  int64_t shard_numel = 0;   // this rank's master shard size (every rank the same)
  int64_t shard_begin = 0;   // where this rank's shard starts in the padded flat buffer
};

// NO_SHARD keeps the whole flat buffer on every rank: no padding, shard = all.
constexpr FlatLayout flat_layout(int64_t numel, int world, int rank, bool no_shard) {
  FlatLayout l;
  l.numel = numel;
  l.padded_numel = no_shard ? numel : padded_numel(numel, world);
  l.shard_numel = no_shard ? numel : l.padded_numel / world;
  l.shard_begin = no_shard ? 0 : int64_t(rank) * l.shard_numel;
  return l;
}

// Elements [lo, hi) of one original tensor (flattened).
struct Range {
  int64_t lo = 0, hi = 0;
  constexpr int64_t size() const { return hi - lo; }
  constexpr bool empty() const { return hi <= lo; }
};

// The part of a parameter at flat[offset, offset + numel) that falls in the
// shard flat[shard_begin, shard_begin + shard_numel), in parameter-local
// elements. When none does, lo == hi, clamped to [0, numel] at the side of
// the parameter the shard lies on (so ranges stay ordered by rank).
constexpr Range param_range(int64_t offset, int64_t numel, int64_t shard_begin, int64_t shard_numel) {
  const int64_t lo_g = std::max(offset, shard_begin);
  const int64_t hi_g = std::min(offset + numel, shard_begin + shard_numel);
  if (lo_g < hi_g) return {lo_g - offset, hi_g - offset};
  const int64_t at = std::clamp<int64_t>(shard_begin - offset, 0, numel);
  return {at, at};
}

// FSDP's split of one tensor of `numel` elements on its own (a unit holding
// only it): rank r owns [r*S, (r+1)*S) ∩ [0, numel), S = ceil(numel / world).
constexpr Range even_range(int64_t numel, int rank, int world) {
  const int64_t s = shard_numel(numel, world);
  return param_range(0, numel, int64_t(rank) * s, s);
}

}  // namespace fsdp::shard
