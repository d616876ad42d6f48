// fsdp-cpp planner: traffic and time per tier, intra-host and inter-host
// (include/fsdp/plan.h, "Two tiers"), and the communication a step cannot
// hide behind compute (comm_cost, what recommend() weighs). The byte counts
// are the engine's counters' (src/comm: the composed tiers of
// src/comm/tiers.h across hosts of equal size; the flat ring's tier is its
// right neighbour's host), tested against a run in tests/test_hybrid.cpp.
// With FSDP_COMPRESS (PlanOptions::compress) the same steps as the
// compressed collectives send them (plan.h, "Compressed"; src/comm/quantized.h
// lists each rank's bytes), and whether that pays (compression_advice).
#include <algorithm>
#include <cmath>
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

// Compression pays where it shortens a step's communication by more than this
// share (recommend()'s tie: within 1% the simpler run wins).
constexpr double kCompressTie = 0.01;

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

// What the planner assumes about a communicator of `ranks` ranks on `hosts`
// hosts (equal sizes, memory readable inside each host), for path::choose,
// with the plan's host sharing and compression.
path::Facts group_facts(int ranks, int hosts, const PlanOptions& o) {
  path::Facts f;
  f.ranks = ranks;
  f.share_host = o.share_host;
  f.compress = o.compress;
  const int per_host = ranks / hosts;
  if (hosts > 1) {
    f.hosts_differ = detail::cat("the ranks are on ", hosts, " hosts");
    f.ranks_sharing_a_host = per_host > 1 ? ranks : 0;
    if (ranks % hosts != 0)
      f.layout_blocked = "the hosts have unequal numbers of ranks";
    else if (per_host < 2)
      f.layout_blocked = "every host has one rank: nothing moves inside a host";
  }
  return f;
}

// The world's communicator (--hosts divides --world: hosts of equal size).
path::Facts path_facts(const PlanOptions& o) { return group_facts(o.world, o.hosts, o); }

// ---------------------------------------------------------------------------
// Compression (plan.h, "Compressed").

}  // namespace

// Measured with comm::quantize, dequantize and ErrorFeedback on fp32 CPU
// tensors of 2^20 and 2^22 elements, blocks of 256 with fp32 scales, one
// thread, the thread's CPU time (2026-12-08, this project's 2-core x86-64
// machine, libtorch 2.15; the machine was busy, wall times ran 1.5x higher):
// quantize int8 11 ns an element, int4 7.7 ns, fp8 4-11 ns; dequantize 2-6
// ns; error feedback's compensate + remember 2.5-4 ns. The collectives
// decode about twice what they quantize (plan.h, "Compressed"; the
// reduce-scatter's error feedback on what it quantizes besides):
// (11 + 2 x 3.5) / 3 + 0.5 = 6.5 ns an element of either.
const double kQuantSecondsPerElement = 6.5e-9;

