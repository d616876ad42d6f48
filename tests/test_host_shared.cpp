// fsdp-cpp tests: ranks on one host share one copy of each unit
// (comm/host_shared.h): the path and its reason, parity with the ring path
// and with the unsharded reference (the CoreParity grid runs on this path
// by default), checkpoints across the two paths, a rank killed or frozen at
// a barrier, and three jobs at once.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <string>

#include "flight_dump.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Mappings of host-shared memory ("memfd:fsdp-host-shared") held by the processes of one test's jobs: those
// started with FSDP_TEST_JOB=<job> in their environment (job_env). Other
// jobs on this machine (a test run beside this one, a user's training)
// map such memory too, and are not this test's to judge.
int host_shared_mappings(const std::string& job) {
  const std::string mark = "FSDP_TEST_JOB=" + job;
  int found = 0;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream environ(e.path() / "environ", std::ios::binary);
    std::string var;
    bool ours = false;
    while (!ours && std::getline(environ, var, '\0')) ours = var == mark;
    if (!ours) continue;
    std::ifstream maps(e.path() / "maps");
    std::string line;
    while (std::getline(maps, line))
      if (line.find("fsdp-host-shared") != std::string::npos) ++found;
  }
  return found;
}

// A name for one test's jobs, and the environment line that marks them.
std::string job_name() {
  static int made = 0;
  return "hs-" + std::to_string(::getpid()) + "-" + std::to_string(++made);
}
std::string job_env(const std::string& job) { return "FSDP_TEST_JOB=" + job; }

std::set<std::string> shm_entries() {
  std::set<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/dev/shm", ec)) out.insert(e.path().filename().string());
  return out;
}

// The value after "key=" on a line, as a double.
double field(const std::string& line, const std::string& key) {
  const auto at = line.find(key + "=");
  if (at == std::string::npos) throw std::runtime_error("no " + key + "= in: " + line);
  return std::stod(line.substr(at + key.size() + 1));
}

TEST(HostShared, ChosenWithItsReasonAndOffWithOneSwitch) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  auto on = run_ranks(2, "hs_train", {"fp32", "2", "-", "-", "0"}, {"FSDP_DEBUG=info"}, 60);
  ASSERT_EQ(on.exit_code, 0) << on.output;
  EXPECT_EQ(lines_with(on.output, "units keep one copy of their parameters per host and reduce gradients where they lie")
                .size(),
            1u)
      << on.output;
  EXPECT_EQ(lines_with(on.output, "HS shares=1 path=cma+gloo world=2 rank=").size(), 2u) << on.output;
  EXPECT_EQ(lines_with(on.output, " host-shared loss=").size(), 2u) << on.output;
  auto off = run_ranks(2, "hs_train", {"fp32", "2", "-", "-", "0"}, {"FSDP_DEBUG=info", "FSDP_SHARE_HOST=off"}, 60);
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_EQ(lines_with(off.output, "each rank keeps its own copy of the parameters (FSDP_SHARE_HOST=off)").size(), 1u)
      << off.output;
  EXPECT_EQ(lines_with(off.output, "HS shares=0 path=cma+gloo world=2 rank=").size(), 2u) << off.output;
  EXPECT_TRUE(lines_with(off.output, "host-shared").empty()) << off.output;
  auto bad = run_ranks(2, "hs_train", {"fp32", "1", "-", "-", "0"}, {"FSDP_SHARE_HOST=maybe"}, 60);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(contains(bad.output, "FSDP_SHARE_HOST='maybe'")) << bad.output;
}

