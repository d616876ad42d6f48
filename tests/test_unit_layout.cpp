// Tests of what a unit is before any communication: the padding and shard
// arithmetic (src/common/shard_math.h, shared by the engine, the planner and
// the checkpoints), the strategy names (src/common/strategy_names.h) and the
// wrap description (src/wrap/wrap.h), run on module trees without a
// communicator.
#include <gtest/gtest.h>

#include <functional>
#include <torch/torch.h>

#include <string>
#include <type_traits>
#include <vector>

#include "common/strategy_names.h"
#include "fsdp/checkpoint.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "plan/names.h"
#include "common/shard_math.h"
#include "unit/engine.h"
#include "unit/engine_access.h"
#include "unit/unit.h"
#include "wrap/wrap.h"

namespace FSDP_TEST_ID {

using namespace fsdp;
namespace sm = fsdp::shard;

// --- shard_math --------------------------------------------------------------

TEST(ShardMath, PaddedIsTheNextMultipleOfTheWorld) {
  EXPECT_EQ(sm::padded_numel(10, 3), 12);
  EXPECT_EQ(sm::shard_numel(10, 3), 4);
  EXPECT_EQ(sm::padded_numel(12, 3), 12);
  EXPECT_EQ(sm::padded_numel(1, 4), 4);  // smaller than the world: one element each
  EXPECT_EQ(sm::shard_numel(1, 4), 1);
  EXPECT_EQ(sm::padded_numel(0, 3), 0);  // an empty unit stays empty
  EXPECT_EQ(sm::shard_numel(0, 3), 0);
  EXPECT_EQ(sm::padded_numel(7, 1), 7);
}

TEST(ShardMath, NoShardKeepsTheWholeBufferUnpadded) {
  for (int r = 0; r < 3; ++r) {
    auto l = sm::flat_layout(10, 3, r, /*no_shard=*/true);
    EXPECT_EQ(l.padded_numel, 10);
    EXPECT_EQ(l.shard_numel, 10);
    EXPECT_EQ(l.shard_begin, 0);
  }
  auto l = sm::flat_layout(10, 3, 2, /*no_shard=*/false);
  EXPECT_EQ(l.padded_numel, 12);
  EXPECT_EQ(l.shard_numel, 4);
  EXPECT_EQ(l.shard_begin, 8);
}

// Parameters of sizes 5, 1, 0, 4 back to back (10 elements) on 3 ranks:
// S = 4, rank 0 [0,4), rank 1 [4,8), rank 2 [8,12) with 2 padding elements.
TEST(ShardMath, ParamRangesCoverEveryElementOnceInRankOrder) {
  const std::vector<int64_t> sizes = {5, 1, 0, 4};
  const int world = 3;
  const int64_t total = 10, S = sm::shard_numel(total, world);
  std::vector<std::vector<sm::Range>> got(world);
  for (int r = 0; r < world; ++r) {
    auto l = sm::flat_layout(total, world, r, false);
    int64_t off = 0;
    for (auto n : sizes) {
      got[r].push_back(sm::param_range(off, n, l.shard_begin, l.shard_numel));
      off += n;
    }
  }
  // Param 0 (flat [0,5)): rank 0 [0,4), rank 1 [4,5), rank 2 none (at its end).
  EXPECT_EQ(got[0][0].lo, 0);
  EXPECT_EQ(got[0][0].hi, 4);
  EXPECT_EQ(got[1][0].lo, 4);
  EXPECT_EQ(got[1][0].hi, 5);
  EXPECT_TRUE(got[2][0].empty());
  EXPECT_EQ(got[2][0].lo, 5);
  // Param 1 (flat [5,6)): rank 1 only; rank 0's empty range sits at its start.
  EXPECT_TRUE(got[0][1].empty());
  EXPECT_EQ(got[0][1].lo, 0);
  EXPECT_EQ(got[1][1].lo, 0);
  EXPECT_EQ(got[1][1].hi, 1);
  // Param 2 has no elements: empty everywhere.
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[r][2].size(), 0);
  // Param 3 (flat [6,10)): rank 1 [0,2), rank 2 [2,4); the padding is nobody's.
  EXPECT_EQ(got[1][3].lo, 0);
  EXPECT_EQ(got[1][3].hi, 2);
  EXPECT_EQ(got[2][3].lo, 2);
  EXPECT_EQ(got[2][3].hi, 4);
  for (size_t p = 0; p < sizes.size(); ++p) {
    int64_t next = 0, held = 0;
    for (int r = 0; r < world; ++r) {
      if (got[r][p].empty()) continue;
      EXPECT_EQ(got[r][p].lo, next) << "param " << p << " rank " << r;
      next = got[r][p].hi;
      held += got[r][p].size();
    }
    EXPECT_EQ(held, sizes[p]) << "param " << p;
  }
  EXPECT_EQ(S, 4);
}