namespace {

// comm/quantize.h's wire_bytes for the run's formats (comm::tier_compression:
// blocks of 256 elements, fp32 scales), torch-free: the planner links no
// torch. PlanCompress.* checks it against comm::wire_bytes.
constexpr int64_t kQuantBlock = 256, kScaleBytes = 4;
int64_t wire(int64_t n, bool int4) { return (n + kQuantBlock - 1) / kQuantBlock * kScaleBytes + (int4 ? (n + 1) / 2 : n); }

// A communicator of the run and what path::choose makes of it.
struct Group {
  int ranks = 1, hosts = 1;
  path::Choice choice;
};
Group group(int ranks, int hosts, const PlanOptions& o) {
  return {ranks, hosts, path::choose(group_facts(ranks, hosts, o))};
}

// One strategy's communicators: the one its all-gathers and reduce-scatters
// take (the world's, HYBRID's shard group), and the one its all-reduce takes
// (NO_SHARD: the world's, HYBRID's replica group; ranks in host order, a
// shard group of consecutive ranks).
struct Groups {
  Group shard, reduce;
};
Groups groups_of(ShardingStrategy s, const PlanOptions& o) {
  if (!is_hybrid(s)) {
    const Group world = group(o.world, o.hosts, o);
    return {world, world};
  }
  const int S = o.group(), R = o.world / S, per_host = o.world / o.hosts;
  // A shard group larger than a host spans S / per_host of them; a replica
  // group (ranks r, r + S, ...) has one rank per host when S covers a host,
  // else per_host / S on each.
  const int shard_hosts = S > per_host ? (S + per_host - 1) / per_host : 1;
  const int replica_hosts = o.hosts <= 1 ? 1 : S >= per_host ? R : o.hosts;
  return {group(S, shard_hosts, o), group(R, replica_hosts, o)};
}

// comm::ring_chunks(n, parts).count[j], torch-free: the first n % parts
// chunks one element longer.
int64_t ring_chunk(int64_t n, int parts, int j) { return n / parts + (j < n % parts ? 1 : 0); }

// One collective call of one unit for rank 0 where its communicator
// compresses it: the bytes its cross-host hop sends exact and quantized,
// and the elements it quantizes and decodes. All zero where it stays exact.
struct Hop {
  int64_t exact = 0, wire = 0, quantized = 0, decoded = 0;
};

// A unit's all-gather (m elements a rank) on `g`, in the parameters' format
// (int8 and fp8 e4m3 take the same bytes), unless the unit is host-shared.
Hop gather_hop(ShardingStrategy s, const UnitSpec& u, int64_t m, const Group& g, const PlanOptions& o) {
  const bool shared = path::host_shared_unit({s, /*on_cpu=*/true, u.numel, g.ranks, g.choice.host_shared});
  if (!g.choice.compressed || shared || g.hosts < 2) return {};
  const int h = g.hosts;
  return {(h - 1) * m * o.param_bytes, (h - 1) * wire(m, false), m, h * m};
}

// A unit's reduce-scatter (m elements a rank) on `g`, in the gradients' format.
Hop reduce_hop(int64_t m, const Group& g, const PlanOptions& o) {
  if (!g.choice.compressed || g.hosts < 2) return {};
  const int h = g.hosts;
  return {(h - 1) * m * o.reduce(), (h - 1) * wire(m, o.compress == "int4"), h * m, 2 * h * m};
}

// An all-reduce of n elements on `g`: rank 0's chunk over its host
// (ring_chunks(n, ranks per host)[0]) cut in h, a quantized reduce-scatter
// straight to each chunk's owner in the gradients' format, then the ring's
// quantized all-gather of the reduced chunks in int8. (`exact`: set by the
// caller, the tier model's bytes for it.)
Hop all_reduce_hop(int64_t n, const Group& g, const PlanOptions& o) {
  if (!g.choice.compressed || g.hosts < 2) return {};
  const int h = g.hosts;
  const int64_t c = ring_chunk(n, g.ranks / h, 0), e0 = ring_chunk(c, h, 0);
  Hop hop;
  for (int k = 0; k < h; ++k) {
    const int64_t e = ring_chunk(c, h, k);
    if (k != 0) hop.wire += wire(e, o.compress == "int4");  // the reduce-scatter: to chunk k's owner
    if (k != 1) hop.wire += wire(e, false);                 // the all-gather's ring: all but the right neighbour's
  }
  hop.quantized = c + e0;
  hop.decoded = 2 * c + h * e0;
  return hop;
}

double seconds_per_element(const PlanOptions& o) {
  return o.quant_seconds_per_element > 0 ? o.quant_seconds_per_element : kQuantSecondsPerElement;
}

// What one unit sends in `gathers` of its all-gathers and (with `reduces`)
// all of its reduces of a step, as the run sends them under o.compress: by
// tier (inter quantized where compressed), the elements quantized and
// decoded, and which kinds crossed quantized.
struct Part {
  Split x;
  int64_t quantized = 0, decoded = 0;
  bool gathers_quantized = false, gathers_shared = false, reduces_quantized = false, all_reduce_quantized = false;
};
Part part(ShardingStrategy s, const UnitSpec& u, int64_t gathers, bool reduces, const Groups& g,
          const PlanOptions& o) {
  const int n = is_hybrid(s) ? o.group() : o.world;
  const int64_t padded = shard::padded_numel(u.numel, n), m = padded / n;
  const bool sharded = s != ShardingStrategy::NO_SHARD;
  const int64_t K = o.micro_steps, KR = o.no_sync ? 1 : K;
  const int64_t per_step_gathers =
      s == ShardingStrategy::FULL_SHARD || s == ShardingStrategy::HYBRID_SHARD ? 2 * K : sharded ? K : 0;
  const Traffic t = traffic(s, padded, o);
  Traffic sub;
  if (per_step_gathers > 0) sub.all_gather = t.all_gather / per_step_gathers * gathers;
  if (reduces) sub.reduce_scatter = t.reduce_scatter, sub.all_reduce = t.all_reduce;
  Part p;
  p.x = split(s, sub, o);
  if (o.compress == "off") return p;
  if (sharded && gathers > 0) {
    const Hop a = gather_hop(s, u, m, g.shard, o);
    p.x.inter += gathers * (a.wire - a.exact);
    p.quantized += gathers * a.quantized, p.decoded += gathers * a.decoded;
    p.gathers_quantized = a.wire > 0;
    p.gathers_shared = g.shard.choice.compressed && a.wire == 0 && u.numel > 0;
  }
  if (!reduces) return p;
  if (sharded) {
    const Hop r = reduce_hop(m, g.shard, o);
    p.x.inter += KR * (r.wire - r.exact);
    p.quantized += KR * r.quantized, p.decoded += KR * r.decoded;
    p.reduces_quantized = r.wire > 0;
  }
  if (t.all_reduce > 0) {
    // NO_SHARD reduces the unit's gradient unpadded; HYBRID each rank's shard.
    const Hop r = all_reduce_hop(sharded ? m : u.numel, g.reduce, o);
    if (r.wire > 0) {
      Traffic ar;
      ar.all_reduce = t.all_reduce;
      p.x.inter += KR * r.wire - split(s, ar, o).inter;
      p.quantized += KR * r.quantized, p.decoded += KR * r.decoded;
      p.all_reduce_quantized = true;
    }
  }
  return p;
}

// Which collectives cross quantized, or why none does.
std::string compressed_why(ShardingStrategy s, const Part& p, const Groups& g, const PlanOptions& o) {
  std::vector<std::string> kinds;
  if (p.gathers_quantized) kinds.push_back("all-gathers " + std::string(o.compress == "fp8" ? "fp8 e4m3" : "int8"));
  if (p.reduces_quantized) kinds.push_back("reduce-scatters " + std::string(o.compress == "int4" ? "int4" : "int8"));
  if (p.all_reduce_quantized)
    kinds.push_back("all-reduce " + std::string(o.compress == "int4" ? "int4" : "int8") + " + int8");
  if (kinds.empty()) {
    if (o.hosts <= 1) return "one host: no byte crosses a host";
    // The communicator whose bytes cross: HYBRID's replica group, else the world's.
    const std::string& reason = (is_hybrid(s) ? g.reduce : g.shard).choice.reason;
    const size_t at = reason.find("ignored: ");
    return at == std::string::npos ? reason : reason.substr(at + 9);
  }
  std::string why = "quantized across hosts: ";
  for (size_t i = 0; i < kinds.size(); ++i) why += (i ? ", " : "") + kinds[i];
  if (p.gathers_shared) why += "; host-shared all-gathers stay exact";
  return why;
}

bool known_compress(const std::string& c) { return c == "off" || c == "int8" || c == "int4" || c == "fp8"; }

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
  if (o.compress == "off") return t;
  // The same step under o.compress: each unit's cross-host hops as the run
  // quantizes them (blocks restart at each unit's block or chunk).
  PlanOptions exact = o;
  exact.compress = "off";
  const Groups g = groups_of(s, o);
  const int64_t gathers = s == ShardingStrategy::FULL_SHARD || s == ShardingStrategy::HYBRID_SHARD ? 2 * o.micro_steps
                          : s == ShardingStrategy::NO_SHARD                                      ? 0
                                                                                                 : o.micro_steps;
  CompressedTraffic c;
  c.compress = o.compress;
  c.inter = x.inter;
  Part seen;  // which kinds crossed quantized, over the units
  for (auto& u : units) {
    const Part q = part(s, u, gathers, true, g, o);
    c.inter += q.x.inter - part(s, u, gathers, true, g, exact).x.inter;
    c.quantized += q.quantized, c.decoded += q.decoded;
    seen.gathers_quantized |= q.gathers_quantized, seen.gathers_shared |= q.gathers_shared;
    seen.reduces_quantized |= q.reduces_quantized, seen.all_reduce_quantized |= q.all_reduce_quantized;
  }
  c.applies = seen.gathers_quantized || seen.reduces_quantized || seen.all_reduce_quantized;
  c.why = compressed_why(s, seen, g, o);
  c.quant_seconds = double(c.quantized + c.decoded) * seconds_per_element(o);
  if (timed(o)) c.seconds = cost(s, {x.intra, c.inter}, o) + c.quant_seconds;
  t.compressed.push_back(c);
  return t;
}

