// GPT-mini: names, shapes, count, causality, and a cross-check against
// PyTorch (tests/python/gpt_reference.py) on the same weights and tokens.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "fsdp/checkpoint.h"
#include "usage.h"
#include "fsdp/optim.h"
#include "test_util.h"
#include "gpt/model.h"

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

// docs/GPT_MINI.md's list, in state dict order.
std::vector<std::pair<std::string, std::vector<int64_t>>> spec_params(const gpt::Config& c) {
  const int64_t V = c.vocab, T = c.seq, d = c.dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> p = {{"tok.weight", {V, d}}, {"pos.weight", {T, d}}};
  for (int64_t i = 0; i < c.layers; i++) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    p.insert(p.end(), {{b + "ln1.weight", {d}},
                       {b + "ln1.bias", {d}},
                       {b + "qkv.weight", {3 * d, d}},
                       {b + "qkv.bias", {3 * d}},
                       {b + "proj.weight", {d, d}},
                       {b + "proj.bias", {d}},
                       {b + "ln2.weight", {d}},
                       {b + "ln2.bias", {d}},
                       {b + "fc.weight", {4 * d, d}},
                       {b + "fc.bias", {4 * d}},
                       {b + "out.weight", {d, 4 * d}},
                       {b + "out.bias", {d}}});
  }
  p.insert(p.end(), {{"ln.weight", {d}}, {"ln.bias", {d}}, {"head.weight", {V, d}}, {"head.bias", {V}}});
  return p;
}

// The Python with torch: the build's (testing::torch_python()).
std::string python_with_torch() {
  const std::string py = fsdp::testing::torch_python();
  auto r = fsdp::testing::run_command({py, "-c", "import torch"}, {}, 60);
  return r.exit_code == 0 ? py : "";
}

TEST(GptModel, ParameterNamesAndShapesFollowTheSpec) {
  gpt::Config cfg;  // the benchmark size
  gpt::GPT m(cfg);
  auto want = spec_params(cfg);
  auto got = m->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  int64_t total = 0;
  for (size_t i = 0; i < want.size(); i++) {
    EXPECT_EQ(got[i].key(), want[i].first);
    EXPECT_EQ(got[i].value().sizes().vec(), want[i].second) << want[i].first;
    total += got[i].value().numel();
  }
  EXPECT_EQ(total, 4903168);  // "about 4.90 M parameters"
  EXPECT_EQ(cfg.num_params(), total);
  EXPECT_TRUE(m->named_buffers().is_empty());  // the state dict is exactly the parameters
  EXPECT_NE(cfg.str().find("4.90 M"), std::string::npos) << cfg.str();
}

// The gpt trainer's optimizer groups come from fsdp::decay_groups; they must
// be the groups its own rule made before (full_shape of 2 dimensions: the
// embeddings and Linear weights of docs/GPT_MINI.md's list), tensor for
// tensor and in order.
TEST(GptModel, DecayGroupsAreTheSpecsTwoDimensionalWeights) {
  gpt::Config cfg{256, 16, 32, 2, 4};
  gpt::GPT net(cfg);
  fsdp::FsdpOptions o;
  o.wrap = fsdp::WrapPolicy::module_type<gpt::BlockImpl>("Block");
  auto model = fsdp::fully_shard(net, fsdp::make_local_communicator(), o);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& s : model->named_shards()) (s.full_shape.size() == 2 ? decay : no_decay).push_back(s.tensor);
  auto groups = fsdp::decay_groups(*model, torch::optim::AdamWOptions(1e-3), 0.1);
  ASSERT_EQ(groups.size(), 2u);
  auto same = [](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++)
      if (!a[i].is_same(b[i])) return false;
    return true;
  };
  EXPECT_TRUE(same(groups[0].params(), decay));
  EXPECT_TRUE(same(groups[1].params(), no_decay));
  size_t spec_2d = 0;
  for (auto& [name, shape] : spec_params(cfg)) spec_2d += shape.size() == 2;
  EXPECT_EQ(decay.size(), spec_2d);
  EXPECT_EQ(spec_2d, 2u + 4u * 2u + 1u);  // tok, pos; qkv, proj, fc, out per block; head
}

TEST(GptModel, NumParamsMatchesOtherSizes) {
  for (gpt::Config c : {gpt::Config{256, 32, 64, 2, 4}, gpt::Config{100, 7, 12, 3, 3}, gpt::Config{256, 8, 8, 0, 1}}) {
    gpt::GPT m(c);
    int64_t n = 0;
    for (auto& p : m->parameters()) n += p.numel();
    EXPECT_EQ(c.num_params(), n) << c.str();
  }
}

