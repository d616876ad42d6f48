// GPT-mini under FSDP equals GPT-mini without it: a small GPT (2 layers, d=64)
// trains 3 steps (2 micro-steps each, clipping, AdamW with decay groups) at
// N = 1, 2, 3 under each strategy; the final parameters equal those of the
// N=1 run and of a plain libtorch run (1e-5 relative). The rank side is
// tests/workers/gpt_scenarios.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "fsdp/checkpoint.h"
#include "test_util.h"

using fsdp::testing::bin_path;

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

std::map<std::string, torch::Tensor> read_all(const std::string& path) {
  fsdp::ckpt::SafetensorsReader r(path);
  std::map<std::string, torch::Tensor> out;
  for (auto& e : r.entries()) out[e.name] = r.read_all(e.name).reshape(e.shape);
  return out;
}

// 3 steps of AdamW at lr 1e-3 move an element by at most ~3e-3 (+ decay).
constexpr double kAdamBound = 2 * 3 * 1e-3;

// Largest ||a - b|| / ||b|| over the tensors; names must match.
double max_rel_diff(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b,
                    std::string* worst) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (auto& [name, tb] : b) {
    auto it = a.find(name);
    if (it == a.end()) {
      ADD_FAILURE() << "missing tensor " << name;
      continue;
    }
    EXPECT_EQ(it->second.sizes(), tb.sizes()) << name;
    torch::Tensor x = it->second.to(torch::kDouble), y = tb.to(torch::kDouble);
    if (name.size() >= 8 && name.compare(name.size() - 8, 8, "qkv.bias") == 0) {
      // The key bias has a gradient of exactly zero in exact arithmetic (it
      // adds the same q.b_k to every score of a softmax row), so its float
      // gradient is rounding noise that AdamW scales up to +-lr per step: it
      // differs between any two summation orders. Bound it by Adam's step
      // size, compare the query and value thirds exactly.
      const int64_t d = y.numel() / 3;
      EXPECT_LE((x.narrow(0, d, d) - y.narrow(0, d, d)).abs().max().item<double>(), kAdamBound) << name;
      x = torch::cat({x.narrow(0, 0, d), x.narrow(0, 2 * d, d)});
      y = torch::cat({y.narrow(0, 0, d), y.narrow(0, 2 * d, d)});
    }
    const double d = (x - y).norm().item<double>() / std::max(y.norm().item<double>(), 1e-30);
    if (d > m) m = d, *worst = name;
  }
  return m;
}

class GptParity : public ::testing::TestWithParam<std::string> {};

// `env` goes to every rank (e.g. FSDP_TRANSPORT).
static void expect_gpt_parity(const std::string& strategy, const std::vector<std::string>& env) {
  const fs::path dir = fsdp::testing::temp_dir("gpt-parity-" + strategy);

  const std::string ref_file = (dir / "reference.safetensors").string();
  auto ref = fsdp::testing::run_command({bin_path("fsdp_test_worker"), "gpt_reference", ref_file});
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto reference = read_all(ref_file);

  std::map<std::string, torch::Tensor> n1;
  for (int n : {1, 2, 3}) {
    const std::string file = (dir / ("n" + std::to_string(n) + ".safetensors")).string();
    auto r = fsdp::testing::run_ranks(n, "gpt_parity", {strategy, file}, env);
    ASSERT_EQ(r.exit_code, 0) << "N=" << n << "\n" << r.output;
    // The same losses as the reference, step by step.
    auto got = fsdp::testing::lines_with(r.output, "loss ");
    auto want = fsdp::testing::lines_with(ref.output, "loss ");
    ASSERT_FALSE(want.empty()) << ref.output;
    ASSERT_EQ(got.size(), want.size()) << r.output;
    for (size_t i = 0; i < got.size(); i++) {
      const double g = std::stod(got[i].substr(got[i].rfind(' ') + 1));
      const double w = std::stod(want[i].substr(want[i].rfind(' ') + 1));
      EXPECT_NEAR(g, w, 1e-5 * std::abs(w)) << "N=" << n << " step " << i;
    }
    const auto params = read_all(file);
    std::string worst;
    const double d_ref = max_rel_diff(params, reference, &worst);
    EXPECT_LT(d_ref, 1e-5) << strategy << " N=" << n << " vs plain libtorch, worst " << worst;
    if (n == 1) {
      n1 = params;
    } else {
      const double d1 = max_rel_diff(params, n1, &worst);
      EXPECT_LT(d1, 1e-5) << strategy << " N=" << n << " vs N=1, worst " << worst;
    }
  }
  fs::remove_all(dir);
}

TEST_P(GptParity, WorldSizesOneTwoThreeMatchThePlainModel) { expect_gpt_parity(GetParam(), {}); }

// Over each same-host transport explicitly (the default, auto, is cma where
// the host allows it).
TEST(GptParityTransport, FullShardOverTcp) { expect_gpt_parity("full", {"FSDP_TRANSPORT=tcp"}); }
TEST(GptParityTransport, FullShardOverCma) {
  if (!fsdp::testing::cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  expect_gpt_parity("full", {"FSDP_TRANSPORT=cma"});
}

INSTANTIATE_TEST_SUITE_P(Strategies, GptParity, ::testing::Values("full", "grad-op", "none"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// HYBRID_SHARD and HYBRID_SHARD_ZERO2 at 2 x 2 (two `fsdp run --nnodes 2`
// launchers, one simulated host each, shard group = LOCAL_WORLD_SIZE = 2)
// give the parameters of FULL_SHARD at N = 4 and of plain libtorch on the
// whole batch (4 rows per micro-step), 1e-5 relative, and the same losses.
TEST(GptParityHybrid, TwoByTwoMatchesFullShardAndThePlainModel) {
  const fs::path dir = fsdp::testing::temp_dir("gpt-hybrid");
  const std::string ref_file = (dir / "reference.safetensors").string();
  auto ref = fsdp::testing::run_command({bin_path("fsdp_test_worker"), "gpt_reference", ref_file, "4"});
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto reference = read_all(ref_file);
  const auto want = fsdp::testing::lines_with(ref.output, "loss ");
  ASSERT_EQ(want.size(), 3u) << ref.output;

  const std::string full_file = (dir / "full4.safetensors").string();
  auto full = fsdp::testing::run_ranks(4, "gpt_parity", {"full", full_file, "4"});
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto full4 = read_all(full_file);
  for (std::string strategy : {"hybrid", "hybrid-zero2"}) {
    const std::string file = (dir / (strategy + ".safetensors")).string();
    auto r = fsdp::testing::run_two_nodes({"gpt_parity", strategy, file, "4"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto got = fsdp::testing::lines_with(r.output, "loss ");
    ASSERT_EQ(got.size(), want.size()) << r.output;
    for (size_t i = 0; i < got.size(); i++) {
      const double g = std::stod(got[i].substr(got[i].rfind(' ') + 1));
      const double w = std::stod(want[i].substr(want[i].rfind(' ') + 1));
      EXPECT_NEAR(g, w, 1e-5 * std::abs(w)) << strategy << " step " << i;
    }
    const auto params = read_all(file);
    std::string worst;
    EXPECT_LT(max_rel_diff(params, reference, &worst), 1e-5) << strategy << " vs plain libtorch, worst " << worst;
    EXPECT_LT(max_rel_diff(params, full4, &worst), 1e-5) << strategy << " vs FULL_SHARD N=4, worst " << worst;
  }
  fs::remove_all(dir);
}

}  // namespace FSDP_TEST_ID
