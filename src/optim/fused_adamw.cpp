// fsdp-cpp: AdamW's step on libtorch's fused kernel (see include/fsdp/optim.h).
//
// The state is AdamW's own (AdamWParamState, keyed like torch::optim's), so
// a checkpoint saved by one loads into the other. What differs is only the
// arithmetic's grouping: the fused kernel computes each element's update in
// one pass (decay, both moments, bias corrections, the step) where AdamW's
// step is a chain of tensor ops; the results agree to fp32 rounding
// (FusedAdamW.MatchesAdamWToFp32Rounding).
#include "fsdp/optim.h"

#include "compat/torch_compat.h"
#include "fsdp/errors.h"

namespace fsdp {

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode grad_on(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    // Checked before anything changes: a refused step leaves the state as it was.
    std::vector<torch::Tensor> live;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      FSDP_USER_CHECK(!p.grad().is_sparse(), "FusedAdamW: a sparse gradient; expected dense gradients. Fix: use an "
                                             "optimizer for sparse gradients (torch::optim::SGD)");
      const torch::Tensor& first = live.empty() ? p : live.front();
      FSDP_USER_CHECK(p.device() == first.device() && p.scalar_type() == first.scalar_type(),
                      "FusedAdamW: one parameter group holds tensors on ", first.device(), " (", first.scalar_type(),
                      ") and on ", p.device(), " (", p.scalar_type(),
                      "); expected one device and dtype per group (the fused kernel runs on one). Fix: split the "
                      "group, or use torch::optim::AdamW");
      live.push_back(p);
    }
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
    std::vector<double> steps;
    for (auto& p : live) {
      void* key = compat::optimizer_state_key(p);
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (o.amsgrad()) st->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(st)).first;
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      st.step(st.step() + 1);
      if (p.numel() == 0) continue;  // an empty shard: its step counts, nothing to update
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      if (o.amsgrad()) max_exp_avg_sqs.push_back(st.max_exp_avg_sq());
      steps.push_back(static_cast<double>(st.step()));
    }
    if (params.empty()) continue;
    // The kernel reads each tensor's step count from a float scalar tensor on
    // its device: one small host-to-device copy per group, no sync.
    const auto step_values = torch::tensor(steps, torch::kFloat32).to(params[0].device());
    const std::vector<torch::Tensor> state_steps = step_values.unbind(0);
    const auto [beta1, beta2] = o.betas();
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, o.lr(), beta1, beta2,
                      o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
  }
  return loss;
}

}  // namespace fsdp
