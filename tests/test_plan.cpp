// Tests of the planner (include/fsdp/plan.h): the FSDP guide's formulas with exact
// numbers, the decision tree, the GPT units and activation estimate (the
// latter measured against a real libtorch forward/backward with the counting
// allocator), and the `fsdp plan` command.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <c10/core/CPUAllocator.h>

#include <cmath>
#include <mutex>
#include <unordered_map>

#include "fsdp/errors.h"
#include "usage.h"
#include "fsdp/memory.h"
#include "fsdp/plan.h"
// The gpt example's planner code, compiled in here (the example has no library of its own).
#include "gpt/plan_gpt.h"
#include "test_util.h"

namespace {

using namespace fsdp::plan;
using namespace gpt;
using fsdp::ShardingStrategy;

PlanOptions opts(int world, ShardingStrategy s = ShardingStrategy::FULL_SHARD) {
  PlanOptions o;
  o.world = world;
  o.strategy = s;
  return o;
}

TEST(Plan, GptMiniDefaultsHave4_90MParameters) {
  GptShape s;  // V=256 T=128 d=256 L=6 h=4
  EXPECT_EQ(s.num_params(), 4903168);
  auto units = gpt_units(s, "block");
  ASSERT_EQ(units.size(), 7u);
  EXPECT_EQ(units[0].name, "");
  EXPECT_EQ(units[0].numel, 256 * 256 + 128 * 256 + 2 * 256 + 256 * 256 + 256);  // tok, pos, ln, head
  for (int i = 1; i <= 6; ++i) {
    EXPECT_EQ(units[i].name, "blocks." + std::to_string(i - 1));
    EXPECT_EQ(units[i].numel, 12 * 256 * 256 + 13 * 256);
  }
  int64_t sum = 0;
  for (auto& u : units) sum += u.numel;
  EXPECT_EQ(sum, s.num_params());
  auto one = gpt_units(s, "none");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].numel, s.num_params());
}

TEST(Plan, SizePolicySplitsBlocksIntoLinears) {
  GptShape s;
  const int64_t d = s.dim;
  // 3d^2: qkv (3d^2+3d), fc, out become units; each block's rest (ln1, proj,
  // ln2) is too small and rolls up into "blocks" (6 x 66816 >= 3d^2).
  auto u = gpt_units(s, "size:" + std::to_string(3 * d * d));
  ASSERT_EQ(u.size(), 2u + 3 * 6);
  EXPECT_EQ(u[0].name, "");
  EXPECT_EQ(u[0].numel, 164608);
  EXPECT_EQ(u[1].name, "blocks");
  EXPECT_EQ(u[1].numel, 6 * (d * d + d + 4 * d));
  EXPECT_EQ(u[2].name, "blocks.0.qkv");
  EXPECT_EQ(u[3].name, "blocks.0.fc");
  EXPECT_EQ(u[4].name, "blocks.0.out");
  int64_t sum = 0;
  for (auto& x : u) sum += x.numel;
  EXPECT_EQ(sum, s.num_params());
  EXPECT_THROW(gpt_units(s, "size:0"), fsdp::Error);
  EXPECT_THROW(gpt_units(s, "layer"), fsdp::UsageError);
}

