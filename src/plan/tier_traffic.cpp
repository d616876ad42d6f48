// fsdp-cpp planner: traffic and time per tier, intra-host and inter-host
// (include/fsdp/plan.h, "Two tiers"), and the communication a step cannot
// hide behind compute (comm_cost, what recommend() weighs). The byte counts
// are the engine's counters' (src/comm: the composed tiers of
// src/comm/tiers.h across hosts of equal size; the flat ring's tier is its
// right neighbour's host), tested against a run in tests/test_hybrid.cpp.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/collective_path.h"
#include "common/shard_math.h"
#include "common/traffic_math.h"
#include "fsdp/errors.h"
#include "fsdp/memory.h"
#include "fsdp/plan.h"
#include "plan/names.h"

namespace fsdp::plan {
namespace {

int64_t padded_over(const std::vector<UnitSpec>& units, int n) {
  int64_t p = 0;
  for (auto& u : units) p += shard::padded_numel(u.numel, n);
  return p;
}

double rate(double tier, double fallback) { return tier > 0 ? tier : fallback; }

// The ranks whose shares cross over a host's one link: HYBRID's shard
// group, else the ranks of one host.
int link_sharers(ShardingStrategy s, const PlanOptions& o) { return is_hybrid(s) ? o.group() : o.world / o.hosts; }

// Bytes a rank sends inside its host and across hosts for `t`, some of a
// strategy's collectives (traffic(): for HYBRID padded over the group S,
// else over N).
struct Split {
  int64_t intra = 0, inter = 0;
};
Split split(ShardingStrategy s, const Traffic& t, const PlanOptions& o) {
  Split x;
  if (is_hybrid(s)) {
    const int S = o.group();
    x.inter = o.world / S > 1 ? t.all_reduce : 0;
    x.intra = t.total() - x.inter;
    // One host: the replicas' all-reduce stays inside it. A shard group
    // larger than a host: its traffic crosses too.
    if (o.hosts <= 1) x.intra += x.inter, x.inter = 0;
    else if (S > o.world / o.hosts) x.inter += x.intra, x.intra = 0;
    return x;
  }
  // H > 1 hosts: the collectives compose in tiers (common/traffic_math.h).
  const int64_t total = t.total();
  x.inter = traffic::inter_host_part(total, o.world, o.hosts);
  x.intra = total - x.inter;
  return x;
}

// Whether the links' rates are known: inside a host, and across hosts when there are several.
bool timed(const PlanOptions& o) {
  return rate(o.intra_bandwidth, o.bandwidth) > 0 && (o.hosts <= 1 || rate(o.inter_bandwidth, o.bandwidth) > 0);
}

// The time model, the one place: intra / intra_bw + (ranks sharing a host's
// link) x inter / inter_bw; without rates the same sum at rate 1 (bytes).
double cost(ShardingStrategy s, const Split& x, const PlanOptions& o) {
  const double sharers = link_sharers(s, o);
  if (!timed(o)) return double(x.intra) + sharers * double(x.inter);
  const double t = x.intra / rate(o.intra_bandwidth, o.bandwidth);
  return x.inter > 0 ? t + sharers * x.inter / rate(o.inter_bandwidth, o.bandwidth) : t;
}

// What the planner assumes about a run's hosts (equal sizes, memory
// readable inside each host), for path::choose.
path::Facts path_facts(const PlanOptions& o) {
  path::Facts f;
  f.ranks = o.world;
  const int per_host = o.world / o.hosts;
  if (o.hosts > 1) {
    f.hosts_differ = detail::cat("the ranks are on ", o.hosts, " hosts");
    f.ranks_sharing_a_host = per_host > 1 ? o.world : 0;
    // --hosts divides --world (validate), so the hosts are of equal size.
    if (per_host < 2) f.layout_blocked = "every host has one rank: nothing moves inside a host";
  }
  return f;
}

}  // namespace

TierTraffic tier_traffic(ShardingStrategy s, const std::vector<UnitSpec>& units, const PlanOptions& o) {
  o.validate();
  TierTraffic t;
  t.strategy = s;
  const int k = state_per_param(o.optimizer);
  const int n = is_hybrid(s) ? o.group() : o.world;
  const int64_t padded = padded_over(units, n);
  const Split x = split(s, traffic(s, padded, o), o);
  t.intra = x.intra;
  t.inter = x.inter;
  t.rest = (s == ShardingStrategy::NO_SHARD ? padded : padded / n) * o.master_bytes * (2 + k);
  if (timed(o)) t.seconds = cost(s, x, o);
  return t;
}

CommCost comm_cost(ShardingStrategy s, const std::vector<UnitSpec>& units, const PlanOptions& o) {
  o.validate();
  FSDP_USER_CHECK(!units.empty(), "plan: expected at least one unit, found none.");
  const int n = is_hybrid(s) ? o.group() : o.world;
  auto of = [&](const UnitSpec& u) { return traffic(s, shard::padded_numel(u.numel, n), o); };
  CommCost c;
  c.timed = timed(o);
  for (auto& u : units) c.total += cost(s, split(s, of(u), o), o);
  if (units.size() == 1) {
    // Nothing to prefetch; the one reduce waits for the whole backward.
    c.exposed_min = c.total;
  } else {
    // Forward computes nothing before the root and the first unit it runs
    // are gathered; backward ends with their reduces. FULL_SHARD and
    // HYBRID_SHARD gather twice (the backward all-gather is prefetched).
    const bool twice = s == ShardingStrategy::FULL_SHARD || s == ShardingStrategy::HYBRID_SHARD;
    for (size_t i = 0; i < 2; ++i) {
      const Traffic t = of(units[i]);
      Traffic gather, reduce;
      gather.all_gather = twice ? t.all_gather / 2 : t.all_gather;
      reduce.reduce_scatter = t.reduce_scatter;
      reduce.all_reduce = t.all_reduce;
      c.first_gather += cost(s, split(s, gather, o), o);
      c.last_reduce += cost(s, split(s, reduce, o), o);
    }
    c.exposed_min = c.first_gather + c.last_reduce;
  }
  c.compute_weighed = c.timed && o.compute_seconds > 0;
  c.exposed = c.compute_weighed ? std::max(c.exposed_min, c.total - o.compute_seconds) : c.exposed_min;
  return c;
}

TierComparison compare_tiers(const std::vector<UnitSpec>& units, const PlanOptions& o) {
  TierComparison c;
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD,
                 ShardingStrategy::HYBRID_SHARD, ShardingStrategy::HYBRID_SHARD_ZERO2})
    c.rows.push_back(tier_traffic(s, units, o));
  return c;
}

