// fsdp::FusedAdamW (include/fsdp/optim.h): libtorch's AdamW on one fused
// kernel per parameter group. The same update as torch::optim::AdamW to fp32
// rounding, step after step, over the cases that change its arithmetic
// (weight decay per group, amsgrad, a parameter without a gradient, an
// empty shard), on a wrapped model's shards at N = 1 and as plain tensors;
// the same state (AdamWParamState), so the checkpoint code takes it as an
// AdamW.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/optim.h"

namespace FSDP_TEST_ID {

// Parameters of odd sizes (an empty one among them), and their gradients for
// `step`: the same values in every run.
std::vector<torch::Tensor> make_params() {
  torch::manual_seed(3);
  std::vector<torch::Tensor> ps;
  for (int64_t n : {7, 1, 0, 33, 128}) ps.push_back(torch::randn({n}).requires_grad_(true));
  return ps;
}
void set_grads(std::vector<torch::Tensor>& ps, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i == 1 && step % 2 == 1) {  // a parameter that gets no gradient every other step
      ps[i].mutable_grad() = torch::Tensor();
      continue;
    }
    ps[i].mutable_grad() = torch::randn({ps[i].numel()}, gen) * (0.1 + step);
  }
}

template <class Opt>
std::vector<torch::Tensor> train(bool amsgrad, int steps) {
  auto ps = make_params();
  const auto base = torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).amsgrad(amsgrad);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{ps[0], ps[1], ps[2]},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(base).weight_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{ps[3], ps[4]},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(base).weight_decay(0.0)));
  Opt opt(std::move(groups), base);
  for (int s = 0; s < steps; ++s) {
    set_grads(ps, s);
    opt.step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : ps) out.push_back(p.detach().clone());
  // The state is AdamW's: every parameter that got a gradient has one, with
  // its own step count.
  EXPECT_EQ(opt.state().size(), ps.size());
  auto& st = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(ps[1].unsafeGetTensorImpl()));
  EXPECT_EQ(st.step(), (steps + 1) / 2) << "the parameter without a gradient every other step";
  return out;
}

double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].numel() == 0) continue;
    worst = std::max(worst, ((a[i] - b[i]).abs() / b[i].abs().clamp_min(1e-3)).max().item<double>());
  }
  return worst;
}

TEST(FusedAdamW, MatchesAdamWToFp32Rounding) {
  for (bool amsgrad : {false, true}) {
    const auto fused = train<fsdp::FusedAdamW>(amsgrad, 12);
    const auto plain = train<torch::optim::AdamW>(amsgrad, 12);
    // fp32 rounding of 12 steps of a few ops each: a few ulps, far below the
    // step size (lr 1e-2) a wrong formula would show.
    EXPECT_LT(max_rel_diff(fused, plain), 1e-5) << "amsgrad=" << amsgrad;
    const auto start = make_params();
    EXPECT_GT(max_rel_diff(plain, start), 1e-3) << "the optimizer did not move the parameters";
  }
}

// On a wrapped model's shards: the same training with either optimizer,
// clipping included, lands on the same weights to fp32 rounding, and
// verify_optimizer takes it as the shards' optimizer.
TEST(FusedAdamW, TrainsAWrappedModelAsAdamWDoes) {
  auto run = [](bool fused) {
    torch::manual_seed(5);
    auto net = torch::nn::Sequential(torch::nn::Linear(5, 9), torch::nn::Tanh(), torch::nn::Linear(9, 3));
    auto model = fsdp::fully_shard(net.ptr(), fsdp::make_local_communicator(), {});
    const auto base = torch::optim::AdamWOptions(3e-3);
    std::unique_ptr<torch::optim::AdamW> opt;
    if (fused)
      opt = std::make_unique<fsdp::FusedAdamW>(fsdp::decay_groups(*model, base, 0.1), base);
    else
      opt = std::make_unique<torch::optim::AdamW>(fsdp::decay_groups(*model, base, 0.1), base);
    fsdp::verify_optimizer(*model, *opt);
    torch::manual_seed(6);
    for (int s = 0; s < 8; ++s) {
      auto x = torch::randn({4, 5}), y = torch::randn({4, 3});
      opt->zero_grad();
      (model.forward(x) - y).pow(2).mean().backward();
      model->clip_grad_norm(0.5);
      opt->step();
    }
    std::vector<torch::Tensor> out;
    for (auto& [name, t] : model->full_state(-1)) out.push_back(t.reshape(-1));
    return out;
  };
  EXPECT_LT(max_rel_diff(run(true), run(false)), 1e-5);
}

TEST(FusedAdamW, AGroupOverTwoDtypesIsOneError) {
  auto a = torch::zeros({3}, torch::kFloat32).requires_grad_(true);
  auto b = torch::zeros({3}, torch::kFloat64).requires_grad_(true);
  fsdp::FusedAdamW opt(std::vector<torch::Tensor>{a, b}, torch::optim::AdamWOptions(1e-3));
  a.mutable_grad() = torch::ones({3});
  b.mutable_grad() = torch::ones({3}, torch::kFloat64);
  try {
    opt.step();
    FAIL() << "a group over float and double was stepped";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected one device and dtype per group"), std::string::npos) << e.what();
  }
}

}  // namespace FSDP_TEST_ID