TEST(Plan, LedgerAndTrafficExactForTwoRanks) {
  GptShape s;
  Plan p = make_plan(gpt_units(s, "block"), 1000, opts(2));
  EXPECT_EQ(p.numel, 4903168);
  EXPECT_EQ(p.padded_numel, 4903168);  // every unit is even
  EXPECT_EQ(p.P_full, 4903168 * 4);
  EXPECT_EQ(p.P, 4903168 / 2 * 4);
  EXPECT_EQ(p.G, p.P);
  EXPECT_EQ(p.O, 2 * p.P);                // Adam
  EXPECT_EQ(p.rest, 4903168 * 4 * 4 / 2);  // (P+G+O)/N
  EXPECT_EQ(p.P_block, 789760 * 4);
  EXPECT_EQ(p.P_block_unit, "blocks.0");
  // With (almost) no activations the first reduce-scatter is the peak: the
  // root unit and blocks.N-2 gathered, the root's gradient, blocks.N-1's
  // gradient in flight (at N = 2 the ring needs no staging).
  EXPECT_EQ(p.staging, 0);
  // N = 3: 4 slots of one piece; the block's 1.004 MiB shard (263254
  // elements) is cut into 2 pieces of at most 1 MiB.
  Plan p3 = make_plan(gpt_units(s, "block"), 1000, opts(3));
  EXPECT_EQ(p3.staging, 4 * ((263254 + 1) / 2) * 4);
  EXPECT_EQ(p.working, 164608 * 4 + 789760 * 4 + 164608 * 4 + 789760 * 4 + p.staging);
  EXPECT_EQ(p.peak_at, "first reduce-scatter");
  EXPECT_EQ(p.peak, p.rest + p.working + 1000);
  // With activations the backward start is: root + the block unsharded.
  Plan big = make_plan(gpt_units(s, "block"), 100 << 20, opts(2), 20 << 20);
  EXPECT_EQ(big.peak_at, "backward start");
  EXPECT_EQ(big.working, 164608 * 4 + 789760 * 4);
  // FULL_SHARD 3P(N-1)/N, SHARD_GRAD_OP and DDP 2P(N-1)/N
  EXPECT_EQ(p.full_shard.total(), 3 * 4903168 * 4 / 2);
  EXPECT_EQ(p.full_shard.all_gather, 2 * 4903168 * 4 / 2);
  EXPECT_EQ(p.full_shard.reduce_scatter, 4903168 * 4 / 2);
  EXPECT_EQ(p.shard_grad_op.total(), 2 * 4903168 * 4 / 2);
  EXPECT_EQ(p.no_shard.all_reduce, 2 * 4903168 * 4 / 2);
  EXPECT_EQ(p.traffic.total(), p.full_shard.total());
}

// Activation checkpointing: blocks keep their input, the worst recompute
// becomes a moment of its own; --ac parses.
TEST(Plan, ActivationCheckpointingKeepsInputsAndAddsTheRecomputeMoment) {
  GptShape s;  // L=6 d=256 T=128 B=8 V=256 h=4
  EXPECT_EQ(gpt::checkpoint_every("none"), 0);
  EXPECT_EQ(gpt::checkpoint_every("block"), 1);
  EXPECT_EQ(gpt::checkpoint_every("every:3"), 3);
  for (const char* bad : {"every:0", "every:", "every:x", "blocks", "every:-1", "every:99999999"})
    EXPECT_THROW(gpt::checkpoint_every(bad), fsdp::UsageError) << bad;
  const auto none = gpt_activations(s, 4), all = gpt_activations(s, 4, "block"), half = gpt_activations(s, 4, "every:2");
  const int64_t BTd = 8 * 128 * 256 * 4;
  EXPECT_EQ(none.checkpointed, 0);
  EXPECT_EQ(none.at_recompute, 0);
  EXPECT_EQ(all.checkpointed, 6);
  EXPECT_EQ(half.checkpointed, 3);  // blocks 0, 2, 4
  EXPECT_EQ(all.saved_per_checkpointed, BTd + 5056);
  EXPECT_EQ(none.total - all.total, 6 * (none.per_block - all.saved_per_checkpointed));
  EXPECT_EQ(none.total - half.total, 3 * (none.per_block - half.saved_per_checkpointed));
  // The first recompute (block 5): six kept inputs and block 5 again.
  EXPECT_EQ(all.at_recompute, 6 * all.saved_per_checkpointed + all.during_recompute);
  // every:2: block 4 recomputes first; blocks 1 and 3 kept everything.
  EXPECT_EQ(half.at_recompute, 3 * half.saved_per_checkpointed + 2 * half.per_block + half.during_recompute);
  EXPECT_EQ(gpt::gpt_recompute(s, "block", 4, "none").activation_bytes, 0);
  const auto rec = gpt::gpt_recompute(s, "block", 4, "block");
  EXPECT_EQ(rec.activation_bytes, all.at_recompute);
  EXPECT_EQ(rec.grad_bytes, -1);
  // Planned: the recompute is the peak, with the root's gradient beside it.
  Plan plain = make_plan(gpt_units(s, "block"), none.total, opts(2), gpt_released(s, "block"));
  Plan ac = make_plan(gpt_units(s, "block"), all.total, opts(2), gpt_released(s, "block", 4, "block"), rec);
  EXPECT_EQ(ac.peak_at, "recompute");
  EXPECT_EQ(ac.A, all.at_recompute);
  EXPECT_EQ(ac.A_start, all.total);
  EXPECT_EQ(ac.recompute_grad, 164608 * 4);
  EXPECT_EQ(ac.working, 164608 * 4 + 789760 * 4 + 164608 * 4);
  EXPECT_EQ(ac.peak, ac.rest + ac.working + ac.A);
  EXPECT_LT(ac.peak, plain.peak);
  EXPECT_EQ(ac.traffic.total(), plain.traffic.total());  // recomputing gathers nothing more
  // One unit: the recompute where the gradients so far and the activations add up most.
  const auto one = gpt::gpt_recompute(s, "none", 4, "block");
  EXPECT_GT(one.grad_bytes, 0);
  Plan ac1 = make_plan(gpt_units(s, "none"), all.total, opts(2), gpt_released(s, "none", 4, "block"), one);
  EXPECT_EQ(ac1.recompute_grad, one.grad_bytes);
}

