// fsdp-cpp: the bytes a rank sends per training step, in one place and
// torch-free (the FSDP guide's 3P / 2P, docs/GUIDE.md).
// defines: traffic::Bytes, traffic::ring_sent, traffic::per_step,
//          traffic::inter_host_part
//
// The planner (src/plan/plan.cpp, src/plan/tier_traffic.cpp) and the report's
// reference lines (src/observe/report.cpp) compute with these, and the
// collectives' counters measure what they predict (ring.h lists what each
// collective sends).
#pragma once

#include <cstdint>

#include "fsdp/strategy.h"

namespace fsdp::traffic {

// Bytes one rank sends in one step, by collective kind.
struct Bytes {
  int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;
  constexpr int64_t total() const { return all_gather + reduce_scatter + all_reduce; }
};

// Elements one rank sends in a ring all-gather or reduce-scatter of a flat
// buffer padded to `padded` (a multiple of n) over n ranks: (n-1)/n of it.
// An all-reduce sends twice that.
constexpr int64_t ring_sent(int64_t padded, int n) { return n > 0 ? padded / n * (n - 1) : 0; }

// One step of `micro_steps` forward/backward passes over units whose padded
// flat sizes add up to `padded` (for HYBRID: padded over the shard group),
// on `world` ranks in shard groups of `group` (HYBRID; else world), with
// parameters of `param_bytes` and reductions of `reduce_bytes` per element:
//   FULL_SHARD     all-gather forward and backward, reduce-scatter: 3P(N-1)/N
//   SHARD_GRAD_OP  all-gather forward, reduce-scatter:               2P(N-1)/N
//   NO_SHARD       all-reduce (DDP):                                  2P(N-1)/N
//   HYBRID(_ZERO2) the above inside the group of S, and the replicas'
//                  all-reduce of each shard: 2 (R-1)/R x P/S, R = N/S
// `reduces`: the micro-steps that reduce (no_sync: 1); -1: every one.
constexpr Bytes per_step(ShardingStrategy s, int64_t padded, int world, int group, int64_t micro_steps,
                         int64_t param_bytes, int64_t reduce_bytes, int64_t reduces = -1) {
  Bytes t;
  const int64_t K = micro_steps, KR = reduces < 0 ? micro_steps : reduces;
  switch (s) {
    case ShardingStrategy::FULL_SHARD:
      t.all_gather = 2 * K * ring_sent(padded, world) * param_bytes;
      t.reduce_scatter = KR * ring_sent(padded, world) * reduce_bytes;
      break;
    case ShardingStrategy::SHARD_GRAD_OP:
      t.all_gather = K * ring_sent(padded, world) * param_bytes;
      t.reduce_scatter = KR * ring_sent(padded, world) * reduce_bytes;
      break;
    case ShardingStrategy::NO_SHARD:
      t.all_reduce = 2 * KR * ring_sent(padded, world) * reduce_bytes;
      break;
    case ShardingStrategy::HYBRID_SHARD:
    case ShardingStrategy::HYBRID_SHARD_ZERO2: {
      t = per_step(s == ShardingStrategy::HYBRID_SHARD ? ShardingStrategy::FULL_SHARD : ShardingStrategy::SHARD_GRAD_OP,
                   padded, group, group, micro_steps, param_bytes, reduce_bytes, reduces);
      const int64_t R = world / group, shard = padded / group;
      t.all_reduce = 2 * KR * (R - 1) * shard / R * reduce_bytes;
      break;
    }
  }
  return t;
}

// Of `total` bytes a rank sends in flat collectives over `world` ranks on
// `hosts` hosts composed in tiers (cross-memory attach inside each host, TCP
// between ranks of the same local index), the part that crosses hosts:
// (H-1) of every (N-1) blocks. (Every such total is a multiple of N-1:
// padded / N x (N-1) elements.)
constexpr int64_t inter_host_part(int64_t total, int world, int hosts) {
  return hosts > 1 && world > 1 ? total / (world - 1) * (hosts - 1) : 0;
}

}  // namespace fsdp::traffic