CommCost comm_cost(ShardingStrategy s, const std::vector<UnitSpec>& units, const PlanOptions& o) {
  o.validate();
  FSDP_USER_CHECK(!units.empty(), "plan: expected at least one unit, found none.");
  const Groups g = groups_of(s, o);
  CommCost c;
  c.timed = timed(o);
  // A part's cost: its bytes through the tiers, and with the rates the time
  // it quantizes and decodes (o.compress; bytes cannot weigh it).
  auto of = [&](const Part& p) {
    return cost(s, p.x, o) + (c.timed ? double(p.quantized + p.decoded) * seconds_per_element(o) : 0.0);
  };
  // FULL_SHARD and HYBRID_SHARD gather twice (the backward all-gather is prefetched).
  const bool twice = s == ShardingStrategy::FULL_SHARD || s == ShardingStrategy::HYBRID_SHARD;
  const int64_t gathers = s == ShardingStrategy::NO_SHARD ? 0 : (twice ? 2 : 1) * o.micro_steps;
  for (auto& u : units) c.total += of(part(s, u, gathers, true, g, o));
  if (units.size() == 1) {
    // Nothing to prefetch; the one reduce waits for the whole backward.
    c.exposed_min = c.total;
  } else {
    // Forward computes nothing before the root and the first unit it runs
    // are gathered; backward ends with their reduces.
    for (size_t i = 0; i < 2; ++i) {
      c.first_gather += of(part(s, units[i], twice ? gathers / 2 : gathers, false, g, o));
      c.last_reduce += of(part(s, units[i], 0, true, g, o));
    }
    c.exposed_min = c.first_gather + c.last_reduce;
  }
  c.compute_weighed = c.timed && o.compute_seconds > 0;
  c.exposed = c.compute_weighed ? std::max(c.exposed_min, c.total - o.compute_seconds) : c.exposed_min;
  return c;
}