TEST(GptModel, ConfigErrorsNameTheFlag) {
  gpt::Config c;
  c.dim = 30;  // not divisible by 4 heads
  try {
    c.validate();
    FAIL() << "expected a UsageError";
  } catch (const fsdp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--dim (30) must be divisible by --heads (4)"), std::string::npos)
        << e.what();
  }
  c = gpt::Config{};
  c.vocab = 70000;
  EXPECT_THROW(c.validate(), fsdp::UsageError);
}

TEST(GptModel, ForwardShapesAndCausality) {
  torch::manual_seed(0);
  gpt::Config cfg{256, 16, 32, 2, 4};
  gpt::GPT m(cfg);
  auto idx = torch::randint(0, 256, {2, 16}, torch::kLong);  // [B,T]
  auto logits = m->forward(idx);
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 16, 256}));
  // Changing token 10 changes no logit before position 10.
  auto idx2 = idx.clone();
  idx2[0][10] = (idx[0][10].item<int64_t>() + 1) % 256;
  auto logits2 = m->forward(idx2);
  EXPECT_TRUE(torch::allclose(logits.narrow(1, 0, 10), logits2.narrow(1, 0, 10), 0, 0));
  EXPECT_FALSE(torch::allclose(logits.narrow(1, 10, 6), logits2.narrow(1, 10, 6)));
  // Shorter contexts use the first positions (generation), longer ones fail clearly.
  auto short_logits = m->forward(idx.narrow(1, 0, 5));
  EXPECT_TRUE(torch::allclose(short_logits, logits.narrow(1, 0, 5), 1e-5, 1e-6));
  EXPECT_THROW(m->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);
}

TEST(GptModel, InitialLossIsNearUniform) {
  torch::manual_seed(1);
  gpt::Config cfg{256, 32, 64, 2, 4};
  gpt::GPT m(cfg);
  auto idx = torch::randint(0, 256, {4, 32}, torch::kLong);
  const double l = gpt::loss(m->forward(idx), torch::randint(0, 256, {4, 32}, torch::kLong)).item<double>();
  EXPECT_NEAR(l, std::log(256.0), 0.6);
}

// Same weights, same tokens: the PyTorch model (float64) gives the same loss
// within 1e-5 and the same gradients.
TEST(GptModel, MatchesPyTorch) {
  const std::string py = python_with_torch();
  if (py.empty()) GTEST_SKIP() << "no python3 with torch (set FSDP_PYTHON; `make deps` installs the project's)";
  torch::manual_seed(42);
  gpt::Config cfg{256, 16, 32, 2, 4};
  gpt::GPT m(cfg);
  // Nudge LayerNorm and biases off their 1/0 init so every term is exercised.
  {
    torch::NoGradGuard g;
    for (auto& p : m->named_parameters())
      if (p.value().dim() == 1) p.value().add_(torch::randn_like(p.value()) * 0.1);
  }
  auto idx = torch::randint(0, 256, {3, 16}, torch::kLong);      // [B,T]
  auto targets = torch::randint(0, 256, {3, 16}, torch::kLong);  // [B,T]
  auto loss = gpt::loss(m->forward(idx), targets);
  loss.backward();

  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& p : m->named_parameters()) tensors.push_back({p.key(), p.value().detach()});
  for (auto& p : m->named_parameters()) tensors.push_back({"grad." + p.key(), p.value().grad()});
  tensors.push_back({"__tokens__", idx});
  tensors.push_back({"__targets__", targets});
  tensors.push_back({"__config__", torch::tensor({cfg.vocab, cfg.seq, cfg.dim, cfg.layers, cfg.heads})});
  std::vector<fsdp::ckpt::TensorSpec> specs;
  for (auto& [name, t] : tensors) specs.push_back({name, t.sizes().vec(), t.scalar_type()});
  const fs::path dir = fsdp::testing::temp_dir("gpt-ref");
  const std::string file = (dir / "gpt.safetensors").string();
  size_t next = 0;
  fsdp::ckpt::write_full_safetensors(file, specs, [&](const fsdp::ckpt::TensorSpec&) {
    return tensors[next++].second;
  });

  auto r = fsdp::testing::run_command({py, fsdp::testing::source_path("tests/python/gpt_reference.py"), file}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  double py_loss = NAN, grad_err = NAN;
  std::istringstream is(r.output);
  std::string key;
  double v;
  while (is >> key >> v) {
    if (key == "loss") py_loss = v;
    if (key == "max_grad_rel_err") grad_err = v;
  }
  EXPECT_NEAR(loss.item<double>(), py_loss, 1e-5) << r.output;
  EXPECT_LT(grad_err, 1e-4) << r.output;
  fs::remove_all(dir);
}

}  // namespace FSDP_TEST_ID