TEST(Plan, PaddingToMultiplesOfNForThreeRanks) {
  GptShape s;
  Plan p = make_plan(gpt_units(s, "block"), 0, opts(3));
  // root 164608 -> 164610, block 789760 -> 789762
  EXPECT_EQ(p.units[0].padded_numel, 164610);
  EXPECT_EQ(p.units[0].shard_numel, 54870);
  EXPECT_EQ(p.units[1].padded_numel, 789762);
  EXPECT_EQ(p.padded_numel, 164610 + 6 * 789762);
  EXPECT_EQ(p.full_shard.total(), 3 * (p.padded_numel / 3) * 2 * 4);
  EXPECT_EQ(p.P, p.padded_numel / 3 * 4);
}

TEST(Plan, OptimizerDtypeAndStrategyChangeTheLedger) {
  std::vector<UnitSpec> u = {{"", 1000}, {"a", 3000}};
  auto o = opts(4);
  o.optimizer = Optimizer::SGD_MOMENTUM;
  Plan sgd = make_plan(u, 0, o);
  EXPECT_EQ(sgd.O, sgd.P);
  o.optimizer = Optimizer::SGD;
  EXPECT_EQ(make_plan(u, 0, o).O, 0);
  o = opts(4);
  o.param_bytes = 2;  // bf16 compute and communication, fp32 master shards
  Plan bf = make_plan(u, 0, o);
  EXPECT_EQ(bf.P, 4000 / 4 * 4);
  EXPECT_EQ(bf.P_block, 3000 * 2);
  EXPECT_EQ(bf.full_shard.total(), 3 * 3000 * 2);  // 3 x (N-1)/N x 4000 x 2 B
  Plan ns = make_plan(u, 0, opts(4, ShardingStrategy::NO_SHARD));
  EXPECT_EQ(ns.P, 4000 * 4);
  EXPECT_EQ(ns.rest, 4 * 4000 * 4);
  EXPECT_EQ(ns.working, 0);
  Plan go = make_plan(u, 0, opts(4, ShardingStrategy::SHARD_GRAD_OP));
  EXPECT_EQ(go.working, 4000 * 4 + 3000 * 4);
  o = opts(4);
  o.micro_steps = 4;
  EXPECT_EQ(make_plan(u, 0, o).full_shard.total(), 4 * 3 * 3000 * 4);
  o = opts(1);
  EXPECT_EQ(make_plan(u, 0, o).full_shard.total(), 0);  // one rank sends nothing
  o = opts(0);
  EXPECT_THROW(make_plan(u, 0, o), fsdp::Error);
}

TEST(Plan, RecommendFollowsTheSeedsDecisionTree) {
  GptShape s;
  auto cands = gpt_candidates(s);
  const int64_t A = gpt_activations(s).total;
  auto o = opts(4);
  // Plenty: replicas fit.
  auto r = recommend(cands, A, o, int64_t(8) << 30);
  EXPECT_TRUE(r.fits);
  EXPECT_EQ(r.strategy, ShardingStrategy::NO_SHARD);
  EXPECT_NE(r.why.find("NO_SHARD"), std::string::npos);
  // Just below the replica's peak: SHARD_GRAD_OP.
  Plan ns = make_plan(cands[0].units, A, opts(4, ShardingStrategy::NO_SHARD), cands[0].released);
  r = recommend(cands, A, o, ns.peak);  // 90% rule: NO_SHARD no longer fits
  EXPECT_TRUE(r.fits);
  EXPECT_EQ(r.strategy, ShardingStrategy::SHARD_GRAD_OP);
  // Tight: FULL_SHARD, and the wrapping gets finer as the budget shrinks.
  Plan fb = make_plan(gpt_units(s, "block"), A, opts(4), gpt_released(s, "block"));
  r = recommend(cands, A, o, int64_t(fb.peak / 0.9) + 1);
  EXPECT_TRUE(r.fits);
  EXPECT_EQ(r.strategy, ShardingStrategy::FULL_SHARD);
  EXPECT_EQ(r.wrap, "block");
  Plan fine = make_plan(cands.back().units, A, opts(4), cands.back().released);
  r = recommend(cands, A, o, int64_t(fine.peak / 0.9) + 1);
  EXPECT_EQ(r.strategy, ShardingStrategy::FULL_SHARD);
  EXPECT_NE(r.wrap, "block");
  EXPECT_LT(r.plan.P_block, fb.P_block);
  // Impossible: says so, and names activations as the term to cut.
  r = recommend(cands, A, o, A / 2);
  EXPECT_FALSE(r.fits);
  EXPECT_NE(r.why.find("--batch"), std::string::npos) << r.why;
}

