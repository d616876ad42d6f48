// fsdp-cpp: the names of the sharding strategies, spelled and parsed in one
// place (torch-free: the engine, the planner and the tools share it).
// defines: detail::strategy_name, detail::strategy_from_name
#pragma once

#include <optional>
#include <string>

#include "fsdp/strategy.h"

namespace fsdp::detail {

// The enum's own name: "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
// "HYBRID_SHARD_ZERO2".
inline const char* strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD: return "HYBRID_SHARD";
    case ShardingStrategy::HYBRID_SHARD_ZERO2: return "HYBRID_SHARD_ZERO2";
  }
  return "?";
}

// Every spelling a flag or an option may use: the command-line names
// full|grad-op|none|hybrid|hybrid-zero2, the enum names and their lower case. nullopt for
// anything else; each caller words its own error (and the planner adds
// "auto" on top).
inline std::optional<ShardingStrategy> strategy_from_name(const std::string& t) {
  if (t == "full" || t == "FULL_SHARD" || t == "full_shard") return ShardingStrategy::FULL_SHARD;
  if (t == "grad-op" || t == "SHARD_GRAD_OP" || t == "shard_grad_op") return ShardingStrategy::SHARD_GRAD_OP;
  if (t == "none" || t == "NO_SHARD" || t == "no_shard") return ShardingStrategy::NO_SHARD;
  if (t == "hybrid" || t == "HYBRID_SHARD" || t == "hybrid_shard") return ShardingStrategy::HYBRID_SHARD;
  if (t == "hybrid-zero2" || t == "HYBRID_SHARD_ZERO2" || t == "hybrid_shard_zero2")
    return ShardingStrategy::HYBRID_SHARD_ZERO2;
  return std::nullopt;
}

}  // namespace fsdp::detail
