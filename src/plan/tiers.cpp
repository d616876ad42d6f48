// fsdp-cpp planner: traffic and time per tier, intra-host and inter-host
// (include/fsdp/plan.h, "Two tiers"). The byte counts are the engine's
// counters' (src/comm: the composed tiers of src/comm/tiers.h across hosts
// of equal size; the flat ring's tier is its right neighbour's host), tested
// against a run in tests/test_hybrid.cpp.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/shard_math.h"
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

}  // namespace

TierTraffic tier_traffic(ShardingStrategy s, const std::vector<UnitSpec>& units, const PlanOptions& o) {
  o.validate();
  TierTraffic t;
  t.strategy = s;
  const double intra_bw = rate(o.intra_bandwidth, o.bandwidth), inter_bw = rate(o.inter_bandwidth, o.bandwidth);
  const int k = state_per_param(o.optimizer);
  if (is_hybrid(s)) {
    const int S = o.group();
    const int64_t padded = padded_over(units, S);
    const Traffic all = traffic(s, padded, o);
    t.inter = o.world / S > 1 ? all.all_reduce : 0;
    t.intra = all.total() - t.inter;
    // The shard group must sit inside one host for its traffic to stay there.
    if (S > o.world / o.hosts) t.inter += t.intra, t.intra = 0;
    t.rest = padded / S * o.master_bytes * (2 + k);
    if (intra_bw > 0 && inter_bw > 0) t.seconds = t.intra / intra_bw + double(S) * t.inter / inter_bw;
    return t;
  }
  const int64_t padded = padded_over(units, o.world);
  const int64_t total = traffic(s, padded, o).total();
  // H > 1 hosts of S ranks: the collectives compose (CMA inside each host,
  // TCP between ranks of the same local index), so every rank sends (H-1)
  // of the (N-1) blocks of an all-gather or reduce-scatter across, and as
  // much of an all-reduce: (H-1)/(N-1) of its traffic. S = 1: all of it.
  const int H = o.hosts, S = o.world / o.hosts;
  if (H > 1) {
    t.inter = total / (o.world - 1) * (H - 1);
    t.intra = total - t.inter;
  } else {
    t.intra = total;
  }
  t.rest = (s == ShardingStrategy::NO_SHARD ? padded : padded / o.world) * o.master_bytes * (2 + k);
  // The S ranks of a host share its link.
  if (H > 1 && intra_bw > 0 && inter_bw > 0) t.seconds = t.intra / intra_bw + double(S) * t.inter / inter_bw;
  if (H <= 1 && intra_bw > 0) t.seconds = total / intra_bw;
  return t;
}

TierComparison compare_tiers(const std::vector<UnitSpec>& units, const PlanOptions& o) {
  TierComparison c;
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD,
                 ShardingStrategy::HYBRID_SHARD, ShardingStrategy::HYBRID_SHARD_ZERO2})
    c.rows.push_back(tier_traffic(s, units, o));
  const TierTraffic& full = c.rows[0];
  const TierTraffic& hybrid = c.rows[3];
  const bool timed = full.seconds > 0 && hybrid.seconds > 0;
  // HYBRID costs memory ((P+G+O)/S instead of /N): worth it only when it
  // saves a fifth of the communication time at least. It always sends a
  // little less in all (2.5P against 2.625P at 2 x 4), so a tie goes to
  // FULL_SHARD. Without rates: by the bytes crossing, the inter-host link
  // assumed the slow one.
  const bool hybrid_wins = o.hosts > 1 && o.world / o.group() > 1 &&
                           (timed ? hybrid.seconds < 0.8 * full.seconds : hybrid.inter < full.inter);
  c.best = hybrid_wins ? ShardingStrategy::HYBRID_SHARD : ShardingStrategy::FULL_SHARD;
  std::ostringstream why;
  if (o.hosts <= 1) {
    why << "one host: every strategy's traffic stays inside it; HYBRID_SHARD would only hold more per rank.";
  } else if (hybrid_wins) {
    why << "the inter-host link dominates: FULL_SHARD sends "
        << memory::format_bytes(full.inter) << " per rank per step across it, HYBRID_SHARD only the shards' all-reduce, "
        << memory::format_bytes(hybrid.inter) << " per rank (" << o.group() << " ranks share each host's link)";
    if (timed) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "; ~%.1f ms against ~%.1f ms", 1e3 * hybrid.seconds, 1e3 * full.seconds);
      why << buf;
    }
    why << ". Its cost: (P+G+O)/S = " << memory::format_bytes(hybrid.rest) << " per rank at rest instead of "
        << "(P+G+O)/N = " << memory::format_bytes(full.rest) << ".";
  } else {
    why << "the inter-host link is fast enough: FULL_SHARD keeps (P+G+O)/N = " << memory::format_bytes(full.rest)
        << " per rank and is not 20% slower";
    if (timed) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " (~%.1f ms against HYBRID's ~%.1f ms)", 1e3 * full.seconds,
                    1e3 * hybrid.seconds);
      why << buf;
    }
    why << ".";
  }
  c.why = why.str();
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
  if (!(intra_bw > 0 && inter_bw > 0)) os << "  (times: pass --intra-bw and --inter-bw, e.g. 10GB/s and 1Gbit/s)\n";
  os << "  (per rank; across hosts the non-hybrid collectives compose tiers: CMA inside a host, TCP between)\n";
  os << "=> for these links: " << strategy_name(c.best) << ": " << c.why << "\n";
  return os.str();
}

}  // namespace fsdp::plan
