// fsdp-cpp planner: the FSDP guide's decision tree (docs/GUIDE.md, "Choosing") as one rule.
//
// 显存快爆了，优先 FULL_SHARD；显存刚好够，试试 SHARD_GRAD_OP；模型不大、卡又多，
// NO_SHARD 反而省心. The tree's branches fall out of one rule: of every
// (strategy, wrapping) whose peak fits the budget, the one whose
// communication hides best behind compute (include/fsdp/plan.h, comm_cost
// and recommend()). A replica that fits sends the least and gathers nothing;
// sharding more costs communication, worth it when memory asks for it; one
// unit hides nothing, so a wrapping that prefetches wins where it fits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <unistd.h>

#include "common/env.h"
#include "fsdp/errors.h"
#include "fsdp/memory.h"
#include "fsdp/plan.h"
#include "plan/names.h"

namespace fsdp::plan {
namespace {

constexpr double kHeadroom = 0.9;  // fragmentation and small buffers are not in the ledger
constexpr double kTie = 0.01;      // within 1%: a tie, the next key decides

std::string b(int64_t x) { return fsdp::memory::format_bytes(x); }

bool fits(const Plan& p, int64_t budget) {
  return budget <= 0 || p.rank_peak() <= static_cast<int64_t>(budget * kHeadroom);
}

std::string pct(int64_t part, int64_t whole) {
  std::ostringstream os;
  os.precision(0);
  os << std::fixed << (whole ? 100.0 * part / whole : 0) << "%";
  return os.str();
}

// A cost in the run's unit: "12.3 ms" with the rates, else weighted bytes.
std::string amount(double x, bool timed) {
  if (!timed) return b(static_cast<int64_t>(std::llround(x)));
  char buf[32];
  const double ms = 1e3 * x;
  std::snprintf(buf, sizeof buf, ms >= 10 || ms == 0 ? "%.1f ms" : ms >= 1 ? "%.2f ms" : "%.3f ms", ms);
  return buf;
}

// The strategies the run allows, in the tie-break order.
std::vector<ShardingStrategy> allowed(const PlanOptions& o, std::optional<ShardingStrategy> only) {
  if (only) return {*only};
  std::vector<ShardingStrategy> s{ShardingStrategy::NO_SHARD, ShardingStrategy::SHARD_GRAD_OP,
                                  ShardingStrategy::FULL_SHARD};
  // HYBRID is FULL_SHARD / SHARD_GRAD_OP with one replica unless the shard group is smaller than N.
  if (o.hosts > 1 || o.group() < o.world)
    s.insert(s.end(), {ShardingStrategy::HYBRID_SHARD_ZERO2, ShardingStrategy::HYBRID_SHARD});
  return s;
}

// The strategies' tie-break order.
int order(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::NO_SHARD: return 0;
    case ShardingStrategy::SHARD_GRAD_OP: return 1;
    case ShardingStrategy::FULL_SHARD: return 2;
    case ShardingStrategy::HYBRID_SHARD_ZERO2: return 3;
    case ShardingStrategy::HYBRID_SHARD: return 4;
  }
  return 5;
}

std::string name_of(const CandidateFit& f) { return std::string(strategy_name(f.strategy)) + ", wrap " + f.wrap; }

// The rule's keys in order. Of `idx` (indices into rows, in the tie-break
// order: strategies NO_SHARD .. HYBRID_SHARD, each with its wrappings coarse
// to fine), the best: the least exposed within 1%, then the least total
// within 1%, then the earliest strategy, then the lowest peak within 1%, then
// the coarsest wrapping. `by`: the first key that set the best apart from the
// others (with two rows: from the runner-up).
int pick(const std::vector<CandidateFit>& rows, std::vector<int> idx, std::string* by = nullptr) {
  if (idx.empty()) return -1;
  auto keep = [&](auto key, double tie, const char* name) {
    double least = key(rows[idx[0]]);
    for (int i : idx) least = std::min(least, key(rows[i]));
    std::vector<int> kept;
    for (int i : idx)
      if (key(rows[i]) <= least + tie * std::abs(least)) kept.push_back(i);
    if (by && kept.size() < idx.size() && by->empty()) *by = name;
    idx = kept;
  };
  keep([](const CandidateFit& f) { return f.comm.exposed; }, kTie, "exposed");
  keep([](const CandidateFit& f) { return f.comm.total; }, kTie, "total");
  keep([&](const CandidateFit& f) { return double(order(f.strategy)); }, 0, "strategy");
  keep([](const CandidateFit& f) { return double(f.peak); }, kTie, "peak");
  if (by && by->empty() && idx.size() > 1) *by = "wrap";
  return idx.front();
}

}  // namespace

