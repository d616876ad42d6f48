// fsdp-cpp tests: the planner across hosts with compression (FSDP_COMPRESS;
// include/fsdp/plan.h, "Compressed"): the bytes each strategy sends across
// hosts quantized, against comm::wire_bytes computed by hand per unit and
// chunk; the choice of what is compressed follows path::choose; whether it
// pays on a slow and a fast link; `fsdp plan --compress` and its JSON.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "common/collective_path.h"
#include "comm/quantize.h"
#include "fsdp/errors.h"
#include "fsdp/plan.h"
#include "test_util.h"

namespace FSDP_TEST_ID {

using namespace fsdp::plan;
using fsdp::ShardingStrategy;
using fsdp::comm::QuantFormat;
using fsdp::comm::QuantKind;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// The run's formats (comm::tier_compression): blocks of 256, fp32 scales.
int64_t w8(int64_t n) { return fsdp::comm::wire_bytes(QuantFormat{QuantKind::INT8, 256, c10::kFloat}, n); }
int64_t w4(int64_t n) { return fsdp::comm::wire_bytes(QuantFormat{QuantKind::INT4, 256, c10::kFloat}, n); }

// N ranks on H hosts, fp32, each rank with its own copy of the units.
PlanOptions across(int world, int hosts, const std::string& compress) {
  PlanOptions o;
  o.world = world;
  o.hosts = hosts;
  o.compress = compress;
  return o;
}

const CompressedTraffic& only(const TierTraffic& t) {
  EXPECT_EQ(t.compressed.size(), 1u);
  return t.compressed.at(0);
}

// FULL_SHARD at 2 hosts x 2 ranks takes the tiers: per unit of padded P
// elements, m = P/4 a rank, each of its two all-gathers and its
// reduce-scatter sends (H-1) = 1 block of m across, quantized with blocks
// restarting at each unit's block.
TEST(PlanCompress, FullShardOnTheTiersSendsTheWireBytesOfEachUnitsBlock) {
  // Blocks of m = 1, 7, 256, 257 and 16387 elements (scales: 1, 1, 1, 2, 65).
  const std::vector<UnitSpec> units{{"", 4}, {"a", 28}, {"b", 1024}, {"c", 1028}, {"d", 65548}};
  int64_t exact = 0, int8 = 0, int4 = 0, m_all = 0;
  for (auto& u : units) {
    const int64_t m = u.numel / 4;
    exact += 3 * m * 4;  // fp32
    int8 += 3 * w8(m);
    int4 += 2 * w8(m) + w4(m);  // int4: the parameters stay int8
    m_all += m;
  }
  const TierTraffic t8 = tier_traffic(ShardingStrategy::FULL_SHARD, units, across(4, 2, "int8"));
  EXPECT_EQ(t8.inter, exact);
  EXPECT_EQ(only(t8).compress, "int8");
  EXPECT_TRUE(only(t8).applies);
  EXPECT_EQ(only(t8).inter, int8);
  EXPECT_EQ(only(t8).why, "quantized across hosts: all-gathers int8, reduce-scatters int8");
  // Per call: the all-gather quantizes its block and decodes H of them; the
  // reduce-scatter quantizes H chunks and decodes 2H (its peers' and, for
  // error feedback, what it sent).
  EXPECT_EQ(only(t8).quantized, 2 * m_all + 2 * m_all);
  EXPECT_EQ(only(t8).decoded, 2 * 2 * m_all + 4 * m_all);
  const TierTraffic t4 = tier_traffic(ShardingStrategy::FULL_SHARD, units, across(4, 2, "int4"));
  EXPECT_EQ(only(t4).inter, int4);
  EXPECT_EQ(only(t4).why, "quantized across hosts: all-gathers int8, reduce-scatters int4");
  // fp8 e4m3 weights take int8's bytes; its gradients are int8.
  const TierTraffic f8 = tier_traffic(ShardingStrategy::FULL_SHARD, units, across(4, 2, "fp8"));
  EXPECT_EQ(only(f8).inter, int8);
  EXPECT_EQ(only(f8).why, "quantized across hosts: all-gathers fp8 e4m3, reduce-scatters int8");
  // SHARD_GRAD_OP gathers once.
  const TierTraffic z = tier_traffic(ShardingStrategy::SHARD_GRAD_OP, units, across(4, 2, "int8"));
  EXPECT_EQ(only(z).inter, int8 / 3 * 2);
  // Off: nothing compressed to show.
  EXPECT_TRUE(tier_traffic(ShardingStrategy::FULL_SHARD, units, across(4, 2, "off")).compressed.empty());
}

// Host-shared units (FSDP_SHARE_HOST on, the tiers): the all-gathers write
// the host's copy and stay exact; the reduce-scatter's hop is quantized.
TEST(PlanCompress, HostSharedAllGathersStayExact) {
  const std::vector<UnitSpec> units{{"", 1000}, {"a", 3000}};
  PlanOptions o = across(4, 2, "int8");
  o.share_host = true;
  const TierTraffic t = tier_traffic(ShardingStrategy::FULL_SHARD, units, o);
  EXPECT_EQ(only(t).inter, 2 * 4 * (250 + 750) + w8(250) + w8(750));
  EXPECT_EQ(only(t).inter, 8000 + 254 + 762);
  EXPECT_EQ(only(t).why, "quantized across hosts: reduce-scatters int8; host-shared all-gathers stay exact");
  EXPECT_EQ(only(t).quantized, 2 * 1000);
  EXPECT_EQ(only(t).decoded, 4 * 1000);
}

// HYBRID_SHARD over 2 hosts x 4 ranks in shard groups of 2: the shard group
// stays inside a host (exact), the replica group (4 ranks, 2 on each host)
// takes the tiers, and each unit's shard (m = P/2) all-reduces across hosts:
// rank 0's chunk of its host (c = ring_chunks(m, 2)[0]) cut in two, e0 and
// e1: the reduce-scatter sends e1 in the gradients' format, the all-gather
// e0 in int8.
TEST(PlanCompress, HybridReplicaAllReduceSendsItsChunksQuantized) {
  const std::vector<UnitSpec> units{{"", 1000}, {"a", 3002}};
  PlanOptions o = across(8, 2, "int8");
  o.shard_group = 2;
  // Unit "": m = 500, c = 250, e = {125, 125}; unit "a": m = 1501, c = 751, e = {376, 375}.
  const TierTraffic t8 = tier_traffic(ShardingStrategy::HYBRID_SHARD, units, o);
  EXPECT_EQ(only(t8).inter, w8(125) + w8(125) + w8(375) + w8(376));
  EXPECT_EQ(only(t8).why, "quantized across hosts: all-reduce int8 + int8");
  EXPECT_EQ(only(t8).quantized, (250 + 125) + (751 + 376));
  EXPECT_EQ(only(t8).decoded, (2 * 250 + 2 * 125) + (2 * 751 + 2 * 376));
  o.compress = "int4";
  const TierTraffic t4 = tier_traffic(ShardingStrategy::HYBRID_SHARD, units, o);
  EXPECT_EQ(only(t4).inter, w4(125) + w8(125) + w4(375) + w8(376));
  // The exact bytes are those of the plan without compression.
  PlanOptions off = o;
  off.compress = "off";
  EXPECT_EQ(t4.inter, tier_traffic(ShardingStrategy::HYBRID_SHARD, units, off).inter);
  EXPECT_GT(t4.inter, 4 * only(t4).inter);
}

// NO_SHARD's gradient all-reduce of the unit unpadded, on the tiers: rank
// 0's chunk of its host, cut in two, as HYBRID's replicas.
TEST(PlanCompress, NoShardAllReduceOnTheTiers) {
  const std::vector<UnitSpec> units{{"", 1001}};
  const TierTraffic t = tier_traffic(ShardingStrategy::NO_SHARD, units, across(4, 2, "int8"));
  // c = ring_chunks(1001, 2)[0] = 501, e = {251, 250}.
  EXPECT_EQ(only(t).inter, w8(250) + w8(251));
  EXPECT_EQ(only(t).quantized, 501 + 251);
}

// One rank per host: every collective of the flat ring crosses a host.
// Whether it travels quantized is path::choose's answer for that
// communicator (the planner asks, it does not decide): HYBRID_SHARD's
// replica group at 2 hosts x 2 ranks, FULL_SHARD at 2 hosts x 1 rank.
TEST(PlanCompress, OneRankPerHostFollowsTheCollectivePath) {
  fsdp::path::Facts f;
  f.ranks = 2;
  f.hosts_differ = "the ranks are on 2 hosts";
  f.layout_blocked = "every host has one rank: nothing moves inside a host";
  f.compress = "int8";
  const bool flat_compressed = fsdp::path::choose(f).compressed;
  const std::vector<UnitSpec> units{{"", 1000}, {"a", 3000}};
  // HYBRID: m = 500 and 1500 a rank; the replica group's one chunk per host.
  const TierTraffic h = tier_traffic(ShardingStrategy::HYBRID_SHARD, units, across(4, 2, "int8"));
  if (flat_compressed) {
    EXPECT_EQ(only(h).inter, w8(250) + w8(250) + w8(750) + w8(750));
  } else {
    EXPECT_EQ(only(h).inter, h.inter);
    EXPECT_FALSE(only(h).applies);
    EXPECT_TRUE(contains(compression_advice(h).line, "HYBRID_SHARD: compression does not apply, its bytes across "
                                                     "hosts stay exact: "))
        << compression_advice(h).line;
  }
  // FULL_SHARD, 2 ranks on 2 hosts: m = 500 and 1500.
  const TierTraffic fs = tier_traffic(ShardingStrategy::FULL_SHARD, units, across(2, 2, "int8"));
  EXPECT_EQ(fs.inter, 3 * 4 * (500 + 1500));
  EXPECT_EQ(only(fs).inter, flat_compressed ? 3 * (w8(500) + w8(1500)) : fs.inter);
  // One host: nothing crosses.
  const TierTraffic one = tier_traffic(ShardingStrategy::FULL_SHARD, units, across(4, 1, "int8"));
  EXPECT_EQ(only(one).inter, 0);
  EXPECT_EQ(only(one).why, "one host: no byte crosses a host");
}

// The time: the tiers' time of the exact intra bytes and the quantized
// inter ones, plus every element quantized or decoded; it pays on a slow
// link and not on a fast one, where the compute outweighs the bytes saved.
TEST(PlanCompress, PaysOnASlowLinkNotOnAFastOne) {
  const std::vector<UnitSpec> units{{"", 1 << 20}, {"a", 1 << 20}};
  PlanOptions o = across(4, 2, "int8");
  o.intra_bandwidth = 2e9;
  o.inter_bandwidth = 25e6;  // 200 Mbit/s
  const TierTraffic slow = tier_traffic(ShardingStrategy::FULL_SHARD, units, o);
  const CompressedTraffic& c = only(slow);
  EXPECT_DOUBLE_EQ(c.quant_seconds, double(c.quantized + c.decoded) * kQuantSecondsPerElement);
  EXPECT_DOUBLE_EQ(c.seconds, slow.intra / 2e9 + 2 * double(c.inter) / 25e6 + c.quant_seconds);
  EXPECT_DOUBLE_EQ(slow.seconds, slow.intra / 2e9 + 2 * double(slow.inter) / 25e6);
  CompressionAdvice a = compression_advice(slow);
  EXPECT_TRUE(a.pays) << a.line;
  EXPECT_EQ(a.compress, "int8");
  EXPECT_TRUE(contains(a.line, "FULL_SHARD: FSDP_COMPRESS=int8 pays: ")) << a.line;
  // --quant-rate: a faster quantizer costs less.
  o.quant_seconds_per_element = 1e-11;
  EXPECT_LT(only(tier_traffic(ShardingStrategy::FULL_SHARD, units, o)).seconds, c.seconds);
  o.quant_seconds_per_element = 0;
  o.inter_bandwidth = 12.5e9;  // 100 Gbit/s
  const TierTraffic fast = tier_traffic(ShardingStrategy::FULL_SHARD, units, o);
  a = compression_advice(fast);
  EXPECT_FALSE(a.pays) << a.line;
  EXPECT_TRUE(contains(a.line, "FULL_SHARD: compression does not pay: ")) << a.line;
  // comm_cost (what recommend() weighs) counts the same step compressed.
  PlanOptions exact = o;
  exact.compress = "off";
  o.inter_bandwidth = exact.inter_bandwidth = 25e6;
  EXPECT_NEAR(comm_cost(ShardingStrategy::FULL_SHARD, units, o).total, c.seconds, 1e-9);
  EXPECT_NEAR(comm_cost(ShardingStrategy::FULL_SHARD, units, exact).total, slow.seconds, 1e-9);
}

TEST(PlanCompress, UnknownCompressionIsRefused) {
  PlanOptions o = across(4, 2, "zstd");
  try {
    o.validate();
    FAIL() << "validate() took compress 'zstd'";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "--compress: expected off, int8, int4 or fp8 (FSDP_COMPRESS's values), found 'zstd'"))
        << e.what();
  }
  EXPECT_THROW(compare_tiers({{"", 8}}, across(4, 2, "off"), {"int8", "off"}), fsdp::Error);
}