TierComparison compare_tiers(const std::vector<UnitSpec>& units, const PlanOptions& o,
                             const std::vector<std::string>& formats) {
  TierComparison c;
  c.formats = formats;
  if (c.formats.empty() && o.compress != "off") c.formats.push_back(o.compress);
  for (auto& f : c.formats)
    FSDP_USER_CHECK(known_compress(f) && f != "off", "plan: a compression to compare: expected int8, int4 or fp8 "
                    "(FSDP_COMPRESS's values), found '", f, "'");
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD,
                 ShardingStrategy::HYBRID_SHARD, ShardingStrategy::HYBRID_SHARD_ZERO2}) {
    PlanOptions exact = o;
    exact.compress = "off";
    TierTraffic row = tier_traffic(s, units, exact);
    for (auto& f : c.formats) {
      PlanOptions with = o;
      with.compress = f;
      row.compressed.push_back(tier_traffic(s, units, with).compressed.at(0));
    }
    c.rows.push_back(std::move(row));
  }
  return c;
}

namespace {

std::string ms(double seconds) {
  char buf[32];
  const double v = 1e3 * seconds;
  std::snprintf(buf, sizeof buf, v >= 10 || v == 0 ? "%.1f ms" : v >= 1 ? "%.2f ms" : "%.3f ms", v);
  return buf;
}

}  // namespace