std::string tiers_str(const TierComparison& c, const PlanOptions& o) {
  std::ostringstream os;
  const double intra_bw = rate(o.intra_bandwidth, o.bandwidth), inter_bw = rate(o.inter_bandwidth, o.bandwidth);
  os << "\ntraffic per step by tier (" << o.hosts << " host(s) x " << o.world / o.hosts << " ranks; HYBRID: shard "
     << "groups of S = " << o.group() << ", R = " << o.world / o.group() << " replicas)";
  if (intra_bw > 0 && inter_bw > 0)
    os << ", intra " << format_bandwidth(intra_bw) << " per rank, inter " << format_bandwidth(inter_bw) << " per host";
  os << "\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-20s %14s %14s %14s %12s\n", "strategy", "intra-host", "inter-host",
                "rest (P+G+O)", "comm time");
  os << buf;
  for (auto& r : c.rows) {
    char t[32] = "?";
    if (r.seconds > 0) std::snprintf(t, sizeof t, "%.1f ms", 1e3 * r.seconds);
    std::snprintf(buf, sizeof buf, "  %-20s %14s %14s %14s %12s\n", strategy_name(r.strategy),
                  memory::format_bytes(r.intra).c_str(), memory::format_bytes(r.inter).c_str(),
                  memory::format_bytes(r.rest).c_str(), t);
    os << buf;
  }
  if (!timed(o)) os << "  (times: pass --intra-bw and --inter-bw, e.g. 10GB/s and 1Gbit/s)\n";
  const path::Choice chosen = path::choose(path_facts(o));
  os << "  (per rank; the non-hybrid collectives take " << path::words(chosen.path) << ": " << chosen.reason << ")\n";
  return os.str();
}

}  // namespace fsdp::plan