// The shared path against the ring path (FSDP_SHARE_HOST=off), parameter by
// parameter after 4 steps: equal to fp32 rounding (the sums run in another
// order), at N = 2, 3, 4, fp32 and bf16, with a frozen unit, and with a weight
// tied between the root and every unit (hs_train's TiedNet).
using PathParam = std::tuple<int, std::string, std::string>;  // N, dtype, plain|frozen|tied
class HostSharedEqualsRing : public ::testing::TestWithParam<PathParam> {};
TEST_P(HostSharedEqualsRing, ParameterByParameter) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  auto [n, dtype, variant] = GetParam();
  const std::string dir = temp_dir("hs-equal");
  const std::string frozen_arg = variant == "plain" ? "0" : variant == "frozen" ? "1" : "tied";
  std::vector<torch::Tensor> got[2];
  for (int shared = 0; shared < 2; ++shared) {
    const std::string out = dir + (shared ? "/shared.pt" : "/ring.pt");
    auto r = run_ranks(n, "hs_train", {dtype, "4", out, "-", frozen_arg},
                       {shared ? "FSDP_SHARE_HOST=on" : "FSDP_SHARE_HOST=off"}, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(lines_with(r.output, shared ? "HS shares=1" : "HS shares=0").size(), static_cast<size_t>(n)) << r.output;
    // The tied weight: one value under its 4 names (the root's, each block's).
    if (variant == "tied") EXPECT_EQ(lines_with(r.output, "HS tied copies=4 equal=4").size(), 1u) << r.output;
    torch::load(got[shared], out);
  }
  ASSERT_EQ(got[0].size(), got[1].size());
  ASSERT_FALSE(got[0].empty());
  // fp32: the two orders of summation differ in the last bits, which AdamW's
  // division by sqrt(v) may grow over 4 steps; bf16 rounds each copy.
  const double tol = dtype == "bf16" ? 2e-2 : 2e-5;
  for (size_t i = 0; i < got[0].size(); ++i) {
    ASSERT_EQ(got[0][i].sizes(), got[1][i].sizes()) << "parameter " << i;
    const double scale = std::max(1e-6, got[0][i].abs().max().item<double>());
    const double diff = (got[0][i] - got[1][i]).abs().max().item<double>() / scale;
    EXPECT_LE(diff, tol) << "parameter " << i << " (N=" << n << " " << dtype << ")";
  }
}
INSTANTIATE_TEST_SUITE_P(Grid, HostSharedEqualsRing,
                         ::testing::Values(PathParam{2, "fp32", "plain"}, PathParam{3, "fp32", "frozen"},
                                           PathParam{4, "fp32", "plain"}, PathParam{3, "bf16", "plain"},
                                           PathParam{4, "bf16", "frozen"}, PathParam{3, "fp32", "tied"},
                                           PathParam{2, "bf16", "tied"}),
                         [](const auto& info) {
                           const std::string& v = std::get<2>(info.param);
                           return "N" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param) +
                                  (v == "plain" ? "" : "_" + v);
                         });

// A checkpoint saved on one path loads on the other, both ways: the next
// step's loss is the same bit for bit (the forward reads the same values).
TEST(HostShared, CheckpointsCrossBetweenTheTwoPaths) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  for (const std::string dtype : {"fp32", "bf16"}) {
    for (int save_shared = 0; save_shared < 2; ++save_shared) {
      const std::string dir = temp_dir("hs-ckpt");
      const std::string save_env = save_shared ? "FSDP_SHARE_HOST=on" : "FSDP_SHARE_HOST=off";
      const std::string load_env = save_shared ? "FSDP_SHARE_HOST=off" : "FSDP_SHARE_HOST=on";
      auto s = run_ranks(3, "hs_ckpt", {"save", dir, dtype}, {save_env}, 120);
      ASSERT_EQ(s.exit_code, 0) << s.output;
      auto l = run_ranks(3, "hs_ckpt", {"load", dir, dtype}, {load_env}, 120);
      ASSERT_EQ(l.exit_code, 0) << l.output;
      auto ls = lines_with(s.output, "[rank 0] HSCK"), ll = lines_with(l.output, "[rank 0] HSCK");
      ASSERT_EQ(ls.size(), 1u) << s.output;
      ASSERT_EQ(ll.size(), 1u) << l.output;
      EXPECT_EQ(field(ls[0], "shares"), save_shared) << ls[0];
      EXPECT_EQ(field(ll[0], "shares"), 1 - save_shared) << ll[0];
      EXPECT_EQ(field(ls[0], "loss"), field(ll[0], "loss")) << dtype << ": " << ls[0] << " vs " << ll[0];
    }
  }
}