TEST(ShardMath, EvenRangeIsTheCheckpointSplit) {
  // 3 elements on 4 ranks: one each, the last rank none.
  EXPECT_EQ(sm::even_range(3, 0, 4).lo, 0);
  EXPECT_EQ(sm::even_range(3, 2, 4).hi, 3);
  EXPECT_TRUE(sm::even_range(3, 3, 4).empty());
  EXPECT_EQ(sm::even_range(3, 3, 4).lo, 3);
  EXPECT_TRUE(sm::even_range(0, 1, 3).empty());
  for (int64_t n : {0, 1, 2, 7, 10, 12}) {
    for (int w : {1, 2, 3, 5}) {
      int64_t covered = 0;
      for (int r = 0; r < w; ++r) {
        auto a = sm::even_range(n, r, w);
        auto b = ckpt::shard_range(n, r, w);
        EXPECT_EQ(a.lo, b.first);
        EXPECT_EQ(a.hi, b.second);
        EXPECT_EQ(a.lo, std::min(n, r * sm::shard_numel(n, w)));
        covered += a.size();
      }
      EXPECT_EQ(covered, n) << "n " << n << " world " << w;
    }
  }
}

// --- strategy names ----------------------------------------------------------

TEST(StrategyNames, OneParserForEngineAndPlanner) {
  const std::vector<std::pair<std::string, ShardingStrategy>> names = {
      {"full", ShardingStrategy::FULL_SHARD},       {"FULL_SHARD", ShardingStrategy::FULL_SHARD},
      {"full_shard", ShardingStrategy::FULL_SHARD}, {"grad-op", ShardingStrategy::SHARD_GRAD_OP},
      {"SHARD_GRAD_OP", ShardingStrategy::SHARD_GRAD_OP}, {"shard_grad_op", ShardingStrategy::SHARD_GRAD_OP},
      {"none", ShardingStrategy::NO_SHARD},         {"NO_SHARD", ShardingStrategy::NO_SHARD},
      {"no_shard", ShardingStrategy::NO_SHARD}};
  for (auto& [text, s] : names) {
    EXPECT_EQ(parse_strategy(text), s) << text;
    auto p = plan::parse_strategy_or_auto(text);
    ASSERT_TRUE(p.has_value()) << text;
    EXPECT_EQ(*p, s) << text;
    EXPECT_EQ(parse_strategy(fsdp::detail::strategy_name(s)), s);
    EXPECT_STREQ(to_string(s), fsdp::detail::strategy_name(s));
  }
  EXPECT_FALSE(plan::parse_strategy_or_auto("auto").has_value());
  EXPECT_THROW(parse_strategy("auto"), Error);
  EXPECT_THROW(parse_strategy("half"), Error);
  EXPECT_THROW(plan::parse_strategy_or_auto("half"), Error);
}

// --- wrap descriptions -------------------------------------------------------

struct LeafImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  explicit LeafImpl(int64_t d) {
    a = register_module("a", torch::nn::Linear(d, d));
    b = register_module("b", torch::nn::Linear(torch::nn::LinearOptions(d, d).bias(false)));
  }
};
TORCH_MODULE(Leaf);

