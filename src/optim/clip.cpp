// fsdp-cpp: global-norm gradient clipping over the shards — the optimizer
// stage's one collective.
//
// defines: FullyShardedModel::clip_grad_norm
//
// Each rank holds 1/N of every gradient (NO_SHARD: all of it), so the norm
// is the shards' sums of squares (max) summed (maxed) over the shard group:
// one all-reduce, and one read of the result on the host.
#include <cmath>

#include "unit/engine.h"

namespace fsdp {

double FullyShardedModel::clip_grad_norm(double max_norm, double norm_type) {
  FSDP_USER_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, found ", max_norm);
  FSDP_USER_CHECK(norm_type == 2.0 || std::isinf(norm_type),
                  "clip_grad_norm: norm_type must be 2 or infinity, found ", norm_type);
  engine_->wait_pending();
  FSDP_TRACE_SPAN("clip_grad_norm", "optim");
  torch::NoGradGuard ng;
  const bool replicated = engine_->opts.strategy == ShardingStrategy::NO_SHARD;
  const bool inf = std::isinf(norm_type);
  // On the shards' device, with no host sync per unit: each unit's sum of
  // squares (max) in fp32, accumulated in fp64 in unit order (the same
  // additions the host did before, so the same bits), one all-reduce over
  // the group, and one read of the result.
  const auto f64 = torch::TensorOptions(torch::kFloat64).device(engine_->opts.device);
  torch::Tensor local = torch::zeros({}, f64);
  for (auto& u : engine_->units) {
    if (!u->shard_grad.defined()) continue;
    const auto& g = u->shard_grad;
    local = inf ? torch::maximum(local, g.abs().max().to(torch::kFloat64)) : local + g.pow(2).sum().to(torch::kFloat64);
  }
  double total = 0;
  // Over the shard group: HYBRID's replicas hold the same shards (their
  // gradients all-reduced), so summing over all N ranks would count each
  // element R times; every group computes the same norm.
  Communicator& group = *engine_->shard_comm;
  if (!replicated && group.world_size() > 1) {
    auto in = local.to(torch::kFloat32).reshape({1});
    if (inf) {
      auto all = torch::empty({group.world_size()}, in.options());
      group.all_gather(in, all, {"clip_grad_norm"})->wait();
      total = all.max().item<double>();
    } else {
      group.all_reduce(in, ReduceOp::SUM, {"clip_grad_norm"})->wait();
      total = in.item<double>();
    }
  } else {
    total = local.item<double>();
  }
  double norm = inf ? total : std::sqrt(total);
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (auto& u : engine_->units)
      if (u->shard_grad.defined()) u->shard_grad.mul_(coef);
  return norm;
}

}  // namespace fsdp
