// fsdp-cpp tests: the FSDP core — parity with unsharded training, the
// ledger, misuse. Multi-rank cases run real processes through `fsdp run`.
#include <gtest/gtest.h>
#include <unistd.h>

#include "core_model.h"
#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

// ---------------------------------------------------------------- parity
using ParityParam = std::tuple<int, std::string, std::string>;
class CoreParity : public ::testing::TestWithParam<ParityParam> {};

TEST_P(CoreParity, MatchesUnshardedReference) {
  auto [n, strategy, mode] = GetParam();
  auto r = run_ranks(n, "core_parity", {strategy, mode});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ok = lines_with(r.output, "PARITY");
  ASSERT_EQ(static_cast<int>(ok.size()), n) << r.output;
  for (auto& l : ok) EXPECT_NE(l.find(" OK"), std::string::npos) << l;
}

INSTANTIATE_TEST_SUITE_P(Grid, CoreParity,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values("full", "grad-op", "none"),
                                            ::testing::Values("plain", "nosync", "rs")),
                         [](const auto& info) {
                           auto s = std::get<1>(info.param);
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return "N" + std::to_string(std::get<0>(info.param)) + "_" + s + "_" +
                                  std::get<2>(info.param);
                         });

// Prefetch and asynchronous reduce-scatter keep parity, also with delays
// injected to expose a missing wait: rank r sleeps 5r ms before each
// micro-step, and every collective is held back 2(r+1) ms before it runs
// (FSDP_TEST_COMM_DELAY_MS: the worker's delaying communicator,
// tests/workers/delayed_comm.h), so prefetched all-gathers and reduce-scatters
// are still running when the engine would read their outputs without waiting.
using PrefetchParam = std::tuple<int, std::string, std::string>;
class CorePrefetch : public ::testing::TestWithParam<PrefetchParam> {};
TEST_P(CorePrefetch, KeepsParity) {
  auto [n, strategy, prefetch] = GetParam();
  auto r = run_ranks(n, "core_parity", {strategy, "rs", prefetch}, {"FSDP_TEST_DELAY=1", "FSDP_TEST_COMM_DELAY_MS=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ok = lines_with(r.output, "PARITY");
  ASSERT_EQ(static_cast<int>(ok.size()), n) << r.output;
  for (auto& l : ok) EXPECT_NE(l.find(" OK"), std::string::npos) << l;
}
INSTANTIATE_TEST_SUITE_P(Grid, CorePrefetch,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values("full", "grad-op"),
                                            ::testing::Values("pre", "post", "fwd")),
                         [](const auto& info) {
                           auto s = std::get<1>(info.param);
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return "N" + std::to_string(std::get<0>(info.param)) + "_" + s + "_" +
                                  std::get<2>(info.param);
                         });

TEST(CoreMixedPrecision, Bf16TrainsCloseToFp32) {
  auto r = run_ranks(2, "core_parity", {"full", "plain", "none", "bf16"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ok = lines_with(r.output, "PARITY");
  ASSERT_EQ(ok.size(), 2u) << r.output;
  for (auto& l : ok) EXPECT_NE(l.find(" OK"), std::string::npos) << l;
}

// ---------------------------------------------------------------- ledger
struct LedgerCase {
  int n;
  std::string strategy;
};
class CoreLedger : public ::testing::TestWithParam<LedgerCase> {};

// Runs in each rank (FSDP_IN_RANKS): one training step, then this rank's
// traffic of the next step and its ledger against the formulas; sums over
// the ranks through the communicator.
TEST_P(CoreLedger, RestingStateAndTrafficMatchTheGuideFormulas) {
  const auto c = GetParam();
  FSDP_IN_RANKS(c.n);
  auto comm = make_communicator_from_env();
  ASSERT_EQ(comm->world_size(), c.n);
  torch::manual_seed(1);
  Net net(7, 12, 5, 3);
  FsdpOptions o;
  o.strategy = parse_strategy(c.strategy);
  o.wrap = WrapPolicy::predicate(
      [](const std::string&, const torch::nn::Module& m, int64_t) {
        return dynamic_cast<const BlockImpl*>(&m) || dynamic_cast<const GateImpl*>(&m);
      },
      "Block and Gate");
  auto model = fully_shard(net, comm, o);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto x = torch::randn({4, 7});
  CommCounters t;
  for (int step = 0; step < 2; ++step) {
    comm->reset_counters();
    auto loss = model.forward(x).pow(2).mean();
    loss.backward();
    model->wait_pending();
    t = comm->counters();  // step 1's: the steady state
    opt.step();
    opt.zero_grad();
  }
  const Ledger l = model->ledger(&opt);
  int64_t padded = 0, numel = 0, local = 0;
  for (auto& u : model->units()) padded += u.padded_numel, numel += u.numel;
  for (auto& s : model->named_shards()) local += s.hi - s.lo;
  ASSERT_GT(numel, 0);

  const int64_t N = c.n, padded_bytes = padded * 4, S_bytes = padded_bytes / N;
  const int64_t ag = t[CollectiveKind::ALL_GATHER].bytes_sent, rs = t[CollectiveKind::REDUCE_SCATTER].bytes_sent;
  const int64_t ar = t[CollectiveKind::ALL_REDUCE].bytes_sent;
  if (c.strategy == "full") {
    // Forward all-gather + backward all-gather + reduce-scatter: (N-1)/N x 3P.
    EXPECT_EQ(ag, 2 * (N - 1) * S_bytes);
    EXPECT_EQ(rs, (N - 1) * S_bytes);
    EXPECT_EQ(ar, 0);
  } else if (c.strategy == "grad-op") {
    EXPECT_EQ(ag, (N - 1) * S_bytes);
    EXPECT_EQ(rs, (N - 1) * S_bytes);
  } else {
    EXPECT_EQ(ag, 0);
    EXPECT_EQ(rs, 0);
  }
  // At rest: P = G = padded/N (fp32), O = Adam's 2 x this rank's elements.
  if (c.strategy != "none") {
    EXPECT_EQ(l.P, S_bytes);
    EXPECT_EQ(l.G, S_bytes);
  } else {
    EXPECT_EQ(l.P, numel * 4);
    EXPECT_EQ(l.G, numel * 4);
  }
  EXPECT_EQ(l.O, 2 * 4 * local);
  // Host-shared units (ranks of one host, the default): every unit once per
  // host in fp32, of which this rank's share is its P.
  // Their gradients are written in blocks of this rank's that its peers
  // read, kept for the next backward: counted, one of them per unit at most
  // (every unit here fits in a page).
  if (comm->shares_host_memory() && c.strategy != "none") {
    EXPECT_EQ(l.shared_per_host, padded_bytes);
    EXPECT_EQ(l.shared_per_host / N, l.P);
    EXPECT_NE(l.str().find("host-shared units"), std::string::npos) << l.str();
    const int64_t page = ::sysconf(_SC_PAGESIZE);
    EXPECT_GE(l.peer_memory, page);
    EXPECT_LE(l.peer_memory, page * static_cast<int64_t>(model->units().size()));
    EXPECT_NE(l.str().find("peer_mem"), std::string::npos) << l.str();
  } else {
    EXPECT_EQ(l.shared_per_host, 0);
    EXPECT_EQ(l.peer_memory, 0);
  }

  // Over all ranks (fp64 sums: exact at these sizes).
  auto sums = torch::tensor({double(local), double(ar)}, torch::kFloat64);
  comm->all_reduce(sums, ReduceOp::SUM, {"test sums"})->wait();
  if (c.strategy != "none")
    EXPECT_EQ(int64_t(sums[0].item<double>()), numel);  // the shards cover every element exactly once
  else
    EXPECT_EQ(int64_t(sums[1].item<double>()), 2 * (N - 1) * numel * 4);  // ring all-reduce: 2(N-1)/N x P per rank
}

INSTANTIATE_TEST_SUITE_P(Grid, CoreLedger,
                         ::testing::Values(LedgerCase{1, "full"}, LedgerCase{2, "full"}, LedgerCase{3, "full"},
                                           LedgerCase{4, "full"}, LedgerCase{2, "grad-op"},
                                           LedgerCase{3, "grad-op"}, LedgerCase{2, "none"},
                                           LedgerCase{3, "none"}),
                         [](const auto& info) {
                           auto s = info.param.strategy;
                           for (auto& ch : s)
                             if (ch == '-') ch = '_';
                           return "N" + std::to_string(info.param.n) + "_" + s;
                         });

// ---------------------------------------------------------------- misuse
struct BypassImpl : torch::nn::Module {
  Block block{nullptr};
  BypassImpl() { block = register_module("block", Block(4)); }
  torch::Tensor forward(const torch::Tensor& x) { return block->forward(x); }  // not through fsdp::call
};
TORCH_MODULE(Bypass);

TEST(CoreMisuse, CallingAUnitOutsideItsPathIsAClearError) {
  Bypass net;
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, make_local_communicator(), o);
  try {
    model.forward(torch::randn({2, 4}));
    FAIL() << "expected an error";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fsdp::call"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'block'"), std::string::npos) << e.what();
  }
}