// root: emb [V,d], blocks.{0,1} (Leaf), inner.leaf (Leaf nested one deeper),
// head [V,d] tied to emb, bias [V].
struct TreeImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::nn::ModuleList blocks;
  std::shared_ptr<torch::nn::Module> inner;
  torch::Tensor head_bias;
  TreeImpl(int64_t V = 5, int64_t d = 4) {
    emb = register_module("emb", torch::nn::Embedding(V, d));
    blocks = register_module("blocks", torch::nn::ModuleList(Leaf(d), Leaf(d)));
    inner = register_module("inner", std::make_shared<torch::nn::Module>());
    inner->register_module("leaf", Leaf(d));
    auto head = register_module("head", std::make_shared<torch::nn::Module>());
    head->register_parameter("weight", emb->weight);  // tied
    head_bias = register_parameter("bias", torch::zeros({V}));
  }
};
TORCH_MODULE(Tree);

std::vector<std::string> names_of(const fsdp::detail::UnitDesc& u) {
  std::vector<std::string> out;
  for (auto& p : u.params) out.push_back(p.name);
  return out;
}

TEST(WrapDescription, PolicyNestingAndTiedWeightsWithoutACommunicator) {
  Tree tree;
  auto d = fsdp::detail::describe_wrap(*tree, WrapPolicy::module_type<LeafImpl>("Leaf"));
  ASSERT_EQ(d.units.size(), 4u);
  EXPECT_EQ(d.units[0].name, "");
  EXPECT_EQ(d.units[0].module, tree.get());
  EXPECT_EQ(d.units[0].parent, -1);
  EXPECT_EQ(d.units[1].name, "blocks.0");
  EXPECT_EQ(d.units[2].name, "blocks.1");
  EXPECT_EQ(d.units[3].name, "inner.leaf");
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(d.units[i].parent, 0);
    EXPECT_EQ(names_of(d.units[i]), (std::vector<std::string>{d.units[i].name + ".a.weight",
                                                              d.units[i].name + ".a.bias",
                                                              d.units[i].name + ".b.weight"}));
  }
  // The root keeps what no nested unit took: the tied embedding once (its
  // canonical name is the first in the walk, head.weight a tied name) and bias.
  ASSERT_EQ(names_of(d.units[0]), (std::vector<std::string>{"bias", "emb.weight"}));
  EXPECT_EQ(d.units[0].params[1].tied_names, std::vector<std::string>{"head.weight"});
  EXPECT_TRUE(d.units[0].params[1].tensor.is_same(tree->emb->weight));
  // Every name of the unwrapped model, tied ones included, points at its slot.
  auto named = tree->named_parameters(/*recurse=*/true);
  ASSERT_EQ(d.named.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(d.named[i].name, named[i].key());
    const auto& slot = d.units[d.named[i].unit].params[d.named[i].param];
    EXPECT_TRUE(slot.tensor.is_same(named[i].value())) << named[i].key();
  }
  // Nothing changed: the parameters are still the module's own, with bytes.
  EXPECT_EQ(tree->emb->weight.numel(), 20);
  EXPECT_TRUE(tree->emb->weight.has_storage());
}

TEST(WrapDescription, NoPolicyIsOneUnitAndSizePolicyCountsOnlyUnclaimedParameters) {
  Tree tree;
  auto one = fsdp::detail::describe_wrap(*tree, WrapPolicy::none());
  ASSERT_EQ(one.units.size(), 1u);
  EXPECT_EQ(one.units[0].params.size(), 11u);  // 3 Leafs x 3 + emb + bias
  // Leaf has 4*4 + 4 + 4*4 = 36 parameters, emb 20; `inner` holds only a
  // Leaf, so once that is a unit it has nothing left and does not qualify.
  auto sized = fsdp::detail::describe_wrap(*tree, WrapPolicy::size_based(36));
  ASSERT_EQ(sized.units.size(), 4u);
  EXPECT_EQ(sized.units[3].name, "inner.leaf");
  auto big = fsdp::detail::describe_wrap(*tree, WrapPolicy::size_based(37));
  // No Leaf qualifies, so blocks (72 unclaimed) does as a whole; inner (36) not.
  ASSERT_EQ(big.units.size(), 2u);
  EXPECT_EQ(big.units[1].name, "blocks");
  EXPECT_EQ(big.units[1].params.size(), 6u);
}