// Across hosts (hosts > 1) recommend() weighs HYBRID_SHARD and
// HYBRID_SHARD_ZERO2 too (include/fsdp/plan.h, recommend()). GPT-mini at
// N = 8 on 2 hosts: S = 4 ranks per shard group, R = 2 replicas.
struct AcrossHosts {
  GptShape s;
  std::vector<Candidate> cands = gpt_candidates(s);
  int64_t A = gpt_activations(s).total;
  PlanOptions o = [] {
    PlanOptions o = opts(8);
    o.hosts = 2;
    return o;
  }();
  static constexpr int64_t N = 8, S = 4, R = 2;
  // The formulas: bytes crossing each host's link per step (fp32, wrap block).
  int64_t padded(int n) const {
    int64_t p = 0;
    for (auto& u : gpt_units(s, "block")) p += (u.numel + n - 1) / n * n;
    return p;
  }
  // The collectives compose the tiers: each of a host's N/R ranks sends
  // of the (N-1) blocks of each of its 3 passes across.
  int64_t full_shard_across() const { return (N / R) * 3 * (R - 1) * (padded(N) / N) * 4; }
  int64_t hybrid_across() const { return S * (2 * (R - 1) * (padded(S) / S) / R * 4); }  // S ranks x 2(R-1)/R x P/S
};
std::string mib(int64_t x) { return fsdp::memory::format_bytes(x); }

TEST(Plan, RecommendOnOneHostIsTheTreeWhateverTheTierFlags) {
  GptShape s;
  auto cands = gpt_candidates(s);
  const int64_t A = gpt_activations(s).total;
  for (int64_t budget : {int64_t(8) << 30, int64_t(160) << 20, int64_t(151) << 20, int64_t(100) << 20}) {
    auto plain = recommend(cands, A, opts(4), budget);
    auto o = opts(4);
    o.hosts = 1;
    o.intra_bandwidth = 10e9, o.inter_bandwidth = 125e6, o.shard_group = 2;
    auto r = recommend(cands, A, o, budget);
    EXPECT_EQ(r.strategy, plain.strategy) << budget;
    EXPECT_EQ(r.wrap, plain.wrap) << budget;
    EXPECT_EQ(r.fits, plain.fits) << budget;
    EXPECT_EQ(r.why, plain.why) << budget;
    EXPECT_EQ(r.rule, "tree");
    EXPECT_TRUE(r.strategies.empty());
  }
}