std::string Recommendation::verdict() const {
  std::string v = std::string(fits ? "recommended: " : "closest (does NOT fit): ") + strategy_name(strategy) +
                  " with --wrap " + wrap;
  // The prefetch its plan assumes (1 where the run asked none and the wrapping prefetches).
  if (fits && prefetch > 0) v += " --prefetch " + std::to_string(prefetch);
  return v;
}

Recommendation recommend(const std::vector<Candidate>& cands, int64_t A, const PlanOptions& base, int64_t budget,
                         std::optional<ShardingStrategy> only) {
  FSDP_USER_CHECK(!cands.empty(), "plan: recommend() needs at least one wrapping candidate.");
  FSDP_USER_CHECK(budget >= 0, "plan: --budget must be > 0 bytes (0: no budget), found ", budget);
  base.validate();
  Recommendation r;
  r.budget = budget;
  const int64_t limit = static_cast<int64_t>(budget * kHeadroom);

  // 1.-2. Every (strategy, wrapping) the run allows, planned; which fit.
  std::vector<Plan> plans;
  for (ShardingStrategy s : allowed(base, only)) {
    for (const Candidate& c : cands) {
      PlanOptions o = base;
      o.strategy = s;
      // What lets the all-gathers hide (NO_SHARD gathers nothing).
      if (c.units.size() > 1 && s != ShardingStrategy::NO_SHARD) o.prefetch = std::max(1, base.prefetch);
      Plan p = make_plan(c.units, A, o, c.released, c.recompute);
      CandidateFit f;
      f.strategy = s;
      f.wrap = c.wrap;
      f.units = static_cast<int>(c.units.size());
      f.prefetch = o.prefetch;
      f.fits = fits(p, budget);
      f.peak = p.rank_peak();  // host-shared: its share of the shared memory too
      f.rest = p.rest;
      f.comm = comm_cost(s, c.units, o);
      r.candidates.push_back(f);
      plans.push_back(std::move(p));
    }
  }
  const auto& rows = r.candidates;
  const bool timed = rows.front().comm.timed;
  std::vector<int> fitting;
  for (int i = 0; i < (int)rows.size(); ++i)
    if (rows[i].fits) fitting.push_back(i);

  std::ostringstream table, why;
  if (budget > 0)
    table << "budget " << b(budget) << " per rank (plans must peak under 90% of it: " << b(limit) << ")";
  else
    table << "no budget: every candidate counts as fitting";
  table << "; communication per step in " << (timed ? "ms" : "bytes (no link rates: --intra-bw/--inter-bw or "
                                                                "--bandwidth time it)");
  // Weighed as the run sends it: quantized where its path compresses (comm_cost).
  if (base.compress != "off")
    table << "; FSDP_COMPRESS=" << base.compress << ": the collectives its path compresses weigh their quantized "
          << "bytes" << (timed ? " and the time to quantize and decode them" : "");
  table << "\n";
  // What does not fit, per strategy: its wrappings that do not, or (none
  // does) its lowest peak.
  for (ShardingStrategy s : allowed(base, only)) {
    std::vector<int> out;
    bool any = false;
    for (int i = 0; i < (int)rows.size(); ++i) {
      if (rows[i].strategy != s) continue;
      if (rows[i].fits)
        any = true;
      else
        out.push_back(i);
    }
    if (out.empty()) continue;
    table << "- " << strategy_name(s);
    if (any) {
      table << ": does not fit with wrap ";
      for (size_t k = 0; k < out.size(); ++k)
        table << (k ? ", " : "") << rows[out[k]].wrap << " (peak " << b(rows[out[k]].peak) << ")";
    } else {
      const CandidateFit& low =
          rows[*std::min_element(out.begin(), out.end(), [&](int x, int y) { return rows[x].peak < rows[y].peak; })];
      table << ": does not fit (lowest peak " << b(low.peak) << " with wrap " << low.wrap;
      if (low.prefetch > base.prefetch) table << " and --prefetch " << low.prefetch;
      table << ")";
    }
    table << "\n";
  }

  // 2. Nothing fits: the finest wrapping of FULL_SHARD (or the strategy
  //    asked for), and which term dominates.
  if (fitting.empty()) {
    PlanOptions o = base;
    o.strategy = only ? *only : ShardingStrategy::FULL_SHARD;
    const Candidate& c = cands.back();
    Plan p = make_plan(c.units, A, o, c.released, c.recompute);
    why << "Nothing fits. With " << strategy_name(o.strategy) << " and the finest wrapping the peak is " << b(p.peak)
        << " of which activations A " << b(p.A) << " (" << pct(p.A, p.peak) << "), resident shards " << b(p.rest)
        << " (" << pct(p.rest, p.peak) << "), unsharded unit " << b(p.working) << " (" << pct(p.working, p.peak)
        << ").\n";
    if (p.A >= p.rest && p.A >= p.working)
      why << "Activations dominate: lower --batch (A scales with it) or --seq"
          << (base.param_bytes == 4 ? "; bf16 halves them" : "") << "; --ac block keeps only each block's input.";
    else if (p.rest >= p.working)
      why << "The resident shards dominate: add ranks (--world), use bf16 compute, or SGD (1 state instead of "
             "Adam's 2).";
    else
      why << "The largest unit dominates: wrap finer (size:N with a smaller N) so P_block shrinks.";
    r.fits = false;
    r.rule = "nothing_fits";
    r.strategy = o.strategy;
    r.wrap = c.wrap;
    r.prefetch = base.prefetch;
    r.plan = p;
    r.comm = comm_cost(o.strategy, c.units, o);
    r.table = table.str();
    r.why = why.str();
    return r;
  }

  // 3. Among those that fit: the least exposed communication, then the ties.
  const int best = pick(rows, fitting);
  std::vector<int> others;
  for (int i : fitting)
    if (i != best) others.push_back(i);
  const int second = pick(rows, others);
  std::string by;
  if (second >= 0) pick(rows, {best, second}, &by);

  char line[256];
  std::snprintf(line, sizeof line, "    %-20s %-16s %5s %12s %12s %12s\n", "strategy", "wrap", "units", "peak",
                "total comm", "exposed");
  table << "candidates that fit (exposed: the communication that cannot hide behind compute):\n" << line;
  for (int i : fitting) {
    const CandidateFit& f = rows[i];
    std::snprintf(line, sizeof line, "  %c %-20s %-16s %5d %12s %12s %12s\n", i == best ? '*' : ' ',
                  strategy_name(f.strategy), f.wrap.c_str(), f.units, b(f.peak).c_str(),
                  amount(f.comm.total, timed).c_str(), amount(f.comm.exposed, timed).c_str());
    table << line;
  }

  const CandidateFit& w = rows[best];
  const std::string unit = timed           ? ""
                           : base.hosts > 1 ? " (bytes, the inter-host ones times the ranks sharing a host's link)"
                                            : " (bytes)";
  if (only) why << "--strategy " << strategy_name(*only) << ": its wrappings alone are weighed.\n";
  why << name_of(w) << " (" << w.units << (w.units == 1 ? " unit" : " units") << ") exposes "
      << amount(w.comm.exposed, timed) << " of " << amount(w.comm.total, timed) << " per step" << unit << ": ";
  if (w.units == 1)
    why << "with one unit nothing is prefetched and its one reduce waits for the whole backward, so all of it is "
           "exposed";
  else if (w.strategy == ShardingStrategy::NO_SHARD)
    why << "no all-gathers; the root's and the first unit's all-reduces after backward ("
        << amount(w.comm.last_reduce, timed) << "); every other unit's all-reduce runs while backward computes";
  else
    why << "the root's and the first unit's all-gathers before forward computes ("
        << amount(w.comm.first_gather, timed) << ") and their reduces after backward ("
        << amount(w.comm.last_reduce, timed) << "); every other collective runs behind compute with --prefetch "
        << w.prefetch;
  if (w.comm.compute_weighed) {
    const double beyond = w.comm.total - base.compute_seconds;
    if (beyond > w.comm.exposed_min)
      why << "; but the compute (" << amount(base.compute_seconds, true) << ") cannot cover "
          << amount(beyond, true) << " of it, more than those ends";
    else
      why << "; the compute (" << amount(base.compute_seconds, true) << ") covers the rest";
  }
  why << ".\n";
  if (second >= 0) {
    const CandidateFit& v = rows[second];
    why << "Runner-up " << name_of(v) << ": ";
    if (by == "exposed")
      why << "exposes " << amount(v.comm.exposed, timed) << (v.units == 1 ? " (one unit: all of it)" : "") << ".";
    else if (by == "total")
      why << "exposes as much (within 1%) but sends more in all, " << amount(v.comm.total, timed) << ".";
    else if (by == "strategy")
      why << "exposes and sends as much (within 1%); the tie goes to the earlier in the order NO_SHARD, "
             "SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD_ZERO2, HYBRID_SHARD.";
    else if (by == "peak")
      why << "exposes and sends as much (within 1%) but peaks higher, " << b(v.peak) << " against " << b(w.peak)
          << ".";
    else
      why << "a tie on exposed and total communication and on peak (within 1%); the coarser wrapping wins "
             "(fewer, larger collectives).";
    why << "\n";
  }
  if (!w.comm.compute_weighed && base.compute_seconds > 0)
    why << "Communication beyond compute is not weighed: --compute needs the link rates (--intra-bw and "
           "--inter-bw, or --bandwidth) to set bytes against time.";
  else if (!w.comm.compute_weighed)
    why << (timed ? "Communication beyond compute is not weighed: give --compute (achieved FLOP/s per rank, e.g. "
                    "400TFLOP/s) to count what the compute cannot cover."
                  : "Communication beyond compute is not weighed: give the link rates and --compute (achieved "
                    "FLOP/s per rank) to count what the compute cannot cover.");
  else
    why << "Compute per step: " << amount(base.compute_seconds, true) << " (--compute).";

  r.fits = true;
  r.rule = "exposed_comm";
  r.strategy = w.strategy;
  r.wrap = w.wrap;
  r.prefetch = w.prefetch;
  r.plan = plans[best];
  r.comm = w.comm;
  r.table = table.str();
  r.why = why.str();
  return r;
}