TEST(WrapDescription, TiedParameterInSiblingUnitsIsAUserError) {
  Tree tree;
  // blocks.1.a also holds blocks.0.a.weight: owners in sibling units.
  auto b0 = tree->blocks[0]->as<LeafImpl>();
  auto b1 = tree->blocks[1]->as<LeafImpl>();
  b1->a->register_parameter("tied", b0->a->weight);
  try {
    fsdp::detail::describe_wrap(*tree, WrapPolicy::module_type<LeafImpl>("Leaf"));
    FAIL() << "expected fsdp::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'blocks.0.a.weight' (unit 'blocks.0')"), std::string::npos) << m;
    EXPECT_NE(m.find("'blocks.1.a.tied' (unit 'blocks.1')"), std::string::npos) << m;
    EXPECT_NE(m.find("sibling units"), std::string::npos) << m;
  }
  // Wrapping their common parent instead is fine: the tie lives in `blocks`.
  auto d = fsdp::detail::describe_wrap(*tree, WrapPolicy::predicate([](const std::string& name, const torch::nn::Module&,
                                                                  int64_t) { return name == "blocks"; }));
  ASSERT_EQ(d.units.size(), 2u);
  EXPECT_EQ(d.units[1].name, "blocks");
  EXPECT_EQ(d.units[1].params[0].tied_names, std::vector<std::string>{"blocks.1.a.tied"});
}

// --- checked transitions ------------------------------------------------------

TEST(UnitTransitions, AnIllegalTransitionIsAnInternalErrorNamingTheUnitAndBothStates) {
  Tree tree;
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<LeafImpl>("Leaf");
  auto model = fully_shard(tree, make_local_communicator(), o);
  fsdp::detail::Unit* u = fsdp::detail::unit_of(tree->blocks[1].get());
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->training(), fsdp::detail::TrainingState::IDLE);
  try {
    u->post_backward(/*no_sync=*/false);  // no backward is running
    FAIL() << "expected an internal error";
  } catch (const fsdp::InternalError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("internal error at "), std::string::npos) << m;
    EXPECT_NE(m.find("unit 'blocks.1'"), std::string::npos) << m;
    EXPECT_NE(m.find("post_backward in state IDLE, expected BACKWARD"), std::string::npos) << m;
  }
  EXPECT_EQ(u->training(), fsdp::detail::TrainingState::IDLE);  // unchanged
  // unshard / wait_for_unshard / reshard are idempotent by design.
  EXPECT_EQ(u->state(), fsdp::detail::UnitState::SHARDED);
  u->reshard();
  u->wait_for_unshard();
  EXPECT_EQ(u->state(), fsdp::detail::UnitState::SHARDED);
  u->unshard();
  u->unshard();
  u->wait_for_unshard();
  u->wait_for_unshard();
  EXPECT_EQ(u->state(), fsdp::detail::UnitState::UNSHARDED);
  u->reshard();
  u->reshard();
  EXPECT_EQ(u->state(), fsdp::detail::UnitState::SHARDED);
}

// Activation checkpointing's transitions: a recompute starts only in
// BACKWARD on the backward's all-gather (never gathering again), and the
// unit refuses to reshard while it recomputes.
TEST(UnitTransitions, RecomputeNeedsTheBackwardGatherAndForbidsResharding) {
  Tree tree;
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<LeafImpl>("Leaf");
  auto model = fully_shard(tree, make_local_communicator(), o);
  fsdp::detail::Unit* u = fsdp::detail::unit_of(tree->blocks[1].get());
  ASSERT_NE(u, nullptr);
  auto expect_internal = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "expected an internal error: " << what;
    } catch (const fsdp::InternalError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_internal([&] { u->begin_recompute(); }, "begin_recompute in state IDLE, expected BACKWARD");
  ASSERT_TRUE(u->pre_backward([] {}));  // gathers
  EXPECT_EQ(u->state(), fsdp::detail::UnitState::UNSHARDED);
  u->reshard();
  expect_internal([&] { u->begin_recompute(); }, "begin_recompute in state SHARDED, expected UNSHARDED");
  u->unshard();
  u->wait_for_unshard();
  u->begin_recompute();
  EXPECT_TRUE(u->recomputing());
  expect_internal([&] { u->reshard(); }, "reshard in state UNSHARDED, recomputing, expected not recomputing");
  EXPECT_EQ(u->state(), fsdp::detail::UnitState::UNSHARDED);
  u->end_recompute();
  EXPECT_FALSE(u->recomputing());
  expect_internal([&] { u->end_recompute(); }, "end_recompute in state not recomputing");
  u->reshard();
  EXPECT_EQ(u->state(), fsdp::detail::UnitState::SHARDED);
}

