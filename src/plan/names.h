// fsdp-cpp planner: strategy names without depending on the engine (the
// planner runs where no engine is linked in, e.g. `fsdp plan` on a laptop);
// the spellings themselves are src/common/strategy_names.h, shared with it.
// defines: plan::strategy_name, plan::parse_strategy_or_auto
#pragma once

#include <optional>
#include <string>

#include "common/strategy_names.h"
#include "fsdp/errors.h"

namespace fsdp::plan {

using detail::strategy_name;

// Every spelling parse_strategy accepts, plus auto; nullopt = auto.
inline std::optional<ShardingStrategy> parse_strategy_or_auto(const std::string& t) {
  if (t == "auto") return std::nullopt;
  if (auto s = detail::strategy_from_name(t)) return s;
  throw Error("--strategy: expected full|grad-op|none|hybrid|hybrid-zero2|auto, found '" + t + "'");
}

}  // namespace fsdp::plan
