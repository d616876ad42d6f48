// What each optimizer keeps, in one table (src/optim/optimizer_state.h): the
// checkpoints save it and the ledger counts it from the same rows. Every
// optimizer libtorch ships is either checkpointed (SGD, Adam, AdamW and
// fsdp::FusedAdamW, Adagrad, RMSprop: a resume from a sharded checkpoint, or
// from the consolidated files, continues bit for bit) or refused before
// anything is written, with one message (LBFGS, and a program's own
// optimizer).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <unistd.h>

#include "core_model.h"
#include "fsdp/fsdp.h"
#include "fsdp/plan.h"
#include "optim/optimizer_state.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(const FullyShardedModel&)>;

FsdpOptions core_options(const std::string& strategy) {
  FsdpOptions o;
  o.strategy = parse_strategy(strategy);
  o.wrap = WrapPolicy::predicate(
      [](const std::string&, const torch::nn::Module& m, int64_t) {
        return dynamic_cast<const BlockImpl*>(&m) || dynamic_cast<const GateImpl*>(&m);
      },
      "Block and Gate");
  return o;
}

// The same initial values on every rank and in every build.
auto build(const CommPtr& comm, const std::string& strategy) {
  torch::manual_seed(1);
  Net net(7, 12, 5, 3);
  return fully_shard(net, comm, core_options(strategy));
}

// Step s of the run: this rank's batch depends on (s, rank) only, so a
// resumed run sees the batches the straight one saw.
template <class Model>
void train_step(Model& model, torch::optim::Optimizer& opt, int s, int rank) {
  torch::manual_seed(100 + 10 * s + rank);
  auto x = torch::randn({4, 7});
  opt.zero_grad();
  model.forward(x).pow(2).mean().backward();
  opt.step();
}

// A folder every rank of this job names alike (the launcher is their
// parent), removed by rank 0 when the test ends, passed or failed.
struct SharedDir {
  SharedDir(const std::string& tag, const CommPtr& comm) : comm(comm) {
    path = (fs::temp_directory_path() / ("fsdp_optim_state_" + tag + "_" + std::to_string(::getppid()))).string();
    if (comm->rank() == 0) {
      fs::remove_all(path);
      fs::create_directories(path);
    }
    comm->barrier()->wait();
  }
  ~SharedDir() {
    if (comm->rank() == 0) fs::remove_all(path);
  }
  CommPtr comm;
  std::string path;
};

// Every parameter's state tensors of two optimizers, equal bit for bit.
void expect_same_state(const FullyShardedModel& ma, const torch::optim::Optimizer& a, const FullyShardedModel& mb,
                       const torch::optim::Optimizer& b) {
  const detail::OptimizerKind* k = detail::kind_of(a);
  ASSERT_NE(k, nullptr);
  const auto sa = ma.named_shards(), sb = mb.named_shards();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    auto ia = a.state().find(sa[i].tensor.unsafeGetTensorImpl());
    auto ib = b.state().find(sb[i].tensor.unsafeGetTensorImpl());
    ASSERT_EQ(ia == a.state().end(), ib == b.state().end()) << sa[i].name;
    if (ia == a.state().end()) continue;
    EXPECT_EQ(k->step(*ia->second), k->step(*ib->second)) << sa[i].name;
    for (auto& name : k->tensors) {
      const torch::Tensor ta = k->tensor(*ia->second, name), tb = k->tensor(*ib->second, name);
      ASSERT_EQ(ta.defined(), tb.defined()) << sa[i].name << "." << name;
      if (ta.defined()) EXPECT_TRUE(torch::equal(ta, tb)) << sa[i].name << "." << name;
    }
  }
}

void expect_same_values(const FullyShardedModel& a, const FullyShardedModel& b, const std::string& what) {
  const auto va = a.full_state(-1), vb = b.full_state(-1);
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i)
    EXPECT_TRUE(torch::equal(va[i].second, vb[i].second)) << what << ": " << va[i].first;
}

struct Case {
  std::string name;
  MakeOptimizer make;
  // The ledger's O in this rank's elements x 4 bytes (-1: groups differ,
  // MixedGroupsSaveEveryTensorAnyGroupKeeps checks it).
  int tensors_per_element;
};

class OptimizerCheckpoint : public ::testing::TestWithParam<Case> {};

