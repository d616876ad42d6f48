// Activation checkpointing, i.e. recomputation (FsdpOptions::recompute,
// src/unit/recompute.cpp):
// the same training with and without it, bit for bit, across strategies x
// {plain, no_sync, bf16} x prefetch, with dropout, tied weights, tensor and
// non-tensor arguments through fsdp::call, a Sequential's child and a
// checkpointed module around checkpointed units (tests/workers/ac_scenarios.cpp); the collectives of every step equal to
// those without it (one all-gather for a unit's recompute and backward);
// what it saves (the ledger's measured A) and the planner's prediction of
// the peak with --ac block (tests/test_plan_accuracy.cpp measures those on
// GPT-mini); misuse that it explains.
#include <gtest/gtest.h>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

// ---------------------------------------------------------------- parity
using AcParam = std::tuple<int, std::string, std::string, std::string, std::string>;  // N, strategy, mode, dtype, prefetch
class AcParity : public ::testing::TestWithParam<AcParam> {};

TEST_P(AcParity, BitwiseEqualToNoCheckpointing) {
  auto [n, strategy, mode, dtype, prefetch] = GetParam();
  auto r = run_ranks(n, "ac_parity", {strategy, mode, dtype, prefetch});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = lines_with(r.output, "ACPARITY");
  ASSERT_EQ(static_cast<int>(lines.size()), n) << r.output;
  for (auto& l : lines) {
    Fields f(l);
    EXPECT_EQ(f["loss_equal"], 1) << l;
    EXPECT_EQ(f["grads_equal"], 1) << l;
    EXPECT_EQ(f["params_equal"], 1) << l;
    // The same collectives, step by step, and FULL_SHARD's all-gathers are
    // 2 per unit and micro-step: the recompute gathers nothing of its own.
    EXPECT_EQ(f["comm_equal"], 1) << l;
    EXPECT_EQ(f["ag_calls"], f["ag_expected"]) << l;
    // Checkpointing saved activations (the blocks keep their inputs only)
    // and recomputed them in backward.
    EXPECT_LT(f["a_ac"], f["a_plain"]) << l;
    EXPECT_GT(f["a_recompute"], 0) << l;
    EXPECT_NE(l.find("checkpointed=blocks.0,blocks.1,blocks.2,stage,stage.a,stage.b,tail.0"), std::string::npos) << l;
  }
}

std::string ac_name(const ::testing::TestParamInfo<AcParam>& info) {
  auto s = std::get<1>(info.param);
  for (auto& c : s)
    if (c == '-') c = '_';
  return "N" + std::to_string(std::get<0>(info.param)) + "_" + s + "_" + std::get<2>(info.param) + "_" +
         std::get<3>(info.param) + "_" + std::get<4>(info.param);
}

INSTANTIATE_TEST_SUITE_P(Grid, AcParity,
                         ::testing::Combine(::testing::Values(2), ::testing::Values("full", "grad-op", "none"),
                                            ::testing::Values("plain", "nosync"), ::testing::Values("fp32", "bf16"),
                                            ::testing::Values("none")),
                         ac_name);
INSTANTIATE_TEST_SUITE_P(Prefetch, AcParity,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values("full", "grad-op"),
                                            ::testing::Values("nosync"), ::testing::Values("fp32"),
                                            ::testing::Values("fwd")),
                         ac_name);
// HYBRID_SHARD and HYBRID_SHARD_ZERO2: 2 shard groups of 2 ranks.
INSTANTIATE_TEST_SUITE_P(Hybrid, AcParity,
                         ::testing::Combine(::testing::Values(4), ::testing::Values("hybrid", "hybrid-zero2"),
                                            ::testing::Values("plain", "nosync"), ::testing::Values("fp32"),
                                            ::testing::Values("none")),
                         ac_name);
INSTANTIATE_TEST_SUITE_P(OneRank, AcParity,
                         ::testing::Combine(::testing::Values(1), ::testing::Values("full"), ::testing::Values("plain"),
                                            ::testing::Values("fp32"), ::testing::Values("fwd")),
                         ac_name);

