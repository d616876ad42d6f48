// fsdp-cpp: the options of fully_shard — their names, their checks, and the
// deprecated field folded into its successor.
//
// defines: to_string(ShardingStrategy), parse_strategy, to_string(BackwardPrefetch),
//          FsdpOptions::validate, detail::adopt_deprecated_checkpoint
#include "common/strategy_names.h"
#include "unit/engine.h"

namespace fsdp {

const char* to_string(ShardingStrategy s) { return detail::strategy_name(s); }

ShardingStrategy parse_strategy(const std::string& t) {
  if (auto s = detail::strategy_from_name(t)) return *s;
  throw Error("unknown sharding strategy '" + t + "': expected full, grad-op, none, hybrid or hybrid-zero2");
}

const char* to_string(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::NONE: return "none";
    case BackwardPrefetch::BACKWARD_PRE: return "pre";
    case BackwardPrefetch::BACKWARD_POST: return "post";
  }
  return "?";
}

void FsdpOptions::validate() const {
  if (!device.is_cpu() && !device.is_cuda())
    throw Error("FsdpOptions.device is " + device.str() + "; expected cpu or cuda:K (a CUDA device)");
  if (limit_all_gathers < 1)
    throw Error("FsdpOptions.limit_all_gathers must be >= 1 (units unsharded at once), found " +
                std::to_string(limit_all_gathers));
  auto ok_float = [](const c10::optional<torch::ScalarType>& t, const char* what) {
    if (t && !(*t == torch::kFloat32 || *t == torch::kBFloat16 || *t == torch::kFloat16))
      throw Error(std::string("FsdpOptions.mixed_precision.") + what +
                  " must be float32, bfloat16 or float16, found " + c10::toString(*t));
  };
  ok_float(mixed_precision.param_dtype, "param_dtype");
  ok_float(mixed_precision.reduce_dtype, "reduce_dtype");
  ok_float(mixed_precision.buffer_dtype, "buffer_dtype");
  if (shard_group_size < 0)
    throw Error("FsdpOptions.shard_group_size must be >= 0 (0: the ranks of one host), found " +
                std::to_string(shard_group_size));
  const RecomputePolicy recompute_policy = detail::adopt_deprecated_checkpoint(*this).recompute;
  if (recompute_policy.enabled() && recompute_policy.every < 1)
    throw Error("FsdpOptions.recompute.every must be >= 1 (recompute every k-th selected module), found " +
                std::to_string(recompute_policy.every));
}

namespace detail {
namespace {

// Whether `p` differs from RecomputePolicy::none().
bool is_set(const RecomputePolicy& p) {
  return p.enabled() || p.every != 1 || p.description != RecomputePolicy::none().description;
}

// Whether two policies select the same modules, as far as can be told: a
// std::function cannot be compared, so its target's type stands for it.
bool same_policy(const RecomputePolicy& a, const RecomputePolicy& b) {
  return a.every == b.every && a.description == b.description && a.fn.target_type() == b.fn.target_type();
}

std::string describe(const RecomputePolicy& p) {
  return "'" + p.description + "' (every " + std::to_string(p.every) + (p.enabled() ? "" : ", no predicate") + ")";
}

}  // namespace

FsdpOptions adopt_deprecated_checkpoint(FsdpOptions o) {
  RecomputePolicy& old = o.checkpoint;  // renamed FsdpOptions::recompute; honoured for one release
  if (is_set(old)) {
    if (!is_set(o.recompute))
      o.recompute = old;
    else if (!same_policy(old, o.recompute))
      throw Error("FsdpOptions.checkpoint (deprecated: renamed FsdpOptions.recompute) and FsdpOptions.recompute "
                  "are both set, to different policies: checkpoint = " + describe(old) + ", recompute = " +
                  describe(o.recompute) + ". Expected: the policy in FsdpOptions.recompute only. Fix: set "
                  "FsdpOptions.recompute and leave FsdpOptions.checkpoint at its default.");
  }
  old = RecomputePolicy::none();
  return o;
}

}  // namespace detail

}  // namespace fsdp
