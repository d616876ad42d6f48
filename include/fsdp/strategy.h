// fsdp-cpp: the sharding strategies, without torch (the planner uses them).
// defines: ShardingStrategy
#pragma once

namespace fsdp {

enum class ShardingStrategy {
  FULL_SHARD,     // params, grads, optimizer state sharded; params freed after forward
  SHARD_GRAD_OP,  // params kept unsharded from forward through backward
  NO_SHARD,       // replicas, gradients all-reduced (DDP)
};

}  // namespace fsdp