// --- What construction fixes is constant (#23) ---------------------------------

// A group of N ranks seen from `rank`, that communicates nothing: a unit's
// constructor must need its size and rank, and no collective.
class SizeOnlyGroup : public Communicator {
 public:
  SizeOnlyGroup(int world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return rank_; }
  int local_world_size() const override { return world_; }
  WorkPtr all_gather(const torch::Tensor&, torch::Tensor, const CollectiveInfo&) override { return none("all_gather"); }
  WorkPtr reduce_scatter(const torch::Tensor&, torch::Tensor, ReduceOp, const CollectiveInfo&) override {
    return none("reduce_scatter");
  }
  WorkPtr all_reduce(torch::Tensor, ReduceOp, const CollectiveInfo&) override { return none("all_reduce"); }
  WorkPtr broadcast(torch::Tensor, int, const CollectiveInfo&) override { return none("broadcast"); }
  WorkPtr barrier(const CollectiveInfo&) override { return none("barrier"); }
  WorkPtr gather(const torch::Tensor&, torch::Tensor, int, const CollectiveInfo&) override { return none("gather"); }
  CommCounters counters() const override { return {}; }
  void reset_counters() override {}
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1); }
  std::string describe() const override { return "size-only"; }

 private:
  [[noreturn]] static WorkPtr none(const char* what) {
    throw std::logic_error(std::string("a unit's constructor communicated: ") + what);
  }
  int world_, rank_;
};

std::vector<fsdp::detail::ParamSlot> slots_of(const std::vector<torch::Tensor>& ts) {
  std::vector<fsdp::detail::ParamSlot> out;
  for (size_t i = 0; i < ts.size(); ++i) {
    fsdp::detail::ParamSlot s;
    s.name = "p" + std::to_string(i);
    s.param = ts[i];
    out.push_back(std::move(s));
  }
  return out;
}

TEST(UnitLayout, TheConstructorFixesTheLayoutWithoutCommunicating) {
  using fsdp::detail::Unit;
  // N = 3, rank 1; uneven sizes, one tensor smaller than N, one frozen.
  SizeOnlyGroup group(3, 1);
  const std::vector<torch::Tensor> ts = {torch::zeros({5}).requires_grad_(), torch::zeros({1}),
                                         torch::zeros({2, 2}).requires_grad_()};
  FsdpOptions full;  // FULL_SHARD
  Unit u(0, "", nullptr, nullptr, nullptr, &group, slots_of(ts), full);
  EXPECT_EQ(u.numel, 10);
  EXPECT_EQ(u.padded_numel, 12);
  EXPECT_EQ(u.shard_numel, 4);
  EXPECT_EQ(u.shard_begin, 4);  // rank 1 holds flat[4, 8)
  EXPECT_EQ(u.n_grad_params, 2);
  EXPECT_TRUE(u.reshard_after_forward);
  EXPECT_FALSE(u.keeps_unsharded);
  EXPECT_FALSE(u.full_is_shard);
  EXPECT_EQ(u.param_dtype, torch::kFloat32);
  EXPECT_EQ(u.reduce_dtype, torch::kFloat32);
  ASSERT_EQ(u.params().size(), 3u);
  const std::vector<int64_t> offsets = {0, 5, 6}, lo = {4, 0, 0}, hi = {5, 1, 2};
  for (size_t i = 0; i < 3; ++i) {
    const auto& s = u.params()[i];
    EXPECT_EQ(s.offset, offsets[i]) << s.name;
    EXPECT_EQ(s.numel, ts[i].numel()) << s.name;
    EXPECT_EQ(s.shape, ts[i].sizes().vec()) << s.name;
    EXPECT_EQ(s.lo, lo[i]) << s.name;
    EXPECT_EQ(s.hi, hi[i]) << s.name;
    EXPECT_EQ(s.requires_grad, ts[i].requires_grad()) << s.name;
    EXPECT_FALSE(s.shard_view.defined()) << s.name << ": views are init_flat_param's";
  }
  EXPECT_EQ(u.state(), fsdp::detail::UnitState::SHARDED);

  FsdpOptions none;
  none.strategy = ShardingStrategy::NO_SHARD;
  none.mixed_precision.param_dtype = torch::kBFloat16;
  Unit n(0, "", nullptr, nullptr, nullptr, &group, slots_of(ts), none);
  EXPECT_EQ(n.padded_numel, 10);  // no padding: every rank holds the whole
  EXPECT_EQ(n.shard_numel, 10);
  EXPECT_EQ(n.shard_begin, 0);
  EXPECT_TRUE(n.keeps_unsharded);
  EXPECT_FALSE(n.full_is_shard);  // bf16 parameters: full is a copy of the fp32 shard
  EXPECT_EQ(n.param_dtype, torch::kBFloat16);
  EXPECT_EQ(n.reduce_dtype, torch::kBFloat16);  // defaults to param_dtype
  EXPECT_FALSE(n.reshard_after_forward);
}

