// Tests of the public API's contracts a training program relies on: the
// planner header needs no torch, every library error is an fsdp::Error, and
// the helpers for parameter groups and the logged loss (multi-rank, with
// the assertions inside each rank).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <type_traits>

#include "core_model.h"
#include "fsdp/fsdp.h"
#include "fsdp/plan.h"
#include "test_util.h"
#include "usage.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

// ---------------------------------------------------------------- headers
// A program that only plans (a laptop, a scheduler) includes fsdp/plan.h
// without libtorch. Compiled here with nothing but the standard include path
// and include/: torch's headers are not on it, so an include of them fails.
TEST(PublicHeaders, PlanNeedsOnlyTheStandardLibrary) {
  const char* cxx_env = std::getenv("CXX");
  const std::string cxx = cxx_env && *cxx_env ? cxx_env : "c++";
  if (run_command({"/bin/sh", "-c", "command -v '" + cxx + "'"}).exit_code != 0)
    GTEST_SKIP() << "no C++ compiler '" << cxx << "' on PATH";
  const std::string dir = ::testing::TempDir();
  const std::string src = dir + "/plan_header_only.cpp";
  std::ofstream(src) << "#include \"fsdp/plan.h\"\n"
                        "#if defined(TORCH_CHECK) || defined(C10_API) || defined(AT_ERROR)\n"
                        "#error fsdp/plan.h pulled in torch\n"
                        "#endif\n"
                        "int main() {\n"
                        "  fsdp::plan::PlanOptions o;\n"
                        "  o.world = 2;\n"
                        "  auto p = fsdp::plan::make_plan({{\"\", 1000}}, 0, o);\n"
                        "  return p.units.size() == 1 ? 0 : 1;\n"
                        "}\n";
  // Through the shell: run_command does not search PATH.
  auto r = run_command(
      {"/bin/sh", "-c", "'" + cxx + "' -std=c++17 -fsyntax-only -I '" + source_path("include") + "' '" + src + "'"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::remove(src.c_str());
}

// ---------------------------------------------------------------- construction
// A wrap that fails (bad options found late used to leave the units in the
// process's table, pointing at freed memory) leaves nothing behind: the same
// module then wraps and trains.
TEST(Construction, AFailedWrapLeavesNothingBehind) {
  auto comm = make_local_communicator();
  torch::manual_seed(3);
  Net net;
  FsdpOptions bad;
  bad.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  bad.recompute = RecomputePolicy::every_kth<BlockImpl>(0, "Block");
  try {
    fully_shard(net, comm, bad);
    FAIL() << "every = 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FsdpOptions.recompute.every must be >= 1"), std::string::npos) << e.what();
  }
  FsdpOptions good;
  good.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  good.recompute = RecomputePolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, comm, good);
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto x = torch::randn({4, 7}), y = torch::randn({4, 5});
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    auto loss = (model.forward(x) - y).pow(2).mean();
    loss.backward();
    opt.step();
    opt.zero_grad();
    losses.push_back(loss.item<double>());
  }
  EXPECT_LT(losses.back(), losses.front());
}

// ---------------------------------------------------------------- errors
static_assert(std::is_base_of_v<Error, CollectiveError>);
static_assert(std::is_base_of_v<Error, memory::OutOfMemory>);
static_assert(std::is_base_of_v<Error, InternalError>);
static_assert(std::is_base_of_v<Error, UsageError>);  // the command-line programs' (cli/usage.h)
static_assert(std::is_base_of_v<std::runtime_error, Error>);

// Each kind raised for real and caught as fsdp::Error, with its own type intact.
TEST(Errors, EveryLibraryErrorIsAnFsdpError) {
  auto comm = make_local_communicator();
  bool caught = false;
  try {
    comm->all_gather(torch::zeros({4}), torch::zeros({3}))->wait();  // output must be N x input
  } catch (const Error& e) {
    caught = dynamic_cast<const CollectiveError*>(&e) != nullptr;
  }
  EXPECT_TRUE(caught) << "a misused collective is a CollectiveError, caught as fsdp::Error";

  ASSERT_TRUE(memory::installed()) << "fsdp::init (the test environment) installs the counting allocator";
  caught = false;
  memory::set_limit(memory::stats().current + 1024);
  try {
    auto t = torch::empty({1 << 20});
  } catch (const Error& e) {
    caught = dynamic_cast<const memory::OutOfMemory*>(&e) != nullptr;
  }
  memory::set_limit(0);
  EXPECT_TRUE(caught) << "an allocation over the limit is an OutOfMemory, caught as fsdp::Error";

  caught = false;
  try {
    FSDP_CHECK(1 + 1 == 3, "arithmetic");
  } catch (const Error& e) {
    caught = dynamic_cast<const InternalError*>(&e) != nullptr &&
             std::string(e.what()).find("internal error") != std::string::npos;
  }
  EXPECT_TRUE(caught) << "a failed invariant is an InternalError, caught as fsdp::Error";

  EXPECT_THROW(parse_strategy("sideways"), Error);
  EXPECT_THROW(WrapPolicy::size_based(0), Error);
  EXPECT_THROW(plan::parse_optimizer("lion"), Error);
  EXPECT_THROW(plan::parse_bandwidth("fast"), Error);
  EXPECT_THROW(cli::parse_bytes("lots"), UsageError);
}

