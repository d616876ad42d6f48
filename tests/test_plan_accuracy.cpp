// The planner against real runs: for several GPT-mini sizes, N in {1,2,3} and
// every strategy, `fsdp plan --json` predicts the per-rank peak within 10% and
// the traffic per step within 1% of what the library measures (the counting
// allocator's peak, the communicator's byte counters) in a real training step
// (tests/workers/plan_scenarios.cpp: build/bin/gpt's step, measured after one
// warm-up step).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace FSDP_TEST_ID {

using fsdp::testing::bin_path;
using fsdp::testing::run_command;
using fsdp::testing::run_ranks;

struct Config {
  std::string strategy, wrap;
  int64_t L, d, h, V, T, B;
  std::string dtype = "fp32";
  int prefetch = 0;
  std::string ac = "none";  // activation checkpointing (gpt --ac)

  std::string arg() const {
    std::ostringstream os;
    os << strategy << "," << wrap << "," << L << "," << d << "," << h << "," << V << "," << T << "," << B << ","
       << dtype << "," << prefetch;
    if (ac != "none") os << "," << ac;
    return os.str();
  }
};

struct Measured {
  int64_t rest = 0, peak = 0, ag = 0, rs = 0, ar = 0, A = 0;
};

nlohmann::json plan_json(const Config& c, int N) {
  auto r = run_command({bin_path("fsdp"), "plan", "--json", "--model", "gpt", "--layers", std::to_string(c.L), "--dim",
                        std::to_string(c.d), "--heads", std::to_string(c.h), "--vocab", std::to_string(c.V), "--seq",
                        std::to_string(c.T), "--batch", std::to_string(c.B), "--world", std::to_string(N),
                        "--strategy", c.strategy, "--wrap", c.wrap, "--dtype", c.dtype, "--prefetch",
                        std::to_string(c.prefetch), "--ac", c.ac,
                        // The runs below share the host's memory (the default for CPU ranks on one host).
                        "--share-host", "on"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

// Runs every config of one world size in one job (one process start-up);
// returns what each rank measured, by (config, rank).
std::map<std::pair<int, int>, Measured> check_world(int N, const std::vector<Config>& configs) {
  std::vector<std::string> args;
  for (auto& c : configs) args.push_back(c.arg());
  auto r = run_ranks(N, "plan_measure", args);
  std::map<std::pair<int, int>, Measured> got;  // (cfg, rank)
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return got;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    int cfg = -1, rank = -1;
    long long rest, peak, ag, rs, ar;
    const auto at = line.find("MEASURE ");  // after the launcher's "[rank R] " prefix
    if (at == std::string::npos) continue;
    if (std::sscanf(line.c_str() + at, "MEASURE cfg=%d rank=%d rest=%lld peak=%lld ag=%lld rs=%lld ar=%lld", &cfg, &rank,
                    &rest, &peak, &ag, &rs, &ar) == 7)
      got[{cfg, rank}] = {rest, peak, ag, rs, ar, fsdp::testing::parse_kv(line.substr(at))["a"]};
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    SCOPED_TRACE("N=" + std::to_string(N) + " config " + c.arg());
    auto p = plan_json(c, N)["plan"];
    const int64_t rest = p["rest"], peak = p["peak"];
    const int64_t ag = p["traffic"]["all_gather"], rs = p["traffic"]["reduce_scatter"], ar = p["traffic"]["all_reduce"];
    for (int rank = 0; rank < N; ++rank) {
      if (!got.count({int(i), rank})) {
        ADD_FAILURE() << "no MEASURE line for rank " << rank << "\n" << r.output;
        return got;
      }
      const Measured& m = got[{int(i), rank}];
      const int64_t sent = m.ag + m.rs + m.ar, predicted = ag + rs + ar;
      std::printf("N=%d %-34s rank %d: peak measured %9lld predicted %9lld (%.3f); traffic measured %9lld "
                  "predicted %9lld; rest measured %9lld predicted %9lld\n",
                  N, c.arg().c_str(), rank, (long long)m.peak, (long long)peak, double(peak) / double(m.peak),
                  (long long)sent, (long long)predicted, (long long)m.rest, (long long)rest);
      EXPECT_NEAR(double(peak) / double(m.peak), 1.0, 0.10) << "peak";
      if (N == 1) {
        EXPECT_EQ(predicted, 0);
        EXPECT_LE(sent, 64) << "one rank sends (almost) nothing";
        continue;
      }
      EXPECT_NEAR(double(predicted) / double(sent), 1.0, 0.01) << "traffic";
      // By kind, too: the all-gathers and reduce-scatters of FULL_SHARD /
      // SHARD_GRAD_OP, the all-reduce of NO_SHARD (the gradient-norm
      // all-reduce of a few bytes is not in the plan).
      if (ag) EXPECT_NEAR(double(ag) / double(m.ag), 1.0, 0.01) << "all-gather";
      if (rs) EXPECT_NEAR(double(rs) / double(m.rs), 1.0, 0.01) << "reduce-scatter";
      if (ar) EXPECT_NEAR(double(ar) / double(m.ar), 1.0, 0.01) << "all-reduce";
    }
  }
  return got;
}

TEST(PlanAccuracy, OneRank) {
  check_world(1, {{"full", "block", 2, 64, 4, 256, 32, 4}, {"none", "block", 2, 64, 4, 256, 32, 4}});
}

TEST(PlanAccuracy, TwoRanksEveryStrategy) {
  check_world(2, {{"full", "block", 3, 128, 4, 256, 64, 4},
                  {"grad-op", "block", 3, 128, 4, 256, 64, 4},
                  {"none", "block", 3, 128, 4, 256, 64, 4},
                  {"full", "none", 2, 64, 4, 256, 32, 4},
                  {"full", "block", 2, 128, 4, 256, 32, 2, "bf16"},
                  // Small activations: the first reduce-scatter is the peak.
                  {"full", "block", 2, 128, 4, 256, 32, 2},
                  {"full", "block", 4, 64, 2, 256, 32, 8, "fp32", 1}});
}

TEST(PlanAccuracy, ThreeRanksWithPadding) {
  // d=96, V=500: units whose sizes are not multiples of 3 (padding).
  check_world(3, {{"full", "block", 2, 96, 2, 500, 48, 3},
                  {"grad-op", "block", 2, 96, 2, 500, 48, 3},
                  {"none", "block", 2, 96, 2, 500, 48, 3}});
}

// Activation checkpointing (--ac): the planner's peak with recomputation
// (the saved block inputs, one block's recomputed activations) within 10%
// of the measured peak, for every strategy, fp32 and bf16, every block and
// every other block; and the ledger's measured A lower than without it by
// the predicted saving (per checkpointed block: its activations minus its
// input), within 5%.
TEST(PlanAccuracy, ActivationCheckpointing) {
  const std::vector<Config> configs = {
      {"full", "block", 4, 128, 4, 256, 64, 4},
      {"full", "block", 4, 128, 4, 256, 64, 4, "fp32", 0, "block"},
      {"full", "block", 4, 128, 4, 256, 64, 4, "fp32", 1, "block"},
      {"full", "block", 4, 128, 4, 256, 64, 4, "fp32", 0, "every:2"},
      {"full", "block", 4, 128, 4, 256, 64, 4, "bf16", 0},
      {"full", "block", 4, 128, 4, 256, 64, 4, "bf16", 0, "block"},
      {"grad-op", "block", 4, 128, 4, 256, 64, 4, "fp32", 0, "block"},
      {"none", "block", 4, 128, 4, 256, 64, 4, "fp32", 0, "block"},
      {"full", "none", 3, 64, 4, 256, 32, 4, "fp32", 0, "block"},
  };
  auto got = check_world(2, configs);
  // The saving: A without minus A with, measured against predicted.
  auto saving = [&](int plain, int ac) {
    SCOPED_TRACE("A saved by " + configs[ac].arg() + " against " + configs[plain].arg());
    const auto a0 = plan_json(configs[plain], 2)["activations"], a1 = plan_json(configs[ac], 2)["activations"];
    const int64_t predicted = int64_t(a0["total"]) - int64_t(a1["total"]);
    for (int rank = 0; rank < 2; ++rank) {
      if (!got.count({plain, rank}) || !got.count({ac, rank})) return;
      const int64_t measured = got[{plain, rank}].A - got[{ac, rank}].A;
      std::printf("A saved by --ac %s (%s): measured %lld, predicted %lld (%.3f)\n", configs[ac].ac.c_str(),
                  configs[ac].dtype.c_str(), (long long)measured, (long long)predicted,
                  double(predicted) / double(measured));
      EXPECT_GT(measured, 0);
      EXPECT_NEAR(double(predicted) / double(measured), 1.0, 0.05);
    }
  };
  saving(0, 1);
  saving(0, 3);
  saving(4, 5);
}

TEST(PlanAccuracy, ThreeRanksActivationCheckpointing) {
  // Padding, the ring's staging, prefetch with the reduce-scatter in flight.
  check_world(3, {{"full", "block", 3, 96, 2, 500, 48, 3, "fp32", 1, "block"},
                  {"full", "block", 3, 96, 2, 500, 48, 3, "bf16", 0, "every:2"},
                  {"grad-op", "block", 3, 96, 2, 500, 48, 3, "fp32", 0, "block"},
                  {"none", "block", 3, 96, 2, 500, 48, 3, "fp32", 0, "block"}});
}

}  // namespace FSDP_TEST_ID