// Rank 1 of 3 dies (SIGKILL) or freezes (SIGSTOP) at the start of step 3, so
// ranks 0 and 2 wait for it in the first unit's all-gather, a barrier on this
// path: each fails naming rank 1 and the collective, and after the job no
// process maps the shared memory and nothing was added to /dev/shm.
class HostSharedFault : public ::testing::TestWithParam<std::string> {};
TEST_P(HostSharedFault, TheRankAtFaultIsNamedAndNothingStays) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  const std::string kind = GetParam();
  const auto shm_before = shm_entries();
  const std::string flight = temp_dir("hs-flight");
  const std::string job = job_name();
  auto r = run_command({bin_path("fsdp"), "run", "-n", "3", "--grace", "5", "--", bin_path("fsdp_test_worker"),
                        "hs_train", "fp32", "20", "-", kind + ":1:3", "0"},
                       {"FSDP_TIMEOUT=3", "FSDP_FLIGHT_DIR=" + flight, job_env(job)}, 90);
  EXPECT_NE(r.exit_code, 0) << r.output;
  ASSERT_EQ(lines_with(r.output, "[rank 1] HS rank 1 raises " + kind + " at step 3").size(), 1u) << r.output;
  for (int survivor : {0, 2}) {
    const std::string tag = "[rank " + std::to_string(survivor) + "] ";
    // The barrier fails as the all-gather it is, on a host-shared communicator.
    auto failed = lines_with(r.output, tag + "scenario hs_train failed: all_gather '");
    ASSERT_EQ(failed.size(), 1u) << r.output;
    EXPECT_TRUE(contains(failed[0], "host-shared)")) << failed[0];
    // The survivor's decision, as its flight dump records it: it waited on
    // rank 1 in the barrier, and rank 1 is dead (killed) or silent (stopped).
    const auto v = verdict_in(flight, survivor);
    EXPECT_EQ(v.at("kind"), "all_gather") << v.dump();
    EXPECT_EQ(ranks_in(v, "waited_on"), std::vector<int>{1}) << v.dump();
    EXPECT_EQ(ranks_in(v, "culprits"), std::vector<int>{1}) << v.dump();
    EXPECT_EQ(ranks_in(v, "silent"), std::vector<int>{1}) << v.dump();  // no heartbeat: frozen or gone
    EXPECT_EQ(ranks_in(v, "dead"), kind == "kill" ? std::vector<int>{1} : std::vector<int>{}) << v.dump();
    // The words once: the line names the cause.
    EXPECT_EQ(lines_with(r.output, tag + "Cause: rank 1 is " + (kind == "kill" ? "dead" : "")).size(), 1u) << r.output;
  }
  // The launcher's finding (FSDP_FLIGHT_DIR names its folder too).
  const auto lf = launcher_finding(flight);
  EXPECT_EQ(lf.at("culprit"), 1) << lf.dump();
  if (kind == "stop") {
    EXPECT_EQ(lf.at("kind"), "stopped") << lf.dump();
    EXPECT_EQ(lf.at("process_state"), "stopped (SIGSTOP)") << lf.dump();
  } else {
    EXPECT_EQ(lf.at("kind"), "killed") << lf.dump();
    EXPECT_EQ(lf.at("signal"), SIGKILL) << lf.dump();
  }
  EXPECT_EQ(host_shared_mappings(job), 0);
  std::set<std::string> added;
  for (auto& e : shm_entries())
    if (!shm_before.count(e)) added.insert(e);
  EXPECT_TRUE(added.empty()) << "new in /dev/shm: " << *added.begin();
}
INSTANTIATE_TEST_SUITE_P(Kinds, HostSharedFault, ::testing::Values("kill", "stop"));

// Three jobs of two ranks each on this host at once: each trains exactly as
// it does alone (the same loss, bit for bit), so no job saw another's memory.
TEST(HostShared, ThreeJobsAtOnceStayIsolated) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  auto alone = run_ranks(2, "hs_train", {"fp32", "6", "-", "-", "0"}, {}, 120);
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  auto want = lines_with(alone.output, "[rank 0] HS shares=1");
  ASSERT_EQ(want.size(), 1u) << alone.output;
  const std::string job = job_name();
  std::vector<std::future<ProcResult>> jobs;
  for (int j = 0; j < 3; ++j)
    jobs.push_back(std::async(std::launch::async, [&job] {
      return run_ranks(2, "hs_train", {"fp32", "6", "-", "-", "0"}, {job_env(job)}, 180);
    }));
  // While they run, their mappings are seen (so the count after them, 0,
  // is a count that can see them).
  bool seen = false;
  while (!seen && jobs.back().wait_for(std::chrono::milliseconds(5)) != std::future_status::ready)
    seen = host_shared_mappings(job) > 0;
  EXPECT_TRUE(seen) << "no process of the running jobs was seen mapping host-shared memory";
  for (auto& f : jobs) {
    ProcResult r = f.get();
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto got = lines_with(r.output, "[rank 0] HS shares=1");
    ASSERT_EQ(got.size(), 1u) << r.output;
    EXPECT_EQ(field(got[0], "loss"), field(want[0], "loss")) << got[0];
  }
  EXPECT_EQ(host_shared_mappings(job), 0);
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
