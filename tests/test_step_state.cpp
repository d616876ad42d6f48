// fsdp-cpp tests: one step's state listed once (src/state/step_state.h) —
// what a heal copies. A copy received into staging leaves the live state
// untouched, however much of it arrived, until it is installed whole; then
// the model and its optimizer continue exactly as the source does.
#include <gtest/gtest.h>

#include "core_model.h"
#include "fsdp/fsdp.h"
#include "state/step_state.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

FsdpOptions two_units() {
  FsdpOptions o;
  o.wrap = WrapPolicy::predicate(
      [](const std::string&, const torch::nn::Module& m, int64_t) { return dynamic_cast<const BlockImpl*>(&m) != nullptr; },
      "Block");
  return o;
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> v;
  for (const auto& t : ts) v.push_back(t.detach().clone());
  return v;
}

template <class Model>
void step(Model& m, torch::optim::Optimizer& opt, int s) {
  torch::manual_seed(100 + s);
  auto x = torch::randn({4, 7});
  opt.zero_grad();
  m.forward(x).pow(2).mean().backward();
  opt.step();
}

TEST(StepState, AStagedCopyTouchesNothingLiveUntilItIsInstalledWhole) {
  auto comm = make_communicator_from_env();  // a world of one
  torch::manual_seed(1);
  Net a(7, 12, 5, 3);
  auto source = fully_shard(a, comm, two_units());
  torch::manual_seed(2);
  Net b(7, 12, 5, 3);
  auto target = fully_shard(b, comm, two_units());
  torch::optim::Adam opt_s(source->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam opt_t(target->parameters(), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < 3; ++s) step(source, opt_s, s);  // the source has optimizer state, the target none

  const state::StepListing from = state::list_step(*source, opt_s);
  const state::StepListing live = state::list_step(*target, opt_t);
  for (const auto& row : live.header()) EXPECT_TRUE(row.is_null()) << "the target has no optimizer state yet";
  for (const auto& row : from.header()) EXPECT_EQ(row.at("step"), 3) << row.dump();
  const auto before = copies(live.params);
  state::StagedStep staged(live, from.header());
  const auto bulk = from.tensors();
  ASSERT_EQ(staged.tensors().size(), bulk.size());
  EXPECT_EQ(staged.bytes(), from.bytes());
  // Half of it arrives, then the copy fails: nothing live moved.
  for (size_t i = 0; i < bulk.size() / 2; ++i) staged.tensors()[i].copy_(bulk[i]);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(live.params[i].detach(), before[i])) << i;
  EXPECT_TRUE(opt_t.state().empty());
  // All of it, installed: the target is the source, weights and optimizer.
  for (size_t i = 0; i < bulk.size(); ++i) staged.tensors()[i].copy_(bulk[i]);
  staged.install(opt_t);
  for (size_t i = 0; i < from.params.size(); ++i) EXPECT_TRUE(torch::equal(live.params[i].detach(), from.params[i].detach())) << i;
  EXPECT_EQ(state::list_step(*target, opt_t).header(), from.header());
  // ... and both take the next step alike, bit for bit.
  step(source, opt_s, 3);
  step(target, opt_t, 3);
  for (size_t i = 0; i < from.params.size(); ++i) EXPECT_TRUE(torch::equal(live.params[i].detach(), from.params[i].detach())) << i;
}

TEST(StepState, AHeaderOfAnotherOptimizerIsRefusedWithOneMessage) {
  auto comm = make_communicator_from_env();
  torch::manual_seed(1);
  Net a(7, 12, 5, 3);
  auto m = fully_shard(a, comm, two_units());
  torch::optim::SGD sgd(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const state::StepListing live = state::list_step(*m, sgd);
  nlohmann::json header = nlohmann::json::array();
  for (size_t i = 0; i < live.params.size(); ++i) header.push_back({{"step", 3}, {"tensors", {"exp_avg"}}});
  try {
    state::StagedStep staged(live, header);
    FAIL() << "an Adam header was taken for an SGD";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("names the optimizer tensor \"exp_avg\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Expected every replica group to run the same optimizer"), std::string::npos);
  }
  header = nlohmann::json::array({nullptr});
  EXPECT_THROW(state::StagedStep(live, header), Error);  // another parameter count
}

}  // namespace FSDP_TEST_ID
}  // namespace fsdp::testing
