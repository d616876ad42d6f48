// fsdp-cpp planner: strategy names without depending on the engine's
// to_string / parse_strategy (the planner runs where no engine is linked in,
// e.g. `fsdp plan` on a laptop).
// defines: plan::strategy_name, plan::parse_strategy_or_auto
#pragma once

#include <optional>
#include <string>

#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"

namespace fsdp::plan {

inline const char* strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
  }
  return "?";
}

// full|grad-op|none|auto (and the enum names); nullopt = auto.
inline std::optional<ShardingStrategy> parse_strategy_or_auto(const std::string& t) {
  if (t == "auto") return std::nullopt;
  if (t == "full" || t == "FULL_SHARD") return ShardingStrategy::FULL_SHARD;
  if (t == "grad-op" || t == "SHARD_GRAD_OP") return ShardingStrategy::SHARD_GRAD_OP;
  if (t == "none" || t == "NO_SHARD") return ShardingStrategy::NO_SHARD;
  throw Error("--strategy: expected full|grad-op|none|auto, found '" + t + "'");
}

}  // namespace fsdp::plan
