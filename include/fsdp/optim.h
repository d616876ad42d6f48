// fsdp-cpp: optimizer parameter groups chosen by the original parameters,
// and AdamW on one fused kernel.
// defines: ParamPredicate, is_matrix, param_groups, decay_groups, FusedAdamW
//
// model->parameters() are this rank's shards: 1-D views whatever the
// original shape. The usual libtorch filter
//   for (auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
// therefore puts every parameter in no_decay, silently. Choose on the
// original name and full shape instead:
//   torch::optim::AdamWOptions base(3e-4);
//   torch::optim::AdamW opt(fsdp::decay_groups(*model, base, /*weight_decay=*/0.1), base);
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/fully_shard.h"

namespace fsdp {

// name: the unwrapped model's parameter name ("blocks.0.qkv.weight");
// full_shape: its shape before sharding.
using ParamPredicate = std::function<bool(const std::string& name, const std::vector<int64_t>& full_shape)>;

// The usual weight-decay rule: tensors of 2+ dimensions (linear weights,
// embeddings) decay; vectors (biases, norm scales) do not.
bool is_matrix(const std::string& name, const std::vector<int64_t>& full_shape);

// Two groups of this rank's shards, each in named_shards() order: first
// those `select` accepts, with a copy of `selected`; then the rest, with a
// copy of `rest`. Every rank gets the same lists (empty shards included), as
// an optimizer over FSDP shards needs.
std::vector<torch::optim::OptimizerParamGroup> param_groups(const FullyShardedModel& model,
                                                            const ParamPredicate& select,
                                                            const torch::optim::OptimizerOptions& selected,
                                                            const torch::optim::OptimizerOptions& rest);

// {decay: `opts` with weight_decay(weight_decay), no decay: `opts` with
// weight_decay(0)}; `decay` says which parameters decay (default is_matrix).
// Options: any optimizer options with weight_decay(double) (AdamW, Adam, SGD).
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> decay_groups(const FullyShardedModel& model, const Options& opts,
                                                            double weight_decay,
                                                            const ParamPredicate& decay = is_matrix) {
  Options with = opts, without = opts;
  with.weight_decay(weight_decay);
  without.weight_decay(0.0);
  return param_groups(model, decay, with, without);
}

// torch::optim::AdamW whose step runs libtorch's fused kernel
// (at::_fused_adamw_, CPU and CUDA): one kernel launch per parameter group
// over all its shards, instead of about ten per tensor, so a step over many
// small shards is not a stream of tiny kernels and host round trips. The
// same options, parameter groups and per-parameter state as AdamW (it is an
// AdamW: checkpoints, fsdp::verify_optimizer and the ledger treat it as
// one), and the same update to fp32 rounding. Not for sparse gradients, or
// parameter groups that mix devices or dtypes (one clear error).
class FusedAdamW : public torch::optim::AdamW {
 public:
  // As AdamW's: parameter groups (e.g. fsdp::decay_groups) and the defaults.
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults = {})
      : torch::optim::AdamW(std::move(groups), std::move(defaults)) {}
  // As AdamW's: one group of `params`.
  explicit FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults = {})
      : torch::optim::AdamW(std::move(params), std::move(defaults)) {}
  // One optimizer step (`closure`, when given, recomputes the loss first).
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace fsdp