TEST(Plan, RecommendAcrossHostsPrefersHybridWhenItFits) {
  AcrossHosts h;
  // 157 MiB: SHARD_GRAD_OP and HYBRID_SHARD_ZERO2 do not fit, FULL_SHARD and
  // HYBRID_SHARD do (wrap block); without rates the fewest bytes across win.
  const int64_t budget = int64_t(157) << 20, limit = static_cast<int64_t>(budget * 0.9);
  auto r = recommend(h.cands, h.A, h.o, budget);
  ASSERT_TRUE(r.fits) << r.why;
  EXPECT_EQ(r.strategy, ShardingStrategy::HYBRID_SHARD) << r.why;
  EXPECT_EQ(r.wrap, "block");
  EXPECT_EQ(r.rule, "inter_host_bytes");
  EXPECT_EQ(r.one_host_choice, ShardingStrategy::FULL_SHARD);
  auto o = h.o;
  o.strategy = ShardingStrategy::HYBRID_SHARD;
  const Plan hp = make_plan(gpt_units(h.s, "block"), h.A, o, gpt_released(h.s, "block"));
  EXPECT_EQ(r.plan.peak, hp.peak);
  EXPECT_EQ(r.plan.rest, 4 * (h.padded(4) / 4) * 4);  // (P+G+O)/S with Adam: 4 P/S
  ASSERT_EQ(r.strategies.size(), 5u);
  EXPECT_EQ(r.strategies[2].strategy, ShardingStrategy::FULL_SHARD);
  EXPECT_EQ(r.strategies[4].strategy, ShardingStrategy::HYBRID_SHARD);
  EXPECT_EQ(r.strategies[2].host_inter, h.full_shard_across());
  EXPECT_EQ(r.strategies[4].host_inter, h.hybrid_across());
  EXPECT_FALSE(r.strategies[1].fits);  // SHARD_GRAD_OP
  EXPECT_FALSE(r.strategies[3].fits);  // HYBRID_SHARD_ZERO2
  const std::string reason = "HYBRID_SHARD fits (peak " + mib(hp.peak) + " <= " + mib(limit) +
                             ", 90% of the budget) and sends " + mib(h.hybrid_across()) +
                             " per step across hosts against " + mib(h.full_shard_across()) + " for FULL_SHARD";
  EXPECT_NE(r.why.find(reason), std::string::npos) << reason << "\n" << r.why;
  EXPECT_NE(r.why.find("- HYBRID_SHARD_ZERO2, wrap size:65536: rest (P+G+O)/S"), std::string::npos) << r.why;
}

TEST(Plan, RecommendAcrossHostsKeepsFullShardWhenHybridDoesNotFit) {
  AcrossHosts h;
  // 148 MiB: FULL_SHARD fits with wrap block; HYBRID_SHARD's (P+G+O)/S does
  // not leave room even with the finest wrapping.
  const int64_t budget = int64_t(148) << 20, limit = static_cast<int64_t>(budget * 0.9);
  auto r = recommend(h.cands, h.A, h.o, budget);
  ASSERT_TRUE(r.fits) << r.why;
  EXPECT_EQ(r.strategy, ShardingStrategy::FULL_SHARD) << r.why;
  EXPECT_EQ(r.wrap, "block");
  EXPECT_EQ(r.rule, "tree");
  ASSERT_EQ(r.strategies.size(), 5u);
  const StrategyFit& hy = r.strategies[4];
  EXPECT_FALSE(hy.fits);
  EXPECT_EQ(hy.wrap, "size:65536");
  EXPECT_GT(hy.peak, limit);
  EXPECT_EQ(hy.rest, 4 * (h.padded(4) / 4) * 4);
  const std::string reason = "Neither HYBRID variant fits: HYBRID_SHARD holds (P+G+O)/S = " + mib(hy.rest) +
                             " per rank at rest (S = 4 instead of N = 8) and peaks at " + mib(hy.peak) + " > " +
                             mib(limit) + ". FULL_SHARD stays (the one-host choice): each host sends " +
                             mib(h.full_shard_across()) + " per step across hosts.";
  EXPECT_NE(r.why.find(reason), std::string::npos) << reason << "\n" << r.why;
}