TEST(CoreMisuse, WrappingTwiceIsAClearError) {
  Net net;
  auto a = fully_shard(net, make_local_communicator());
  try {
    auto b = fully_shard(net, make_local_communicator());
    FAIL() << "expected an error";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already part of a fully_shard"), std::string::npos) << e.what();
  }
}

TEST(CoreMisuse, OptimizerOnTheUnwrappedModelIsDetected) {
  Net net;
  auto model = fully_shard(net, make_local_communicator());
  torch::optim::Adam wrong(net->parameters());
  EXPECT_THROW(verify_optimizer(*model, wrong), fsdp::Error);
  torch::optim::Adam right(model->parameters());
  EXPECT_NO_THROW(verify_optimizer(*model, right));
}

TEST(CoreWrap, SequentialNeedsNoChangeAndNamesStay) {
  torch::manual_seed(0);
  torch::nn::Sequential ref(torch::nn::Linear(8, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  torch::manual_seed(0);
  torch::nn::Sequential seq(torch::nn::Linear(8, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  FsdpOptions o;
  o.wrap = WrapPolicy::size_based(20);
  auto model = fully_shard(seq, make_local_communicator(), o);
  EXPECT_EQ(model->units().size(), 3u);  // root + two Linear units
  auto x = torch::randn({4, 8});
  auto y = model.forward(x);
  EXPECT_TRUE(torch::allclose(y, ref->forward(x)));
  auto full = model->full_state();
  std::vector<std::string> names;
  for (auto& kv : full) names.push_back(kv.first);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
}

// An output head that shares the embedding's weight (tied weights).
struct TiedHeadImpl : torch::nn::Module {
  torch::Tensor weight;
  explicit TiedHeadImpl(const torch::Tensor& w) { weight = register_parameter("weight", w); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, weight.t()); }
};
TORCH_MODULE(TiedHead);

struct TiedImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  TiedHead head{nullptr};
  TiedImpl() {
    emb = register_module("emb", torch::nn::Embedding(10, 4));
    head = register_module("head", TiedHead(emb->weight));
  }
  torch::Tensor forward(const torch::Tensor& idx) { return fsdp::call(head, fsdp::call(emb, idx)); }
};
TORCH_MODULE(Tied);

TEST(CoreWrap, TiedWeightsSplitAcrossSiblingUnitsIsAClearError) {
  Tied net;
  FsdpOptions o;
  o.wrap = WrapPolicy::predicate([](const std::string& n, const torch::nn::Module&, int64_t) {
    return n == "emb" || n == "head";
  });
  try {
    auto model = fully_shard(net, make_local_communicator(), o);
    FAIL() << "expected an error";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared by"), std::string::npos) << e.what();
  }
}

TEST(CoreWrap, TiedWeightsInOneUnitTrain) {
  Tied net;
  auto model = fully_shard(net, make_local_communicator());
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto idx = torch::tensor({1, 2, 3}, torch::kLong);
  auto before = model->full_state()[0].second.clone();
  model.forward(idx).sum().backward();
  opt.step();
  auto full = model->full_state();
  ASSERT_EQ(full.size(), 2u);  // emb.weight and head.weight: one tensor, two names
  EXPECT_TRUE(torch::equal(full[0].second, full[1].second));
  EXPECT_FALSE(torch::equal(full[0].second, before));
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