// 6 steps straight = 3 steps + save + load into a fresh model and optimizer
// + 3 steps, bit for bit, through the sharded checkpoint and through the
// consolidated model and optimizer files; the ledger counts the state the
// checkpoint holds.
TEST_P(OptimizerCheckpoint, ResumeIsBitwiseAndTheLedgerCountsTheState) {
  const Case& c = GetParam();
  FSDP_IN_RANKS(2);
  auto comm = make_communicator_from_env();
  const int rank = comm->rank();
  SharedDir dir(c.name, comm);

  auto straight = build(comm, "full");
  auto opt_straight = c.make(*straight);
  verify_optimizer(*straight, *opt_straight);
  for (int s = 0; s < 6; ++s) train_step(straight, *opt_straight, s, rank);

  auto first = build(comm, "full");
  auto opt_first = c.make(*first);
  for (int s = 0; s < 3; ++s) train_step(first, *opt_first, s, rank);
  int64_t local = 0;
  for (auto& s : first->named_shards()) local += s.hi - s.lo;
  if (c.tensors_per_element >= 0)
    EXPECT_EQ(first->ledger(opt_first.get()).O, int64_t(c.tensors_per_element) * 4 * local);
  save_checkpoint(*first, opt_first.get(), dir.path + "/ck", 3, nlohmann::json::object());
  save_full(*first, dir.path + "/model.safetensors");
  save_full_optim(*first, *opt_first, dir.path + "/optim.safetensors");

  auto sharded = build(comm, "full");
  auto opt_sharded = c.make(*sharded);
  auto r = load_checkpoint(*sharded, opt_sharded.get(), dir.path + "/ck");
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.train_state["optimizer"]["type"], detail::kind_of(*opt_sharded)->type);
  expect_same_state(*first, *opt_first, *sharded, *opt_sharded);

  auto consolidated = build(comm, "full");
  auto opt_consolidated = c.make(*consolidated);
  load_full(*consolidated, dir.path + "/model.safetensors");
  load_full_optim(*consolidated, *opt_consolidated, dir.path + "/optim.safetensors");
  expect_same_state(*first, *opt_first, *consolidated, *opt_consolidated);

  for (int s = 3; s < 6; ++s) {
    train_step(sharded, *opt_sharded, s, rank);
    train_step(consolidated, *opt_consolidated, s, rank);
  }
  expect_same_values(*straight, *sharded, "resumed from the sharded checkpoint");
  expect_same_values(*straight, *consolidated, "resumed from the consolidated files");
  expect_same_state(*straight, *opt_straight, *sharded, *opt_sharded);
  comm->barrier()->wait();  // every rank has read the files before rank 0 removes them
}

// RMSprop with groups that keep different tensors: the checkpoint holds
// every tensor any group keeps (zeros where a parameter keeps none), and a
// load gives each parameter what its own group keeps.
std::unique_ptr<torch::optim::Optimizer> rmsprop_two_groups(const FullyShardedModel& m) {
  std::vector<torch::Tensor> a, b;
  for (auto& s : m.named_shards()) (s.name.rfind("blocks.", 0) == 0 ? a : b).push_back(s.tensor);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(a, std::make_unique<torch::optim::RMSpropOptions>(
                             torch::optim::RMSpropOptions(1e-2).momentum(0.9).weight_decay(0.01)));
  groups.emplace_back(b, std::make_unique<torch::optim::RMSpropOptions>(torch::optim::RMSpropOptions(1e-2).centered(true)));
  return std::make_unique<torch::optim::RMSprop>(std::move(groups));
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, OptimizerCheckpoint,
    ::testing::Values(
        Case{"rmsprop",
             [](const FullyShardedModel& m) {
               return std::make_unique<torch::optim::RMSprop>(m.parameters(), torch::optim::RMSpropOptions(1e-2));
             },
             1},
        Case{"rmsprop_momentum_centered",
             [](const FullyShardedModel& m) {
               return std::make_unique<torch::optim::RMSprop>(
                   m.parameters(), torch::optim::RMSpropOptions(1e-2).momentum(0.9).centered(true).weight_decay(0.01));
             },
             3},
        Case{"rmsprop_two_groups", rmsprop_two_groups, -1},
        Case{"adagrad",
             [](const FullyShardedModel& m) {
               return std::make_unique<torch::optim::Adagrad>(
                   m.parameters(),
                   torch::optim::AdagradOptions(0.1).lr_decay(0.01).initial_accumulator_value(0.1).weight_decay(0.01));
             },
             1},
        Case{"adamw_amsgrad_fused",
             [](const FullyShardedModel& m) {
               return std::make_unique<FusedAdamW>(m.parameters(), torch::optim::AdamWOptions(1e-2).amsgrad(true));
             },
             3}),
    [](const auto& info) { return info.param.name; });

