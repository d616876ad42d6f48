// fsdp-cpp planner: the FSDP guide's decision tree (docs/GUIDE.md) under a memory budget.
//
// 显存快爆了，优先 FULL_SHARD；显存刚好够，试试 SHARD_GRAD_OP；模型不大、卡又多，
// NO_SHARD 反而省心. Tried in order of least traffic first: a strategy or a
// wrapping is only worth its extra communication when the cheaper one does
// not fit. Across hosts (PlanOptions::hosts > 1) HYBRID_SHARD and
// HYBRID_SHARD_ZERO2 join, and the strategies that fit are weighed by their
// communication per tier (tiers.cpp): include/fsdp/plan.h, recommend().
#include <cstdio>
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

// The one-host decision tree: NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, the first that fits.
Recommendation tree(const std::vector<Candidate>& cands, int64_t A, const PlanOptions& base, int64_t budget) {
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

std::string ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "~%.1f ms", 1e3 * seconds);
  return buf;
}

// The formulas behind a strategy's bytes across each host's link and inside
// one (per step; K micro-steps are in the bytes).
const char* inter_formula(ShardingStrategy s) {
  switch (s) {
    // The collectives compose the tiers: each rank sends (H-1)/(N-1) of its
    // traffic across, N/H ranks share the host's link.
    case ShardingStrategy::FULL_SHARD: return "3P(H-1)/H: N/H ranks x (H-1)/(N-1) of 3P(N-1)/N";
    case ShardingStrategy::SHARD_GRAD_OP: return "2P(H-1)/H: N/H ranks x (H-1)/(N-1) of 2P(N-1)/N";
    case ShardingStrategy::NO_SHARD: return "2P(H-1)/H: N/H ranks x (H-1)/(N-1) of 2P(N-1)/N";
    case ShardingStrategy::HYBRID_SHARD:
    case ShardingStrategy::HYBRID_SHARD_ZERO2: return "S ranks x 2(R-1)/R x P/S";
  }
  return "?";
}

}  // namespace

