// The straggler monitor in the trainers: every step each rank's busy time
// (wall - time blocked in collectives) is gathered; one rank slowed by
// FSDP_INJECT_STEP_DELAY=RANK:MS (the trainers run by the test worker,
// tests/workers/trainer_scenarios.cpp) is named in the log, an even run names
// nobody and prints nothing per step (quiet when healthy), and both end with
// one summary line; the flags and the variable are checked.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fsdp/comm.h"
#include "fsdp/errors.h"
#include "fsdp/straggler.h"
#include "test_util.h"
#include "workers/fault_injection.h"

using fsdp::testing::bin_path;
using fsdp::testing::lines_with;
using fsdp::testing::run_command;

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

// The monitor's lines (printed by rank 0): every one must name `rank`, the
// first after `window` slow steps (one more if the very first step, which
// includes warm-up on the other rank too, did not yet count).
void expect_named(const std::string& output, int rank, int window, int factor) {
  auto named = lines_with(output, "fsdp: straggler at step ");
  ASSERT_FALSE(named.empty()) << output;
  for (auto& l : named) {
    EXPECT_EQ(l.rfind("[rank 0] fsdp: straggler at step ", 0), 0u) << l;
    EXPECT_NE(l.find(": rank " + std::to_string(rank) + " ("), std::string::npos) << l;
    EXPECT_EQ(l.find(": rank " + std::to_string(1 - rank) + " ("), std::string::npos) << l;
    EXPECT_NE(l.find("slower than " + std::to_string(factor) + " x the median step time of the other ranks for the last " +
                     std::to_string(window) + " steps"),
              std::string::npos)
        << l;
  }
  const int first = std::atoi(named[0].c_str() + named[0].find(" at step ") + 9);
  EXPECT_GE(first, window) << named[0];
  EXPECT_LE(first, window + 1) << named[0];
}

using fsdp::testing::temp_dir;

// tiny on 2 ranks: 8 steps, a rank named after 3 steps in a row at more than
// 4x the other's busy time. A slowed rank sleeps 150 ms on steps of ~10 ms;
// the factor leaves room for CPU contention on a loaded test machine. With a
// fault in `env`, the test worker's tiny (the same trainer) runs.
fsdp::testing::ProcResult tiny(const std::string& dir, const std::vector<std::string>& env) {
  const std::vector<std::string> program =
      env.empty() ? std::vector<std::string>{bin_path("tiny")} : std::vector<std::string>{bin_path("fsdp_test_worker"), "tiny"};
  std::vector<std::string> argv{bin_path("fsdp"), "run", "-n", "2", "--"};
  argv.insert(argv.end(), program.begin(), program.end());
  argv.insert(argv.end(), {"--epochs", "8", "--accum", "1",
                           "--straggler-factor", "4", "--straggler-window", "3", "--save", dir + "/w.safetensors"});
  return run_command(argv, env, 120);
}