TEST(Plan, RecommendAcrossHostsWithRatesTakesTheLeastTime) {
  AcrossHosts h;
  h.o.intra_bandwidth = 10e9;   // per rank inside a host
  h.o.inter_bandwidth = 125e6;  // 1 Gbit/s per host
  // 157 MiB: only FULL_SHARD and HYBRID_SHARD fit (wrap block). HYBRID_SHARD
  // is faster: 3P(S-1)/S inside at 10 GB/s + S x 2(R-1)/R x P/S across at
  // 1 Gbit/s, against FULL_SHARD's 3P(N-1)/N of which every rank sends
  // (H-1)/(N-1) across (the collectives compose the tiers), S ranks a host.
  const int64_t budget = int64_t(157) << 20;
  auto r = recommend(h.cands, h.A, h.o, budget);
  ASSERT_TRUE(r.fits) << r.why;
  EXPECT_EQ(r.strategy, ShardingStrategy::HYBRID_SHARD) << r.why;
  EXPECT_EQ(r.rule, "comm_time");
  EXPECT_EQ(r.one_host_choice, ShardingStrategy::FULL_SHARD);
  EXPECT_EQ(r.wrap, "block");
  ASSERT_EQ(r.strategies.size(), 5u);
  const StrategyFit& hy = r.strategies[4];
  const StrategyFit& fs = r.strategies[2];
  ASSERT_EQ(hy.strategy, ShardingStrategy::HYBRID_SHARD);
  ASSERT_EQ(fs.strategy, ShardingStrategy::FULL_SHARD);
  const int64_t shard_s = h.padded(4) / 4 * 4, shard_n = h.padded(8) / 8 * 4;  // bytes of one block
  EXPECT_EQ(hy.tiers.intra, 3 * 3 * shard_s);
  EXPECT_EQ(hy.host_inter, h.hybrid_across());
  EXPECT_EQ(fs.tiers.intra, 3 * 7 * shard_n - 3 * shard_n);
  EXPECT_EQ(fs.host_inter, h.full_shard_across());
  EXPECT_DOUBLE_EQ(hy.tiers.seconds, hy.tiers.intra / 10e9 + 4.0 * hy.tiers.inter / 125e6);
  EXPECT_DOUBLE_EQ(fs.tiers.seconds, fs.tiers.intra / 10e9 + 4.0 * fs.tiers.inter / 125e6);
  EXPECT_LT(hy.tiers.seconds, fs.tiers.seconds);
  char t1[32], t2[32];
  std::snprintf(t1, sizeof t1, "~%.1f ms", 1e3 * hy.tiers.seconds);
  std::snprintf(t2, sizeof t2, "~%.1f ms", 1e3 * fs.tiers.seconds);
  const std::string reason = std::string("HYBRID_SHARD fits (peak ") + mib(hy.peak) + " <= " +
                             mib(static_cast<int64_t>(budget * 0.9)) + ", 90% of the budget) and sends " +
                             mib(hy.host_inter) + " per step across hosts against " + mib(fs.host_inter) +
                             " for FULL_SHARD: its communication takes " + t1 + " per step against " + t2;
  EXPECT_NE(r.why.find(reason), std::string::npos) << reason << "\n" << r.why;
  // Everything fits: NO_SHARD's composed all-reduce crosses as much as
  // HYBRID_SHARD_ZERO2's replica all-reduce (2(R-1)/R x P per host) and
  // moves as much inside: a tie, so the one-host choice stays.
  r = recommend(h.cands, h.A, h.o, int64_t(8) << 30);
  EXPECT_EQ(r.strategy, ShardingStrategy::NO_SHARD) << r.why;
  EXPECT_EQ(r.rule, "comm_time");
  EXPECT_NE(r.why.find("NO_SHARD stays (the one-host choice"), std::string::npos) << r.why;
}

TEST(Plan, CommandRecommendsAcrossHostsWithTheReason) {
  AcrossHosts h;
  auto j = fsdp::testing::run_command({fsdp::testing::bin_path("fsdp"), "plan", "--world", "8", "--hosts", "2",
                                       "--strategy", "auto", "--budget", "157MiB", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.output;
  auto rec = nlohmann::json::parse(j.output)["recommendation"];
  EXPECT_EQ(rec["strategy"], "HYBRID_SHARD");
  EXPECT_EQ(rec["wrap"], "block");
  EXPECT_EQ(rec["rule"], "inter_host_bytes");
  EXPECT_EQ(rec["one_host_choice"], "FULL_SHARD");
  ASSERT_EQ(rec["strategies"].size(), 5u);
  EXPECT_EQ(rec["strategies"][4]["strategy"], "HYBRID_SHARD");
  EXPECT_EQ(rec["strategies"][4]["host_inter_bytes"].get<int64_t>(), h.hybrid_across());
  EXPECT_EQ(rec["strategies"][2]["host_inter_bytes"].get<int64_t>(), h.full_shard_across());
  EXPECT_NE(rec["why"].get<std::string>().find("HYBRID_SHARD fits (peak "), std::string::npos) << rec["why"];
  auto text = fsdp::testing::run_command({fsdp::testing::bin_path("fsdp"), "plan", "--world", "8", "--hosts", "2",
                                          "--strategy", "auto", "--budget", "148MiB"});
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("=> recommended: FULL_SHARD with --wrap block"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("Neither HYBRID variant fits"), std::string::npos) << text.output;
}

TEST(Plan, BandwidthParsingAndLoopbackMeasurement) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("2GB/s"), 2e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("500MiB/s"), 500.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(parse_bandwidth("10Gbit/s"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1e9"), 1e9);
  EXPECT_THROW(parse_bandwidth("fast"), fsdp::Error);
  EXPECT_THROW(parse_bandwidth("-1GB/s"), fsdp::Error);
  double bw = measure_loopback_bandwidth(int64_t(32) << 20);
  EXPECT_GT(bw, 10e6) << "loopback TCP slower than 10 MB/s?";
  auto o = opts(2);
  o.bandwidth = 1e9;
  Plan p = make_plan({{"", 1000000}}, 0, o);
  EXPECT_DOUBLE_EQ(p.comm_seconds, 3 * 500000 * 4 / 1e9);
}

// ---------------------------------------------------------------------------
// The activation estimate against libtorch: GPT-mini's forward exactly as
// examples/gpt/model.cpp writes it (docs/GPT_MINI.md), measured with the counting
// allocator.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t h) : d_(d), h_(h) {
    auto ln = torch::nn::LayerNormOptions({d}).eps(1e-5);
    ln1 = register_module("ln1", torch::nn::LayerNorm(ln));
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
    ln2 = register_module("ln2", torch::nn::LayerNorm(ln));
    fc = register_module("fc", torch::nn::Linear(d, 4 * d));
    out = register_module("out", torch::nn::Linear(4 * d, d));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = d_, hs = C / h_;
    auto parts = qkv(ln1(x)).split(C, 2);
    auto q = parts[0].view({B, T, h_, hs}).transpose(1, 2);
    auto k = parts[1].view({B, T, h_, hs}).transpose(1, 2);
    auto v = parts[2].view({B, T, h_, hs}).transpose(1, 2);
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hs)));
    auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
    att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
    auto r = x + proj(y);
    return r + out(torch::gelu(fc(ln2(r))));
  }
  int64_t d_, h_;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
};

