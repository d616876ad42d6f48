// fsdp-cpp planner: the FSDP guide's decision tree (docs/GUIDE.md) under a memory budget.
//
// 显存快爆了，优先 FULL_SHARD；显存刚好够，试试 SHARD_GRAD_OP；模型不大、卡又多，
// NO_SHARD 反而省心. Tried in order of least traffic first: a strategy or a
// wrapping is only worth its extra communication when the cheaper one does
// not fit.
#include <sstream>

#include "fsdp/errors.h"
#include "fsdp/memory.h"
#include "fsdp/plan.h"
#include "plan/names.h"

namespace fsdp::plan {
namespace {

constexpr double kHeadroom = 0.9;  // fragmentation and small buffers are not in the ledger

std::string b(int64_t x) { return fsdp::memory::format_bytes(x); }

bool fits(const Plan& p, int64_t budget) { return p.peak <= static_cast<int64_t>(budget * kHeadroom); }

std::string pct(int64_t part, int64_t whole) {
  std::ostringstream os;
  os.precision(0);
  os << std::fixed << (whole ? 100.0 * part / whole : 0) << "%";
  return os.str();
}

}  // namespace

Recommendation recommend(const std::vector<Candidate>& cands, int64_t A, const PlanOptions& base, int64_t budget) {
  FSDP_USER_CHECK(!cands.empty(), "plan: recommend() needs at least one wrapping candidate.");
  FSDP_USER_CHECK(budget > 0, "plan: --budget must be > 0 bytes, found ", budget);
  std::ostringstream why;
  auto with = [&](ShardingStrategy s) {
    PlanOptions o = base;
    o.strategy = s;
    return o;
  };
  const int64_t limit = static_cast<int64_t>(budget * kHeadroom);
  Recommendation r;

  // 1. Small model: replicas fit -> NO_SHARD (DDP). Wrapping does not matter.
  Plan ns = make_plan(cands.front().units, A, with(ShardingStrategy::NO_SHARD), cands.front().released, cands.front().recompute);
  why << "budget " << b(budget) << " per rank (plans must peak under 90% of it: " << b(limit) << ")\n";
  why << "- NO_SHARD: every rank holds P+G+O = " << b(ns.rest) << ", peak " << b(ns.peak);
  if (fits(ns, budget) && base.world >= 1) {
    why << " -> fits.\n";
    why << "The model is small enough to replicate: NO_SHARD (DDP) sends the least (2P(N-1)/N = "
        << b(ns.traffic.total()) << " per step, one all-reduce) and never gathers parameters. "
        << "Sharding would only add communication.";
    r.fits = true;
    r.strategy = ShardingStrategy::NO_SHARD;
    r.wrap = "none";
    r.plan = ns;
    r.why = why.str();
    return r;
  }
  why << " -> does not fit.\n";

  // 2. Fits with parameters unsharded through the step -> SHARD_GRAD_OP
  //    (2P instead of 3P). The coarsest wrapping that fits.
  for (auto& c : cands) {
    Plan p = make_plan(c.units, A, with(ShardingStrategy::SHARD_GRAD_OP), c.released, c.recompute);
    if (fits(p, budget)) {
      why << "- SHARD_GRAD_OP, wrap " << c.wrap << ": rest (P+G+O)/N " << b(p.rest)
          << " + all units unsharded from forward to backward " << b(p.working) << " + A " << b(A) << " = "
          << b(p.peak) << " -> fits.\n";
      why << "Memory is enough to keep the parameters gathered from forward to backward: SHARD_GRAD_OP skips "
          << "the backward all-gather, 2P(N-1)/N = " << b(p.traffic.total()) << " per step instead of FULL_SHARD's "
          << b(p.full_shard.total()) << ".";
      r.fits = true;
      r.strategy = ShardingStrategy::SHARD_GRAD_OP;
      r.wrap = c.wrap;
      r.plan = p;
      r.why = why.str();
      return r;
    }
  }
  {
    Plan p = make_plan(cands.back().units, A, with(ShardingStrategy::SHARD_GRAD_OP), cands.back().released, cands.back().recompute);
    why << "- SHARD_GRAD_OP: peak " << b(p.peak) << " even with the finest wrapping (" << cands.back().wrap
        << ") -> does not fit.\n";
  }

  // 3. Memory tight -> FULL_SHARD, coarsest wrapping that fits (fewer, larger
  //    collectives); finer units lower P_block.
  for (auto& c : cands) {
    Plan p = make_plan(c.units, A, with(ShardingStrategy::FULL_SHARD), c.released, c.recompute);
    why << "- FULL_SHARD, wrap " << c.wrap << " (" << c.units.size() << (c.units.size() == 1 ? " unit" : " units") << "): P_block " << b(p.P_block)
        << ", peak " << b(p.peak);
    if (fits(p, budget)) {
      why << " -> fits.\n";
      why << "Memory is tight: FULL_SHARD keeps only (P+G+O)/N = " << b(p.rest)
          << " resident and gathers one unit at a time. Wrap '" << c.wrap
          << "' is the coarsest that fits (coarser units mean fewer collectives); it costs 3P(N-1)/N = "
          << b(p.traffic.total()) << " per step.";
      r.fits = true;
      r.strategy = ShardingStrategy::FULL_SHARD;
      r.wrap = c.wrap;
      r.plan = p;
      r.why = why.str();
      return r;
    }
    why << " -> does not fit.\n";
  }

  // 4. Nothing fits: say which term dominates and what to change.
  Plan p = make_plan(cands.back().units, A, with(ShardingStrategy::FULL_SHARD), cands.back().released, cands.back().recompute);
  why << "Nothing fits. With FULL_SHARD and the finest wrapping the peak is " << b(p.peak) << " of which "
      << "activations A " << b(p.A) << " (" << pct(p.A, p.peak) << "), resident shards " << b(p.rest) << " ("
      << pct(p.rest, p.peak) << "), unsharded unit " << b(p.working) << " (" << pct(p.working, p.peak) << ").\n";
  if (p.A >= p.rest && p.A >= p.working)
    why << "Activations dominate: lower --batch (A scales with it) or --seq; bf16 halves them.";
  else if (p.rest >= p.working)
    why << "The resident shards dominate: add ranks (--world), use bf16 compute, or SGD (1 state instead of Adam's 2).";
  else
    why << "The largest unit dominates: wrap finer (size:N with a smaller N) so P_block shrinks.";
  r.fits = false;
  r.strategy = ShardingStrategy::FULL_SHARD;
  r.wrap = cands.back().wrap;
  r.plan = p;
  r.why = why.str();
  return r;
}

}  // namespace fsdp::plan
