// The ledger of a run whose checkpoints are saved in the background: the
// save copies its snapshot, writes it and frees it on its own thread while
// training measures A (what the root forward left allocated). GPT-mini at
// N=2 with a background save every other step, twenty times: every run ends
// well, and on every rank the ledger's plan (with the snapshot C counted)
// is within 10% of the peak the counting allocator measured.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace FSDP_TEST_ID {

using fsdp::testing::bin_path;
using fsdp::testing::lines_with;
using fsdp::testing::ProcResult;
using fsdp::testing::run_command;
using fsdp::testing::source_path;
using fsdp::testing::temp_dir;

TEST(LedgerBackgroundSaves, TwentyRunsEndWellAndTheirPlansHoldTheMeasuredPeaks) {
  const std::string dir = temp_dir("ledger_saves");
  const ProcResult prep =
      run_command({bin_path("fsdp"), "prepare", "--text", source_path("README.md"), "--out", dir + "/data"});
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  constexpr int kRuns = 20;
  // Two launches at a time: each is two ranks of a small model, and nothing
  // here is timed (the bytes do not depend on the load).
  constexpr int kAtOnce = 2;
  std::vector<ProcResult> out(kRuns);
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kAtOnce; ++t)
    pool.emplace_back([&] {
      for (int i = next++; i < kRuns; i = next++)
        out[i] = run_command({bin_path("fsdp"), "run", "-n", "2", "--", bin_path("gpt"), "--data",
                              dir + "/data/train.bin", "--vocab", "256", "--seq", "32", "--dim", "64", "--layers", "3",
                              "--heads", "4", "--batch", "2", "--accum", "2", "--eval-every", "0", "--sample", "0",
                              "--no-progress", "--ckpt-dir", dir + "/ak" + std::to_string(i), "--ckpt-every", "2",
                              "--steps", "6", "--save-async", "--rank-memory"},
                             {}, 120);
    });
  for (auto& t : pool) t.join();
  double lo = 1e9, hi = 0;
  for (int i = 0; i < kRuns; ++i) {
    const ProcResult& r = out[i];
    ASSERT_EQ(r.exit_code, 0) << "run " << i << " failed:\n" << r.output;
    // The saves of steps 2 and 4 were in flight during the next steps' forwards.
    EXPECT_EQ(lines_with(r.output, "in the background (training blocked").size(), 3u) << r.output;
    const auto lines = lines_with(r.output, " memory: plan peak ");
    ASSERT_EQ(lines.size(), 2u) << "run " << i << ": expected one memory line per rank:\n" << r.output;
    for (const std::string& line : lines) {
      const fsdp::testing::Fields f(line);
      EXPECT_GT(f["ledger_A"], 0) << line;
      EXPECT_GT(f["ledger_C"], 0) << "the snapshot is in the ledger: " << line;
      EXPECT_EQ(f["ledger_notes"], 0) << "a measurement that cannot be:\n" << r.output;
      EXPECT_EQ(f["ledger_peak"], f["training_peak"]) << "the ledger reads the counting allocator: " << line;
      const double ratio = double(f["ledger_predicted_peak"]) / double(f["ledger_peak"]);
      lo = std::min(lo, ratio), hi = std::max(hi, ratio);
      EXPECT_GE(ratio, 0.9) << "run " << i << ": the plan is more than 10% below the measured peak: " << line;
      EXPECT_LE(ratio, 1.1) << "run " << i << ": the plan is more than 10% above the measured peak: " << line;
    }
  }
  std::printf("plan / measured peak over %d runs x 2 ranks: %.3f .. %.3f\n", kRuns, lo, hi);
}

}  // namespace FSDP_TEST_ID