// ---------------------------------------------------------------- misuse

// A checkpointed module computing on a tensor that requires grad but is
// neither its parameter nor its argument: its gradient could not leave the
// recompute, so backward says so (instead of losing it).
struct LeakyImpl : torch::nn::Module {
  torch::Tensor outside;  // not registered
  explicit LeakyImpl(torch::Tensor t) : outside(std::move(t)) { register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(const torch::Tensor& x) { return x * outside; }
};
TORCH_MODULE(Leaky);

struct HolderImpl : torch::nn::Module {
  Leaky leaky{nullptr};
  torch::Tensor w;
  HolderImpl() {
    w = register_parameter("w", torch::ones({4}));
    leaky = register_module("leaky", Leaky(w));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fsdp::call(leaky, x).sum(); }
};
TORCH_MODULE(Holder);

TEST(AcMisuse, ForeignLeafIsExplained) {
  FSDP_IN_RANKS(1);
  auto comm = make_communicator_from_env();
  FsdpOptions o;
  o.recompute = RecomputePolicy::module_type<LeakyImpl>("Leaky");
  Holder net;
  auto model = fully_shard(net, comm, o);
  ASSERT_EQ(model->recomputed(), std::vector<std::string>{"leaky"});
  auto loss = model.forward(torch::ones({2, 4}));
  try {
    loss.backward();
    FAIL() << "expected an fsdp::Error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("activation checkpointing of 'leaky'"), std::string::npos) << what;
    EXPECT_NE(what.find("'w'"), std::string::npos) << what;
    EXPECT_NE(what.find("register"), std::string::npos) << what;
  }
}

TEST(AcMisuse, EveryMustBePositive) {
  FSDP_IN_RANKS(1);
  auto comm = make_communicator_from_env();
  FsdpOptions o;
  o.recompute = RecomputePolicy::every_kth<LeakyImpl>(0, "Leaky");
  Holder net;
  try {
    fully_shard(net, comm, o);
    FAIL() << "expected an fsdp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recompute.every must be >= 1"), std::string::npos) << e.what();
  }
}

// Evaluation (no grad) runs the module plainly; every_kth picks the 1st,
// (k+1)-th, ... of the selected modules.
TEST(AcPolicy, EveryKthAndNoGrad) {
  FSDP_IN_RANKS(1);
  auto comm = make_communicator_from_env();
  torch::nn::Sequential seq;
  for (int i = 0; i < 5; ++i) seq->push_back(torch::nn::Linear(3, 3));
  FsdpOptions o;
  o.recompute = RecomputePolicy::every_kth<torch::nn::LinearImpl>(2, "Linear");
  auto model = fully_shard(seq, comm, o);
  EXPECT_EQ(model->recomputed(), (std::vector<std::string>{"0", "2", "4"}));
  torch::NoGradGuard ng;
  auto y = model.forward(torch::ones({2, 3}));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(model->ledger().A_recompute, 0);
}

// torch::autograd::grad through checkpointed modules: the gradient w.r.t.
// the input, bit for bit as without checkpointing.
TEST(AcPolicy, AutogradGradWithRespectToTheInput) {
  FSDP_IN_RANKS(1);
  auto comm = make_communicator_from_env();
  std::vector<torch::Tensor> dx;
  for (bool ac : {false, true}) {
    torch::manual_seed(7);
    torch::nn::Sequential seq(torch::nn::Linear(6, 6), torch::nn::Tanh(), torch::nn::Linear(6, 6), torch::nn::Tanh(),
                              torch::nn::Linear(6, 2));
    FsdpOptions o;
    o.wrap = WrapPolicy::module_type<torch::nn::LinearImpl>("Linear");
    if (ac) o.recompute = RecomputePolicy::module_type<torch::nn::LinearImpl>("Linear");
    auto model = fully_shard(seq, comm, o);
    auto x = torch::randn({3, 6}).requires_grad_(true);
    auto y = model.forward(x).pow(2).sum();
    dx.push_back(torch::autograd::grad({y}, {x})[0]);
  }
  EXPECT_TRUE(torch::equal(dx[0], dx[1]));
}