CompressionAdvice compression_advice(const TierTraffic& row) {
  CompressionAdvice a;
  a.strategy = row.strategy;
  a.exact_seconds = row.seconds;
  const std::string name = strategy_name(row.strategy);
  const CompressedTraffic* best = nullptr;
  for (auto& c : row.compressed)
    if (c.applies && (!best || c.seconds < best->seconds)) best = &c;
  if (row.compressed.empty()) {
    a.line = name + ": no compression weighed (--compress off)";
    return a;
  }
  if (!best) {
    a.line = name + ": compression does not apply, its bytes across hosts stay exact: " + row.compressed.front().why;
    return a;
  }
  a.compressed_seconds = best->seconds;
  if (row.seconds <= 0 || best->seconds <= 0) {
    a.line = name + ": whether compression pays needs the link rates (--intra-bw and --inter-bw): FSDP_COMPRESS=" +
             best->compress + " sends " + memory::format_bytes(best->inter) + " across hosts instead of " +
             memory::format_bytes(row.inter);
    return a;
  }
  const double saved = row.seconds - best->seconds;
  char pct[16];
  std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * std::abs(saved) / row.seconds);
  if (saved > kCompressTie * row.seconds) {
    a.pays = true;
    a.compress = best->compress;
    a.line = name + ": FSDP_COMPRESS=" + best->compress + " pays: " + ms(row.seconds) + " -> " + ms(best->seconds) +
             " of communication per step, " + ms(saved) + " (" + pct + ") shorter (" +
             memory::format_bytes(best->inter) + " across hosts instead of " + memory::format_bytes(row.inter) +
             "; quantizing and decoding " + ms(best->quant_seconds) + ")";
  } else {
    a.line = name + ": compression does not pay: " + ms(row.seconds) + " exact, " + ms(best->seconds) +
             " with FSDP_COMPRESS=" + best->compress + " (the link saves " +
             ms(row.seconds - (best->seconds - best->quant_seconds)) + ", quantizing and decoding costs " +
             ms(best->quant_seconds) + ")";
  }
  return a;
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
  // (With the run's compression, the reason says what crosses quantized.)
  const path::Choice chosen = path::choose(path_facts(o));
  os << "  (per rank; the non-hybrid collectives take " << path::words(chosen.path) << ": " << chosen.reason << ")\n";
  if (c.formats.empty() || o.hosts <= 1) return os.str();
  // The same steps compressed: inter-host bytes and time per format.
  os << "\ncompressed across hosts (FSDP_COMPRESS; blocks of 256, fp32 scales; rank 0's bytes; quantizing or "
        "decoding "
     << seconds_per_element(o) * 1e9 << " ns an element" << (o.quant_seconds_per_element > 0 ? ", --quant-rate" : "")
     << ")\n";
  std::snprintf(buf, sizeof buf, "  %-20s", "strategy");
  os << buf;
  for (auto& f : c.formats) {
    std::snprintf(buf, sizeof buf, " %14s %12s", (f + " inter").c_str(), (f + " time").c_str());
    os << buf;
  }
  os << "\n";
  for (auto& r : c.rows) {
    std::snprintf(buf, sizeof buf, "  %-20s", strategy_name(r.strategy));
    os << buf;
    for (auto& q : r.compressed) {
      char t[32] = "?";
      if (q.seconds > 0) std::snprintf(t, sizeof t, "%.1f ms", 1e3 * q.seconds);
      std::snprintf(buf, sizeof buf, " %14s %12s", memory::format_bytes(q.inter).c_str(), q.applies ? t : "exact");
      os << buf;
    }
    os << "\n";
  }
  for (auto& r : c.rows) os << "  " << compression_advice(r).line << "\n";
  return os.str();
}

}  // namespace fsdp::plan