// Counts bytes like fsdp::memory's allocator, but keeps data == context so
// kernels that call raw_allocate (GELU's CPU kernel does) work: the size and
// the inner DataPtr live in a side table. Installed only while measuring.
struct MeasuringAllocator final : c10::Allocator {
  static std::mutex mu;
  static std::unordered_map<void*, std::pair<c10::DataPtr, int64_t>> live;
  static int64_t current, peak;
  c10::Allocator* base = nullptr;
  static void release(void* p) {
    std::lock_guard<std::mutex> g(mu);
    auto it = live.find(p);
    if (it == live.end()) return;
    current -= it->second.second;
    live.erase(it);  // frees through the inner allocator's deleter
  }
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base->allocate(n);
    void* p = inner.get();
    auto device = inner.device();
    std::lock_guard<std::mutex> g(mu);
    current += (int64_t)n;
    peak = std::max(peak, current);
    live.emplace(p, std::make_pair(std::move(inner), (int64_t)n));
    return c10::DataPtr(p, p, &release, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
std::mutex MeasuringAllocator::mu;
std::unordered_map<void*, std::pair<c10::DataPtr, int64_t>> MeasuringAllocator::live;
int64_t MeasuringAllocator::current = 0, MeasuringAllocator::peak = 0;

struct Measured {
  int64_t after_forward = 0;  // bytes alive after forward + loss (saved tensors, logits, loss)
  int64_t peak = 0;           // peak over forward + backward, above the state before forward
};

Measured measure_gpt(const GptShape& s) {
  static MeasuringAllocator alloc;
  // The counting allocator stays the process's allocator afterwards (other
  // tests rely on it); ours wraps it while measuring.
  EXPECT_TRUE(fsdp::memory::install());
  c10::Allocator* previous = c10::GetCPUAllocator();
  alloc.base = previous;
  c10::SetCPUAllocator(&alloc, /*priority=*/100);
  struct Restore {
    c10::Allocator* p;
    ~Restore() { c10::SetCPUAllocator(p, 100); }
  } restore{previous};
  auto stats = [] {
    std::lock_guard<std::mutex> g(MeasuringAllocator::mu);
    return std::make_pair(MeasuringAllocator::current, MeasuringAllocator::peak);
  };
  auto reset_peak = [] {
    std::lock_guard<std::mutex> g(MeasuringAllocator::mu);
    MeasuringAllocator::peak = MeasuringAllocator::current;
  };
  torch::manual_seed(0);
  auto tok = torch::nn::Embedding(s.vocab, s.dim), pos = torch::nn::Embedding(s.seq, s.dim);
  std::vector<std::shared_ptr<BlockImpl>> blocks;
  for (int64_t i = 0; i < s.layers; ++i) blocks.push_back(std::make_shared<BlockImpl>(s.dim, s.heads));
  auto ln = torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.dim}).eps(1e-5));
  auto head = torch::nn::Linear(s.dim, s.vocab);
  auto idx = torch::randint(s.vocab, {s.batch, s.seq}, torch::kLong);
  auto tgt = torch::randint(s.vocab, {s.batch, s.seq}, torch::kLong);
  std::vector<torch::Tensor> params;
  for (auto* m : std::initializer_list<torch::nn::Module*>{tok.get(), pos.get(), ln.get(), head.get()})
    for (auto& p : m->parameters()) params.push_back(p);
  for (auto& b : blocks)
    for (auto& p : b->parameters()) params.push_back(p);
  auto step = [&](Measured* m) {
    int64_t before = stats().first;
    reset_peak();
    torch::Tensor logits, loss;
    {
      auto positions = torch::arange(s.seq, torch::kLong);
      auto x = tok(idx) + pos(positions);
      for (auto& b : blocks) x = b->forward(x);
      logits = head(ln(x));
      loss = torch::nn::functional::cross_entropy(logits.reshape({-1, s.vocab}).to(torch::kFloat),
                                                  tgt.reshape({-1}));
    }
    if (m) m->after_forward = stats().first - before;
    loss.backward();
    if (m) m->peak = stats().second - before;
  };
  step(nullptr);  // gradients exist from here on: backward accumulates into them
  for (auto& p : params) p.mutable_grad().zero_();
  Measured m;
  step(&m);
  return m;
}