// Fields that never change after construction cannot be assigned: a unit's
// place and layout, an engine's groups, units, names and recompute sites,
// and everything the state-dict code reads.
template <class T>
constexpr bool const_ref = std::is_const_v<std::remove_reference_t<T>>;
using fsdp::detail::Engine;
using fsdp::detail::EngineAccess;
using fsdp::detail::RecomputeSite;
using fsdp::detail::Unit;
static_assert(std::is_const_v<decltype(Unit::index)> && std::is_const_v<decltype(Unit::name)> &&
              std::is_const_v<decltype(Unit::module)> && std::is_const_v<decltype(Unit::parent)> &&
              std::is_const_v<decltype(Unit::owner)> && std::is_const_v<decltype(Unit::comm)>);
static_assert(std::is_const_v<decltype(Unit::numel)> && std::is_const_v<decltype(Unit::padded_numel)> &&
              std::is_const_v<decltype(Unit::shard_numel)> && std::is_const_v<decltype(Unit::shard_begin)> &&
              std::is_const_v<decltype(Unit::param_dtype)> && std::is_const_v<decltype(Unit::reduce_dtype)> &&
              std::is_const_v<decltype(Unit::reshard_after_forward)> &&
              std::is_const_v<decltype(Unit::keeps_unsharded)> && std::is_const_v<decltype(Unit::full_is_shard)> &&
              std::is_const_v<decltype(Unit::n_grad_params)>);
static_assert(const_ref<decltype(std::declval<Unit&>().params())>, "params() is read-only");
static_assert(std::is_const_v<decltype(Engine::root)> && std::is_const_v<decltype(Engine::comm)> &&
              std::is_const_v<decltype(Engine::opts)> && std::is_const_v<decltype(Engine::shard_comm)> &&
              std::is_const_v<decltype(Engine::replica_comm)> && std::is_const_v<decltype(Engine::units)> &&
              std::is_const_v<decltype(Engine::named_slots)> && std::is_const_v<decltype(Engine::recompute_sites)>);
static_assert(std::is_const_v<std::remove_pointer_t<decltype(Engine::named_slots)::value_type::second_type>>);
static_assert(std::is_const_v<decltype(RecomputeSite::engine)> && std::is_const_v<decltype(RecomputeSite::module)> &&
              std::is_const_v<decltype(RecomputeSite::name)> && std::is_const_v<decltype(RecomputeSite::unit)> &&
              std::is_const_v<decltype(RecomputeSite::params)>);
static_assert(std::is_same_v<decltype(std::declval<EngineAccess&>().units()), std::vector<const Unit*>> &&
              std::is_same_v<decltype(std::declval<EngineAccess&>().slots()),
                             std::vector<const fsdp::detail::ParamSlot*>>);

}  // namespace FSDP_TEST_ID