// `fsdp plan --hosts 2 ...`: GPT-mini as tests/netns/shaped_link.sh plans
// it, with each rank's own copy of the units.
fsdp::testing::ProcResult plan(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv{fsdp::testing::bin_path("fsdp"), "plan", "--share-host", "off", "--world", "4",
                                "--hosts", "2", "--layers", "4", "--dim", "256", "--heads", "4", "--seq", "64",
                                "--batch", "4", "--intra-bw", "2GB/s"};
  argv.insert(argv.end(), args.begin(), args.end());
  return fsdp::testing::run_command(argv, env);
}

nlohmann::json row_of(const nlohmann::json& j, const std::string& strategy) {
  for (auto& r : j["tiers"]["rows"])
    if (r["strategy"] == strategy) return r;
  ADD_FAILURE() << "no row " << strategy;
  return {};
}

TEST(PlanCompress, CommandComparesInt8AndInt4AndRecommendsOnlyWhereItPays) {
  // 200 Mbit/s: the planned strategy (FULL_SHARD) gains from compression.
  auto slow = plan({"--inter-bw", "200Mbit/s", "--json"});
  ASSERT_EQ(slow.exit_code, 0) << slow.output;
  auto j = nlohmann::json::parse(slow.output);
  EXPECT_EQ(j["tiers"]["formats"], nlohmann::json({"int8", "int4"}));
  for (const char* s : {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"}) {
    auto r = row_of(j, s);
    // The fields shaped_link.sh reads stay, the compressed ones beside them.
    for (const char* k : {"comm_seconds", "inter_bytes", "intra_bytes", "comm_seconds_compressed",
                          "inter_bytes_compressed", "compress", "compressed", "compression_pays"})
      EXPECT_TRUE(r.contains(k)) << s << " " << k;
    EXPECT_EQ(r["compress"], "int8") << s;
    ASSERT_EQ(r["compressed"].size(), 2u) << s;
    EXPECT_EQ(r["compressed"][1]["compress"], "int4") << s;
  }
  auto full = row_of(j, "FULL_SHARD");
  EXPECT_LT(full["comm_seconds_compressed"].get<double>(), full["comm_seconds"].get<double>() / 2);
  EXPECT_LT(full["inter_bytes_compressed"].get<int64_t>(), full["inter_bytes"].get<int64_t>() * 3 / 10);
  EXPECT_EQ(full["compression_pays"], true);
  ASSERT_TRUE(j.contains("compression")) << slow.output;
  EXPECT_EQ(j["compression"]["strategy"], "FULL_SHARD");
  EXPECT_EQ(j["compression"]["pays"], true);
  // int4 gradients send the fewest bytes; at this rate they win.
  EXPECT_EQ(j["compression"]["compress"], "int4");
  auto text = plan({"--inter-bw", "200Mbit/s"});
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(contains(text.output, "compressed across hosts (FSDP_COMPRESS; blocks of 256, fp32 scales")) << text.output;
  EXPECT_TRUE(contains(text.output, "\ncompression: FULL_SHARD: FSDP_COMPRESS=int4 pays: ")) << text.output;
  // 100 Gbit/s: the bytes saved are worth less than quantizing them.
  auto fast = plan({"--inter-bw", "100Gbit/s"});
  ASSERT_EQ(fast.exit_code, 0) << fast.output;
  EXPECT_TRUE(contains(fast.output, "\ncompression: FULL_SHARD: compression does not pay: ")) << fast.output;
  EXPECT_FALSE(contains(fast.output, "pays: ")) << fast.output;
}

TEST(PlanCompress, CommandTakesTheRunsCompressionAndRefusesAnUnknownOne) {
  // FSDP_COMPRESS in the environment is the run's: that format alone.
  auto env = plan({"--inter-bw", "200Mbit/s", "--json"}, {"FSDP_COMPRESS=int4"});
  ASSERT_EQ(env.exit_code, 0) << env.output;
  auto j = nlohmann::json::parse(env.output);
  EXPECT_EQ(j["tiers"]["formats"], nlohmann::json({"int4"}));
  EXPECT_EQ(row_of(j, "FULL_SHARD")["compress"], "int4");
  // --compress wins over it; off compares nothing.
  auto off = plan({"--inter-bw", "200Mbit/s", "--compress", "off"}, {"FSDP_COMPRESS=int4"});
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_FALSE(contains(off.output, "compressed across hosts")) << off.output;
  EXPECT_TRUE(contains(off.output, "(compression: --compress off)")) << off.output;
  auto bad = plan({"--compress", "zstd"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "--compress: expected off, int8, int4 or fp8 (FSDP_COMPRESS's values), found 'zstd'"))
      << bad.output;
  auto rate = plan({"--quant-rate", "fast"});
  EXPECT_EQ(rate.exit_code, 2) << rate.output;
  EXPECT_TRUE(contains(rate.output, "--quant-rate: expected elements per second, a number > 0 such as 2e9, found "
                                    "'fast'"))
      << rate.output;
}

// --budget with the run's compression: recommend() weighs the step as the
// run sends it, quantized where the path compresses.
TEST(PlanCompress, TheRecommendationWeighsTheRunsCompression) {
  auto weighed = [](const std::vector<std::string>& more) {
    auto r = plan(more);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto j = nlohmann::json::parse(r.output);
    for (auto& c : j["recommendation"]["candidates"])
      if (c["strategy"] == "FULL_SHARD" && c["wrap"] == "block") return c["total_comm"].get<double>();
    ADD_FAILURE() << "no FULL_SHARD block candidate";
    return 0.0;
  };
  const std::vector<std::string> args{"--inter-bw", "200Mbit/s", "--strategy", "auto", "--budget", "8GiB", "--json"};
  std::vector<std::string> int8 = args, off = args;
  int8.insert(int8.end(), {"--compress", "int8"});
  off.insert(off.end(), {"--compress", "off"});
  const double exact = weighed(off), compressed = weighed(int8);
  EXPECT_LT(compressed, exact / 2);
  auto text = plan({"--inter-bw", "200Mbit/s", "--strategy", "auto", "--budget", "8GiB", "--compress", "int8"});
  EXPECT_TRUE(contains(text.output, "; FSDP_COMPRESS=int8: the collectives its path compresses weigh their quantized "
                                    "bytes and the time to quantize and decode them"))
      << text.output;
}

}  // namespace FSDP_TEST_ID