// ---------------------------------------------------------------- helpers
// The trap: the shards are 1-D, so the usual dim() filter decays nothing.
// decay_groups decides on the original shapes: exactly the 2-D weights decay,
// in named_shards() order, on every rank (uneven shards at N = 3).
TEST(ApiHelpers, DecayGroupsUseTheOriginalShapesOnEveryRank) {
  FSDP_IN_RANKS(3);
  init();
  auto comm = make_communicator_from_env();
  ASSERT_EQ(comm->world_size(), 3);
  torch::manual_seed(5);
  Net net;
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, comm, o);

  int naive_decay = 0;
  for (auto& p : model->parameters()) naive_decay += p.dim() >= 2;
  EXPECT_EQ(naive_decay, 0) << "shards are 1-D views (the trap decay_groups avoids)";

  auto groups = decay_groups(*model, torch::optim::AdamWOptions(1e-3), 0.1);
  ASSERT_EQ(groups.size(), 2u);
  std::vector<const void*> want_decay, want_rest;
  std::set<std::string> decay_names;
  for (auto& s : model->named_shards()) {
    (s.full_shape.size() >= 2 ? want_decay : want_rest).push_back(s.tensor.unsafeGetTensorImpl());
    if (s.full_shape.size() >= 2) decay_names.insert(s.name);
  }
  auto impls = [](const torch::optim::OptimizerParamGroup& g) {
    std::vector<const void*> v;
    for (auto& p : g.params()) v.push_back(p.unsafeGetTensorImpl());
    return v;
  };
  EXPECT_EQ(impls(groups[0]), want_decay);
  EXPECT_EQ(impls(groups[1]), want_rest);
  // Net: inp, 3 blocks x (fc1, fc2), out are Linear weights; gate.g, ln and the biases are not.
  EXPECT_EQ(decay_names, (std::set<std::string>{"inp.weight", "blocks.0.fc1.weight", "blocks.0.fc2.weight",
                                                "blocks.1.fc1.weight", "blocks.1.fc2.weight",
                                                "blocks.2.fc1.weight", "blocks.2.fc2.weight", "out.weight"}));
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamWOptions&>(groups[0].options()).weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamWOptions&>(groups[1].options()).weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamWOptions&>(groups[0].options()).lr(), 1e-3);

  // A custom rule by name; and the groups make a working optimizer of this model.
  auto by_name = param_groups(
      *model, [](const std::string& name, const std::vector<int64_t>&) { return name.rfind("blocks.", 0) == 0; },
      torch::optim::SGDOptions(0.1), torch::optim::SGDOptions(0.01));
  ASSERT_EQ(by_name.size(), 2u);
  EXPECT_EQ(by_name[0].params().size(), 12u);  // 3 blocks x 2 Linear x (weight, bias)
  torch::optim::AdamW opt(std::move(groups), torch::optim::AdamWOptions(1e-3));
  EXPECT_NO_THROW(verify_optimizer(*model, opt));
  auto loss = model.forward(torch::randn({2, 7})).pow(2).mean();
  loss.backward();
  opt.step();
}

// The loss for logging: every rank gets the mean of all ranks' values, in
// fp64 (values that differ far below fp32's precision still average right).
TEST(ApiHelpers, AllReduceMeanAveragesOverRanks) {
  FSDP_IN_RANKS(3);
  init();
  auto comm = make_communicator_from_env();
  const int r = comm->rank();
  EXPECT_DOUBLE_EQ(all_reduce_mean(*comm, double(r + 1)), 2.0);  // (1 + 2 + 3) / 3
  const double tiny = 1e-12;
  EXPECT_NEAR(all_reduce_mean(*comm, 1.0 + tiny * r), 1.0 + tiny, 1e-15);
  EXPECT_EQ(comm->counters()[CollectiveKind::ALL_REDUCE].calls, 2);
  // A world of one: the value itself, no collective.
  auto one = make_local_communicator();
  EXPECT_EQ(all_reduce_mean(*one, 0.25), 0.25);
  EXPECT_EQ(one->counters()[CollectiveKind::ALL_REDUCE].calls, 0);
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
