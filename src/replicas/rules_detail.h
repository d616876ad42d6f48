// fsdp-cpp: what the coordinator's registry (registry.cpp) and its rules
// (rules.cpp) share: small helpers for their messages. Internal to them.
// defines: detail::ids, detail::in, detail::seconds, detail::all_said_bye,
//          detail::differs, detail::trim
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "fsdp/errors.h"
#include "replicas/rules.h"

namespace fsdp::replicas::detail {

using fsdp::detail::cat;

inline std::string ids(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "none" : s;
}

inline bool in(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

inline double seconds(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 1000.0;
}

inline bool all_said_bye(const GroupState& g) {
  if (g.ranks.empty()) return false;
  for (const auto& [r, k] : g.ranks)
    if (!k.gone) return false;
  return true;
}

// Every identity field of `g` against the job's; "" when they agree.
inline std::string differs(const CoordState::Identity& j, const GroupState& g) {
  std::string d;
  if (j.size != g.size) d += cat("ranks per group: ", g.size, " here, ", j.size, " in group ", j.group, "; ");
  if (j.sharding != g.sharding) d += cat("sharding: ", g.sharding, " here, ", j.sharding, " in group ", j.group, "; ");
  if (j.model != g.model) d += cat("model: ", g.model, " here, ", j.model, " in group ", j.group, "; ");
  if (d.empty()) return "";
  return d + "Expected every replica group to train the same model with the same sharding and the same number of "
             "ranks; start this group like the others";
}

inline void trim(std::map<int64_t, CoordState::Known>& outcomes) {
  while (outcomes.size() > kOutcomes) outcomes.erase(outcomes.begin());
}

}  // namespace fsdp::replicas::detail