Recommendation recommend(const std::vector<Candidate>& cands, int64_t A, const PlanOptions& base, int64_t budget) {
  FSDP_USER_CHECK(!cands.empty(), "plan: recommend() needs at least one wrapping candidate.");
  FSDP_USER_CHECK(budget > 0, "plan: --budget must be > 0 bytes, found ", budget);
  base.validate();
  Recommendation r = tree(cands, A, base, budget);
  r.one_host_choice = r.strategy;
  if (base.hosts <= 1) return r;  // one host: the tree alone, as it always was

  // Across hosts: every strategy with its coarsest wrapping that fits (the
  // finest when none does), its peak and its traffic per tier. The order is
  // the tie-break: the tree's order, then the HYBRID variants by traffic.
  const int S = base.group(), R = base.world / S, per_host = base.world / base.hosts;
  const int64_t limit = static_cast<int64_t>(budget * kHeadroom);
  std::vector<Plan> plans;
  for (auto s : {ShardingStrategy::NO_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::FULL_SHARD,
                 ShardingStrategy::HYBRID_SHARD_ZERO2, ShardingStrategy::HYBRID_SHARD}) {
    PlanOptions o = base;
    o.strategy = s;
    StrategyFit f;
    f.strategy = s;
    const Candidate* chosen = &cands.back();
    // NO_SHARD: the wrapping does not matter (the tree's first candidate).
    const size_t n = s == ShardingStrategy::NO_SHARD ? 1 : cands.size();
    Plan plan;
    for (size_t i = 0; i < n; ++i) {
      Plan p = make_plan(cands[i].units, A, o, cands[i].released, cands[i].recompute);
      if (fits(p, budget)) {
        chosen = &cands[i], plan = p, f.fits = true;
        break;
      }
      if (i + 1 == n) chosen = &cands[i], plan = p;
    }
    f.wrap = chosen->wrap;
    f.peak = plan.peak;
    f.rest = plan.rest;
    f.tiers = tier_traffic(s, chosen->units, o);
    // Bytes through each host's link: every rank of it sends its share
    // (the collectives compose the tiers; HYBRID: its S ranks).
    f.host_inter = (is_hybrid(s) ? int64_t(S) : int64_t(per_host)) * f.tiers.inter;
    r.strategies.push_back(f);
    plans.push_back(plan);
  }
  const bool timed = [&] {
    for (auto& f : r.strategies)
      if (!(f.tiers.seconds > 0)) return false;
    return true;
  }();
  bool hybrid_fits = false;
  for (auto& f : r.strategies) hybrid_fits = hybrid_fits || (f.fits && is_hybrid(f.strategy));

  std::ostringstream why;
  why << r.why << "\n";
  why << "Across " << base.hosts << " hosts (" << per_host << " ranks each; HYBRID: shard groups of S = " << S
      << ", R = " << R << " replicas), per step:\n";
  for (auto& f : r.strategies) {
    why << "- " << strategy_name(f.strategy);
    if (f.strategy != ShardingStrategy::NO_SHARD) why << ", wrap " << f.wrap;
    if (is_hybrid(f.strategy)) why << ": rest (P+G+O)/S " << b(f.rest) << ", peak " << b(f.peak);
    else why << ": peak " << b(f.peak);
    why << (f.fits ? " -> fits" : " -> does not fit") << "; each host sends " << b(f.host_inter)
        << " across (" << inter_formula(f.strategy) << ")";
    if (is_hybrid(f.strategy)) why << ", each rank " << b(f.tiers.intra) << " inside";
    if (timed) why << ", " << ms(f.tiers.seconds);
    why << ".\n";
  }

  const StrategyFit* base_fit = nullptr;  // the one-host choice, for comparison
  for (auto& f : r.strategies)
    if (f.strategy == r.one_host_choice) base_fit = &f;
  if (!hybrid_fits) {
    // No HYBRID variant fits (or nothing does): the tree's answer. (With
    // rates it is also the fastest of the rest: NO_SHARD and SHARD_GRAD_OP
    // send 2P(N-1)/N, FULL_SHARD 3P(N-1)/N, each on one ring.)
    const StrategyFit* hybrid = &r.strategies[4];
    why << "Neither HYBRID variant fits: HYBRID_SHARD holds (P+G+O)/S = " << b(hybrid->rest)
        << " per rank at rest (S = " << S << " instead of N = " << base.world << ") and peaks at " << b(hybrid->peak)
        << " > " << b(limit) << ". ";
    if (r.fits)
      why << strategy_name(r.strategy) << " stays (the one-host choice): each host sends "
          << b(base_fit->host_inter) << " per step across hosts.";
    else
      why << "Nothing fits across hosts either.";
    r.why = why.str();
    return r;
  }

  // The rule: among the strategies that fit, the least communication time
  // when both links' rates are known; without rates, the fewest bytes across
  // hosts (a tie: the fewer inside).
  r.rule = timed ? "comm_time" : "inter_host_bytes";
  int best = -1;
  for (int i = 0; i < (int)r.strategies.size(); ++i) {
    auto& f = r.strategies[i];
    if (!f.fits) continue;
    if (best < 0) {
      best = i;
      continue;
    }
    auto& g = r.strategies[best];
    const bool better = timed ? f.tiers.seconds < g.tiers.seconds * (1 - 1e-9)
                              : f.host_inter < g.host_inter ||
                                    (f.host_inter == g.host_inter && f.tiers.intra < g.tiers.intra);
    if (better) best = i;
  }
  const StrategyFit& pick = r.strategies[best];
  if (pick.strategy == r.one_host_choice) {
    // The tree's choice is also the fastest (or sends the fewest bytes).
    const StrategyFit* rival = nullptr;  // the best HYBRID that fits
    for (auto& f : r.strategies)
      if (f.fits && is_hybrid(f.strategy) &&
          (!rival || (timed ? f.tiers.seconds < rival->tiers.seconds : f.host_inter < rival->host_inter)))
        rival = &f;
    why << strategy_name(pick.strategy) << " stays (the one-host choice, peak " << b(pick.peak) << " <= " << b(limit)
        << "): ";
    if (timed)
      why << "its communication takes " << ms(pick.tiers.seconds) << " per step";
    else
      why << "each host sends " << b(pick.host_inter) << " per step across hosts";
    if (rival)
      why << " against " << (timed ? ms(rival->tiers.seconds) : b(rival->host_inter)) << " for "
          << strategy_name(rival->strategy) << ", the best HYBRID variant that fits";
    why << (timed ? " (the link between hosts is fast enough)." : ".");
    r.why = why.str();
    return r;
  }
  why << strategy_name(pick.strategy) << " fits (peak " << b(pick.peak) << " <= " << b(limit)
      << ", 90% of the budget) and sends " << b(pick.host_inter) << " per step across hosts against "
      << b(base_fit->host_inter) << " for " << strategy_name(base_fit->strategy);
  if (timed)
    why << ": its communication takes " << ms(pick.tiers.seconds) << " per step against " << ms(base_fit->tiers.seconds)
        << " (the least of the strategies that fit).";
  else
    why << " (no link rates given: the fewest bytes across hosts win; --intra-bw and --inter-bw weigh time).";
  if (is_hybrid(pick.strategy))
    why << " At rest it holds (P+G+O)/S = " << b(pick.rest) << " per rank against " << b(base_fit->rest) << " for "
        << strategy_name(base_fit->strategy) << ".";
  r.fits = true;
  r.strategy = pick.strategy;
  r.wrap = pick.wrap;
  r.plan = plans[best];
  r.why = why.str();
  return r;
}

}  // namespace fsdp::plan