// The case above whose O the table cannot give as one number: blocks keep
// square_avg and momentum_buffer, the rest square_avg and grad_avg.
TEST(OptimizerState, MixedGroupsSaveEveryTensorAnyGroupKeeps) {
  auto model = build(make_local_communicator(), "full");
  auto opt = rmsprop_two_groups(*model);
  const detail::OptimizerKind* k = detail::checkpoint_kind(opt.get());
  ASSERT_NE(k, nullptr);
  EXPECT_STREQ(k->type, "rmsprop");
  EXPECT_EQ(detail::saved_tensors(k, opt.get()), (std::vector<std::string>{"square_avg", "momentum_buffer", "grad_avg"}));
  train_step(model, *opt, 0, 0);
  int64_t blocks = 0, rest = 0;
  for (auto& s : model->named_shards()) (s.name.rfind("blocks.", 0) == 0 ? blocks : rest) += s.hi - s.lo;
  EXPECT_EQ(model->ledger(opt.get()).O, 2 * 4 * (blocks + rest));
}

// Every optimizer libtorch ships has its row, found by its type (a subclass
// by its base: fsdp::FusedAdamW is an AdamW); only LBFGS is refused.
TEST(OptimizerState, EveryLibtorchOptimizerHasARow) {
  auto model = build(make_local_communicator(), "full");
  const auto ps = model->parameters();
  struct Want {
    std::unique_ptr<torch::optim::Optimizer> opt;
    const char* type;
    bool checkpointed;
  };
  std::vector<Want> all;
  all.push_back({std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1)), "sgd", true});
  all.push_back({std::make_unique<torch::optim::Adam>(ps), "adam", true});
  all.push_back({std::make_unique<torch::optim::AdamW>(ps), "adamw", true});
  all.push_back({std::make_unique<FusedAdamW>(ps), "adamw", true});
  all.push_back({std::make_unique<torch::optim::Adagrad>(ps), "adagrad", true});
  all.push_back({std::make_unique<torch::optim::RMSprop>(ps), "rmsprop", true});
  all.push_back({std::make_unique<torch::optim::LBFGS>(ps), "lbfgs", false});
  for (auto& w : all) {
    const detail::OptimizerKind* k = detail::kind_of(*w.opt);
    ASSERT_NE(k, nullptr) << w.type;
    EXPECT_STREQ(k->type, w.type);
    EXPECT_EQ(k->not_checkpointed == nullptr, w.checkpointed) << w.type;
    if (w.checkpointed) EXPECT_EQ(detail::checkpoint_kind(w.opt.get()), k) << w.type;
    else EXPECT_THROW(detail::checkpoint_kind(w.opt.get()), Error) << w.type;
  }
  EXPECT_EQ(detail::checkpoint_kind(nullptr), nullptr);
  EXPECT_EQ(detail::optimizer_kinds().size(), all.size() - 1);  // FusedAdamW shares AdamW's row
}

// One table says what each kind keeps (common/optimizer_table.h): the
// planner's O before a run (plan::state_per_param), the ledger's O in a run
// and what the ledger records for the report agree with what the optimizer
// holds after a step, for every kind and the options that change it.
TEST(OptimizerState, ThePlannerAndTheLedgerCountWhatEachKindKeeps) {
  struct Kind {
    const char* plan;  // plan::parse_optimizer's name
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)> make;
  };
  using namespace torch::optim;
  const std::vector<Kind> kinds = {
      {"sgd-plain", [](auto ps) { return std::make_unique<SGD>(ps, SGDOptions(0.1)); }},
      {"sgd-momentum", [](auto ps) { return std::make_unique<SGD>(ps, SGDOptions(0.1).momentum(0.9)); }},
      {"adam", [](auto ps) { return std::make_unique<Adam>(ps); }},
      {"adamw-amsgrad", [](auto ps) { return std::make_unique<AdamW>(ps, AdamWOptions().amsgrad(true)); }},
      {"adagrad", [](auto ps) { return std::make_unique<Adagrad>(ps); }},
      {"rmsprop", [](auto ps) { return std::make_unique<RMSprop>(ps); }},
      {"rmsprop-momentum-centered",
       [](auto ps) { return std::make_unique<RMSprop>(ps, RMSpropOptions().momentum(0.9).centered(true)); }},
  };
  for (const Kind& k : kinds) {
    const plan::Optimizer planned = plan::parse_optimizer(k.plan);
    EXPECT_EQ(plan::to_string(planned), k.plan) << "parse and print back";
    auto w = torch::randn({10}, torch::requires_grad());
    auto opt = k.make({w});
    (w * w).sum().backward();
    opt->step();
    const int per_param = plan::state_per_param(planned);
    EXPECT_EQ(detail::optimizer_state_bytes(*opt, w), per_param * 10 * 4) << k.plan;
    EXPECT_EQ(detail::state_tensors_per_param(*opt), per_param) << k.plan;
  }
  EXPECT_THROW(plan::parse_optimizer("lbfgs"), Error) << "one state for the whole model: nothing to plan per parameter";
  EXPECT_THROW(plan::parse_optimizer("adam-momentum"), Error);
  EXPECT_EQ(plan::state_per_param(plan::parse_optimizer("sgd")), 1) << "sgd: with momentum, the common case";
}

