// fsdp-cpp: the sharding strategies (torch-free: the planner uses them too).
// defines: ShardingStrategy
#pragma once

namespace fsdp {

// How parameters, gradients and optimizer state are split over the ranks:
// memory per rank traded against traffic per step (docs/GUIDE.md).
enum class ShardingStrategy {
  FULL_SHARD,     // params, grads, optimizer state sharded; params freed after forward
  SHARD_GRAD_OP,  // params kept unsharded from forward through backward
  NO_SHARD,       // replicas, gradients all-reduced (DDP)
  // Two tiers (FsdpOptions::shard_group_size ranks per shard group, by
  // default one host): FULL_SHARD inside each shard group, the groups are
  // replicas and each shard's gradients are all-reduced across them.
  HYBRID_SHARD,
  HYBRID_SHARD_ZERO2,  // SHARD_GRAD_OP inside each shard group, replicas across
};

// Whether the strategy shards within groups and replicates across them.
constexpr bool is_hybrid(ShardingStrategy s) {
  return s == ShardingStrategy::HYBRID_SHARD || s == ShardingStrategy::HYBRID_SHARD_ZERO2;
}

}  // namespace fsdp