// FsdpOptions::checkpoint and CheckpointPolicy, the former names of
// FsdpOptions::recompute and RecomputePolicy, still work for one release:
// the old field alone selects and recomputes the same modules, with the
// same gradients; both fields set to different policies is one clear error,
// raised before the model is touched (it can be wrapped right after).
// Keeping the old field keeps FsdpOptions an aggregate (designated
// initializers), and copying options does not warn.
static_assert(std::is_aggregate_v<FsdpOptions>, "FsdpOptions takes designated initializers");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST(AcPolicy, DeprecatedCheckpointFieldStillHonoured) {
  {
    const FsdpOptions designated{.strategy = ShardingStrategy::NO_SHARD, .shard_group_size = 0};
    const FsdpOptions copy = designated;
    EXPECT_EQ(copy.strategy, ShardingStrategy::NO_SHARD);
  }
  FSDP_IN_RANKS(1);
  auto comm = make_communicator_from_env();
  auto make_seq = [] {
    torch::manual_seed(11);
    torch::nn::Sequential seq;
    for (int i = 0; i < 5; ++i) seq->push_back(torch::nn::Linear(3, 3));
    return seq;
  };
  std::vector<std::vector<std::string>> selected;
  std::vector<torch::Tensor> dx;
  for (bool old_field : {false, true}) {
    auto seq = make_seq();
    FsdpOptions o;
    if (old_field)
      o.checkpoint = CheckpointPolicy::every_kth<torch::nn::LinearImpl>(2, "Linear");
    else
      o.recompute = RecomputePolicy::every_kth<torch::nn::LinearImpl>(2, "Linear");
    auto model = fully_shard(seq, comm, o);
    selected.push_back(model->recomputed());
    EXPECT_EQ(model->checkpointed(), model->recomputed());
    EXPECT_EQ(model->options().recompute.every, 2);  // the old field, adopted
    auto x = torch::randn({2, 3}).requires_grad_(true);
    auto y = model.forward(x).pow(2).sum();
    dx.push_back(torch::autograd::grad({y}, {x})[0]);
  }
  EXPECT_EQ(selected[0], (std::vector<std::string>{"0", "2", "4"}));
  EXPECT_EQ(selected[1], selected[0]);
  EXPECT_TRUE(torch::equal(dx[0], dx[1]));

  // Both set to the same policy: no conflict.
  {
    auto seq = make_seq();
    FsdpOptions o;
    o.recompute = RecomputePolicy::every_kth<torch::nn::LinearImpl>(2, "Linear");
    o.checkpoint = o.recompute;
    EXPECT_EQ(fully_shard(seq, comm, o)->recomputed(), (std::vector<std::string>{"0", "2", "4"}));
  }
  // Both set, to different policies: the error names both fields and the fix.
  auto seq = make_seq();
  FsdpOptions o;
  o.recompute = RecomputePolicy::every_kth<torch::nn::LinearImpl>(2, "Linear");
  o.checkpoint = CheckpointPolicy::module_type<torch::nn::LinearImpl>("Linear");
  EXPECT_THROW(o.validate(), Error);
  try {
    fully_shard(seq, comm, o);
    FAIL() << "expected an fsdp::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("FsdpOptions.checkpoint (deprecated: renamed FsdpOptions.recompute)"), std::string::npos)
        << what;
    EXPECT_NE(what.find("different policies"), std::string::npos) << what;
    EXPECT_NE(what.find("'every 2th Linear'"), std::string::npos) << what;
    EXPECT_NE(what.find("'every Linear'"), std::string::npos) << what;
    EXPECT_NE(what.find("Fix: set FsdpOptions.recompute"), std::string::npos) << what;
  }
  // Validated before anything was registered: the same module wraps now.
  o.checkpoint = RecomputePolicy::none();
  EXPECT_EQ(fully_shard(seq, comm, o)->recomputed(), (std::vector<std::string>{"0", "2", "4"}));
}
#pragma GCC diagnostic pop

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
