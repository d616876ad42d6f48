// fsdp-cpp tests: `fsdp run` (scenarios in tests/workers/comm_scenarios.cpp).
#include <gtest/gtest.h>
#include <signal.h>

#include <set>

#include "flight_dump.h"
#include "test_util.h"

namespace FSDP_TEST_ID {

using fsdp::testing::bin_path;
using fsdp::testing::launcher_finding;
using fsdp::testing::lines_with;
using fsdp::testing::ProcResult;
using fsdp::testing::run_command;
using fsdp::testing::run_ranks;
using fsdp::testing::temp_dir;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(Launcher, SetsTorchrunEnvironment) {
  auto r = run_ranks(3, "launcher_env");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> ports;
  for (int rank = 0; rank < 3; ++rank) {
    auto lines = lines_with(r.output, "[rank " + std::to_string(rank) + "] env ");
    ASSERT_EQ(lines.size(), 1u) << r.output;
    const auto& l = lines[0];
    EXPECT_TRUE(contains(l, " RANK=" + std::to_string(rank) + " ")) << l;
    EXPECT_TRUE(contains(l, " LOCAL_RANK=" + std::to_string(rank) + " ")) << l;
    EXPECT_TRUE(contains(l, " WORLD_SIZE=3 ")) << l;
    EXPECT_TRUE(contains(l, " LOCAL_WORLD_SIZE=3 ")) << l;
    EXPECT_TRUE(contains(l, " MASTER_ADDR=127.0.0.1 ")) << l;
    EXPECT_FALSE(contains(l, "OMP_NUM_THREADS=<unset>")) << l;
    EXPECT_TRUE(contains(l, " FSDP_RESTART_COUNT=0")) << l;
    ports.insert(l.substr(l.find("MASTER_PORT=")).substr(0, l.substr(l.find("MASTER_PORT=")).find(' ')));
  }
  EXPECT_EQ(ports.size(), 1u) << "every rank must get the same MASTER_PORT";
}

TEST(Launcher, ThreadsFlagAndUserEnvironment) {
  auto r = run_command({bin_path("fsdp"), "run", "-n", "2", "--threads", "3", "--",
                        bin_path("fsdp_test_worker"), "launcher_env"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=3").size(), 2u) << r.output;
  auto u = run_ranks(2, "launcher_env", {}, {"OMP_NUM_THREADS=5"});
  ASSERT_EQ(u.exit_code, 0) << u.output;
  EXPECT_EQ(lines_with(u.output, "OMP_NUM_THREADS=5 ").size(), 2u) << u.output;
}

// `fsdp run --flight-dir D -n N -- fsdp_test_worker <scenario> <args>`.
ProcResult run_with_flight_dir(int n, const std::string& flight, const std::vector<std::string>& worker) {
  std::vector<std::string> argv = {bin_path("fsdp"), "run", "-n", std::to_string(n), "--flight-dir", flight, "--",
                                   bin_path("fsdp_test_worker")};
  argv.insert(argv.end(), worker.begin(), worker.end());
  return run_command(argv, {}, 60);
}

TEST(Launcher, RankExitCodeStopsTheOthers) {
  const std::string flight = temp_dir("exit-flight");
  auto r = run_with_flight_dir(3, flight, {"launcher_exit", "1", "3"});
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  auto report = lines_with(r.output, "fsdp run: rank 1 ");
  ASSERT_EQ(report.size(), 1u) << r.output;
  EXPECT_TRUE(contains(report[0], "exited with code 3")) << report[0];
  EXPECT_TRUE(contains(r.output, "  | rank 1: about to exit with 3")) << r.output;
  // The launcher's finding: rank 1 failed first, with code 3; no rank is
  // named beyond that (no verdict, no signal).
  const auto lf = launcher_finding(flight);
  EXPECT_EQ(lf.at("kind"), "none") << lf.dump();
  EXPECT_EQ(lf.at("first_failed"), 1) << lf.dump();
  EXPECT_EQ(lf.at("first_failed_exit_code"), 3) << lf.dump();
}

TEST(Launcher, RankKilledBySignalStopsTheOthers) {
  const std::string flight = temp_dir("kill-flight");
  auto r = run_with_flight_dir(2, flight, {"launcher_kill", "1"});
  EXPECT_EQ(r.exit_code, 128 + 9) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  auto report = lines_with(r.output, "fsdp run: rank 1 ");
  ASSERT_EQ(report.size(), 1u) << r.output;
  EXPECT_TRUE(contains(report[0], "SIGKILL")) << report[0];
  EXPECT_TRUE(contains(r.output, "  | rank 1: about to be killed")) << r.output;
  const auto lf = launcher_finding(flight);
  EXPECT_EQ(lf.at("kind"), "killed") << lf.dump();
  EXPECT_EQ(lf.at("culprit"), 1) << lf.dump();
  EXPECT_EQ(lf.at("signal"), SIGKILL) << lf.dump();
  EXPECT_EQ(lf.at("first_failed_signal"), SIGKILL) << lf.dump();
}

TEST(Launcher, ForwardsSigintToEveryRank) {
  auto r = run_ranks(2, "launcher_sigint", {}, {}, 60);
  EXPECT_EQ(r.exit_code, 128 + 2) << r.output;
  EXPECT_EQ(lines_with(r.output, "got SIGINT").size(), 2u) << r.output;
}

TEST(Launcher, MaxRestartsRestartsEveryRank) {
  auto r = run_command({bin_path("fsdp"), "run", "-n", "2", "--max-restarts", "2", "--",
                        bin_path("fsdp_test_worker"), "launcher_flaky", "2"},
                       {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "restart 1 of 2")) << r.output;
  EXPECT_TRUE(contains(r.output, "restart 2 of 2")) << r.output;
  EXPECT_EQ(lines_with(r.output, "attempt 2").size(), 2u) << r.output;
}

TEST(Launcher, BadInputIsOneClearMessageAndExitCode2) {
  const std::string worker = bin_path("fsdp_test_worker");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  std::vector<Case> cases = {
      {{"-n", "0", "--", worker, "launcher_env"}, "-n must be at least 1"},
      {{"-n", "2"}, "no program given"},
      {{"-n", "2", "--"}, "no program given"},
      {{"-n", "2", "--master-port", "70000", "--", worker}, "master-port"},
      {{"-n", "2", "--", "/nonexistent/program"}, "was not found"},
      {{"-n", "2", "--nnodes", "2", "--", worker}, "--master-addr"},
  };
  for (auto& c : cases) {
    std::vector<std::string> argv = {bin_path("fsdp"), "run"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = run_command(argv, {}, 30);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, c.says)) << "expected '" << c.says << "' in: " << r.output;
    EXPECT_EQ(lines_with(r.output, "error").size(), 1u) << r.output;
  }
}

}  // namespace FSDP_TEST_ID