TEST(Plan, GptActivationEstimateMatchesLibtorch) {
  for (GptShape s : {GptShape{2, 64, 4, 256, 32, 4}, GptShape{3, 128, 4, 256, 64, 4}, GptShape{2, 96, 2, 512, 48, 3}}) {
    Measured m = measure_gpt(s);
    ActivationEstimate e = gpt_activations(s);
    int64_t saved = e.total - e.backward_transient;
    int64_t largest_param = 4 * s.dim * s.dim * 4 + 4 * s.dim * 4;  // fc weight + bias: AccumulateGrad's temporary
    std::printf("GPT L=%lld d=%lld T=%lld B=%lld V=%lld: after forward measured %lld estimated %lld (%.2f%%); "
                "peak measured %lld estimated %lld (%.2f%%)\n",
                (long long)s.layers, (long long)s.dim, (long long)s.seq, (long long)s.batch, (long long)s.vocab,
                (long long)m.after_forward, (long long)saved, 100.0 * saved / m.after_forward, (long long)m.peak,
                (long long)e.total, 100.0 * e.total / m.peak);
    EXPECT_NEAR(double(saved) / m.after_forward, 1.0, 0.01);
    EXPECT_NEAR(double(e.total) / m.peak, 1.0, 0.02) << "largest param " << largest_param;
  }
}

// ---------------------------------------------------------------------------
TEST(Plan, CommandPrintsLedgerTrafficAndRecommendation) {
  auto fsdp_bin = fsdp::testing::bin_path("fsdp");
  auto r = fsdp::testing::run_command({fsdp_bin, "plan", "--model", "gpt", "--layers", "6", "--dim", "256", "--heads",
                                       "4", "--vocab", "256", "--seq", "128", "--batch", "8", "--world", "2",
                                       "--bandwidth", "2GB/s"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("4.903 M parameters"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FULL_SHARD"), std::string::npos);
  EXPECT_NE(r.output.find("3P(N-1)/N"), std::string::npos);
  EXPECT_NE(r.output.find("ms at 2.00 GB/s"), std::string::npos) << r.output;

  auto j = fsdp::testing::run_command({fsdp_bin, "plan", "--world", "4", "--strategy", "auto", "--budget", "8GiB", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.output;
  auto parsed = nlohmann::json::parse(j.output);
  EXPECT_EQ(parsed["recommendation"]["strategy"], "NO_SHARD");
  EXPECT_EQ(parsed["model"]["num_params"], 4903168);
  EXPECT_EQ(parsed["plan"]["traffic_by_strategy"]["FULL_SHARD"]["total"], 3 * (4903168 / 4) * 3 * 4);

  auto bad = fsdp::testing::run_command({fsdp_bin, "plan", "--strategy", "auto"});
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("--budget"), std::string::npos) << bad.output;
}

}  // namespace