// A program's own optimizer: the ledger counts nothing it cannot read, a
// save refuses it before writing anything.
struct OwnOptimizer : torch::optim::Optimizer {
  explicit OwnOptimizer(std::vector<torch::Tensor> params)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  torch::Tensor step(LossClosure) override { return {}; }
};

TEST(OptimizerState, AProgramsOwnOptimizerIsRefusedByASave) {
  auto comm = make_local_communicator();
  auto model = build(comm, "full");
  OwnOptimizer own(model->parameters());
  EXPECT_NO_THROW(verify_optimizer(*model, own));
  EXPECT_EQ(model->ledger(&own).O, 0);
  SharedDir dir("own", comm);
  try {
    save_checkpoint(*model, &own, dir.path + "/ck", 1, nlohmann::json::object());
    ADD_FAILURE() << "saved a checkpoint of an optimizer the table does not know";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoints save the state of SGD, Adam, AdamW (fsdp::FusedAdamW), Adagrad "
                                         "and RMSprop; this optimizer is another type"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.path + "/ck"));
}

// LBFGS: refused where it cannot work, at verify_optimizer (its line search
// spans the whole model, each rank holds a slice) and at every save (one
// state for all parameters), before anything is written; with NO_SHARD it
// trains, and the ledger counts its history.
TEST(OptimizerState, LbfgsIsRefusedUpFrontAndTrainsWhereRanksHoldEverything) {
  FSDP_IN_RANKS(2);
  auto comm = make_communicator_from_env();
  SharedDir dir("lbfgs", comm);
  auto sharded = build(comm, "full");
  torch::optim::LBFGS on_shards(sharded->parameters(), torch::optim::LBFGSOptions(1).max_iter(2));
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string refused = message([&] { verify_optimizer(*sharded, on_shards); });
  EXPECT_NE(refused.find("torch::optim::LBFGS with FULL_SHARD over a shard group of 2 ranks: it cannot step on "
                         "shards"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("Fix: use one of those optimizers, or FsdpOptions::strategy = NO_SHARD."), std::string::npos)
      << refused;
  const std::string saved = message([&] {
    save_checkpoint(*sharded, &on_shards, dir.path + "/ck", 1, nlohmann::json::object());
  });
  EXPECT_NE(saved.find("torch::optim::LBFGS keeps one state for all parameters"), std::string::npos) << saved;
  const std::string full = message([&] { save_full_optim(*sharded, on_shards, dir.path + "/optim.safetensors"); });
  EXPECT_EQ(full, saved);
  comm->barrier()->wait();
  EXPECT_FALSE(fs::exists(dir.path + "/ck"));
  EXPECT_FALSE(fs::exists(dir.path + "/optim.safetensors"));

  auto whole = build(comm, "none");
  torch::optim::LBFGS lbfgs(whole->parameters(), torch::optim::LBFGSOptions(1).max_iter(2));
  EXPECT_NO_THROW(verify_optimizer(*whole, lbfgs));
  torch::manual_seed(7);  // the same batch on both ranks: the same steps
  const auto x = torch::randn({4, 7});
  lbfgs.step([&] {
    lbfgs.zero_grad();
    auto loss = whole.forward(x).pow(2).mean();
    loss.backward();
    return loss;
  });
  EXPECT_GT(whole->ledger(&lbfgs).O, 0) << "LBFGS's history is optimizer state";
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