TEST(StragglerTrainers, TinyNamesTheSlowedRank) {
  const std::string d = temp_dir("tiny_slow");
  auto r = tiny(d, {"FSDP_INJECT_STEP_DELAY=1:150"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // No per-step busy line: only the monitor's messages and one summary.
  EXPECT_TRUE(lines_with(r.output, "busy ms per rank (wall").empty()) << r.output;
  EXPECT_TRUE(lines_with(r.output, "[rank 1] epoch ").empty()) << r.output;
  // Named once the window (3) is full, again after another window; never rank 0.
  expect_named(r.output, 1, 3, 4);
  auto sum = lines_with(r.output, "fsdp: straggler monitor: 8 steps, mean busy ms per rank r0 ");
  ASSERT_EQ(sum.size(), 1u) << r.output;
  EXPECT_EQ(sum[0].rfind("[rank 0] ", 0), 0u) << sum[0];
  EXPECT_NE(sum[0].find("; rank 1 named at steps "), std::string::npos) << sum[0];
  EXPECT_EQ(sum[0].find("rank 0 named"), std::string::npos) << sum[0];
  EXPECT_NE(sum[0].find("(slower than 4 x the other ranks' median for 3 steps in a row)"), std::string::npos) << sum[0];
  // The slowed rank's mean busy time shows its 150 ms of sleep.
  const double r1 = std::atof(sum[0].c_str() + sum[0].find("  r1 ") + 5);
  EXPECT_GT(r1, 140.0) << sum[0];
  fs::remove_all(d);
}

TEST(StragglerTrainers, TinyEvenRunNamesNobody) {
  const std::string d = temp_dir("tiny_even");
  auto r = tiny(d, {});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Quiet when healthy: the loss lines, and exactly one line of the monitor.
  EXPECT_EQ(lines_with(r.output, "busy ms").size(), 1u) << r.output;  // the summary
  EXPECT_TRUE(lines_with(r.output, "fsdp: straggler at").empty()) << r.output;
  auto sum = lines_with(r.output, "fsdp: straggler monitor: 8 steps, mean busy ms per rank r0 ");
  ASSERT_EQ(sum.size(), 1u) << r.output;
  EXPECT_NE(sum[0].find("; no rank was slower than 4 x the other ranks' median for 3 steps in a row"),
            std::string::npos)
      << sum[0];
  EXPECT_EQ(lines_with(r.output, "[rank 0] epoch ").size(), 8u) << r.output;
  fs::remove_all(d);
}

TEST(StragglerTrainers, GptNamesTheSlowedRank) {
  const std::string d = temp_dir("gpt_slow");
  {
    std::ofstream f(d + "/t.txt");
    for (int i = 0; i < 300; i++) f << "hello fsdp world. ";
  }
  auto r = run_command({bin_path("fsdp"), "run", "-n", "2", "--", bin_path("fsdp_test_worker"), "gpt", "--text", d + "/t.txt", "--seq",
                        "32", "--dim", "32", "--layers", "1", "--heads", "2", "--batch", "2", "--steps", "6",
                        "--log-every", "5", "--eval-every", "0", "--threads", "1", "--straggler-factor", "4",
                        "--straggler-window", "3"},
                       {"FSDP_INJECT_STEP_DELAY=0:150"}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_named(r.output, 0, 3, 4);
  // The step lines (0 and 5) carry no busy times; one summary names rank 0.
  EXPECT_TRUE(lines_with(r.output, "| busy ms per rank").empty()) << r.output;
  EXPECT_EQ(lines_with(r.output, "[rank 0] step ").size(), 2u) << r.output;
  auto sum = lines_with(r.output, "fsdp: straggler monitor: 6 steps, mean busy ms per rank r0 ");
  ASSERT_EQ(sum.size(), 1u) << r.output;
  EXPECT_NE(sum[0].find("; rank 0 named at step"), std::string::npos) << sum[0];
  EXPECT_NE(sum[0].find("  r1 "), std::string::npos) << sum[0];
  fs::remove_all(d);
}

TEST(StragglerTrainers, BadFactorAndDelayAreClearErrors) {
  const std::string d = temp_dir("bad");
  for (const char* f : {"1", "0.5", "-2"}) {
    auto r = run_command({bin_path("tiny"), "--epochs", "1", "--straggler-factor", f, "--save", ""}, {}, 60);
    EXPECT_NE(r.exit_code, 0) << f << ": " << r.output;
    EXPECT_NE(r.output.find("--straggler-factor"), std::string::npos) << r.output;
    r = run_command({bin_path("gpt"), "--text", d + "/none.txt", "--straggler-factor", f}, {}, 60);
    EXPECT_EQ(r.exit_code, 2) << f << ": " << r.output;
    EXPECT_NE(r.output.find("--straggler-factor"), std::string::npos) << r.output;
  }
  auto r = run_command({bin_path("fsdp_test_worker"), "tiny", "--epochs", "1", "--save", ""}, {"FSDP_INJECT_STEP_DELAY=slow"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("FSDP_INJECT_STEP_DELAY='slow': expected RANK:MS"), std::string::npos) << r.output;
  for (const char* v : {"1", ":5", "1:", "-1:5", "1:x", "1:5ms", "1:-3"}) {
    ::setenv("FSDP_INJECT_STEP_DELAY", v, 1);
    EXPECT_THROW(fsdp::testing::inject_step_delay(0), fsdp::UsageError) << v;
  }
  ::setenv("FSDP_INJECT_STEP_DELAY", "1:0.5", 1);
  EXPECT_NO_THROW(fsdp::testing::inject_step_delay(0));
  ::unsetenv("FSDP_INJECT_STEP_DELAY");
  fs::remove_all(d);
}

// The wait clock counts blocking waits only, and forwards everything else.
TEST(StragglerTrainers, WaitClockForwardsAndCounts) {
  auto clock = std::make_shared<fsdp::WaitClock>();
  auto c = fsdp::with_wait_clock(fsdp::make_local_communicator(), clock);
  EXPECT_EQ(c->world_size(), 1);
  EXPECT_EQ(c->rank(), 0);
  auto t = torch::ones({4});
  auto out = torch::empty({4});
  c->all_gather(t, out)->wait();
  EXPECT_TRUE(torch::equal(out, t));
  EXPECT_GE(clock->seconds(), 0.0);
  EXPECT_EQ(c->counters()[fsdp::CollectiveKind::ALL_GATHER].calls, 1);
  EXPECT_THROW(fsdp::with_wait_clock(nullptr, clock), fsdp::Error);
  EXPECT_THROW(fsdp::with_wait_clock(fsdp::make_local_communicator(), nullptr), fsdp::Error);
  clock->add(0.25);
  EXPECT_NEAR(clock->seconds(), 0.25, 0.01);
  EXPECT_THROW(fsdp::StragglerMonitor(c, 1.5, 5, -1.0), fsdp::Error);
}

}  // namespace FSDP_TEST_ID