// ---------------------------------------------------------------------------
// A process budget.

int64_t resident_now() {
  char buf[160];
  if (::fsdp::detail::env().read_proc("/proc/self/statm", buf, sizeof buf) <= 0) return 0;
  long long size = 0, resident = 0;
  const int got = std::sscanf(buf, "%lld %lld", &size, &resident);
  return got == 2 ? static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE) : 0;
}

ProcessBudget process_budget(int64_t rss, int64_t at_start, int64_t fixed) {
  FSDP_USER_CHECK(rss > 0, "plan: --budget-rss must be > 0 bytes, found ", rss);
  FSDP_USER_CHECK(fixed >= 0, "plan: --fixed must be >= 0 bytes, found ", fixed);
  ProcessBudget p;
  p.rss = rss;
  if (fixed > 0) {
    p.given = true;
    p.at_start = std::min(at_start, fixed);
    p.runtime = fixed - p.at_start;
  } else {
    p.at_start = at_start;
    p.runtime = kRuntimeAllowance;
  }
  return p;
}

std::string ProcessBudget::str() const {
  std::ostringstream os;
  os << "process budget " << b(rss) << " per rank (VmHWM): fixed part " << b(fixed());
  if (given)
    os << " (given: --fixed, a run's own fixed=)";
  else
    os << " = libtorch at start " << b(at_start) << " (this process's resident size: the same libraries) + "
       << b(runtime) << " allowance (code paged in later, malloc's heap, thread stacks; a run's own: --fixed)";
  os << "\n";
  if (tensors() > 0)
    os << "  => tensors get " << b(tensors()) << ": run with --max-memory " << (tensors() >> 20)
       << "MiB (the allocator's limit: tensors and its cache inside it)";
  else
    os << "  => nothing is left for tensors: the fixed part alone passes the budget. Fix: a larger --budget-rss "
          "(at least "
       << b(fixed()) << " plus the tensors)";
  return os.str();
}

}  // namespace fsdp::plan
