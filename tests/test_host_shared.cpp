// fsdp-cpp tests: ranks on one host share one copy of each unit
// (comm/host_shared.h): the path and its reason, parity with the ring path
// and with the unsharded reference (the CoreParity grid runs on this path
// by default), checkpoints across the two paths, a rank killed or frozen at
// a barrier (in training, and at each collective's barrier alone), three
// jobs at once, and what a rank may do to its peers' memory (sealed memfds,
// read-only maps of peers' gradients, every rank checking every request).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <tuple>

#include "comm/host_shared.h"
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
  // The ledger: one copy per host, mapped by its 2 ranks, whose shares are
  // their fp32 shards.
  for (auto& l : lines_with(on.output, "HS ledger ")) {
    EXPECT_EQ(field(l, "host_ranks"), 2) << l;
    EXPECT_EQ(field(l, "shared"), 2 * field(l, "P")) << l;
  }
  EXPECT_EQ(lines_with(on.output, "HS ledger ").size(), 2u) << on.output;
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

// The two host-shared collectives alone (hs_collectives: all_gather in
// place and from a private input, reduce_scatter SUM and AVG; fp32 and
// bf16; 1, 7, 1000 and 65536 elements per block), bit for bit, on one host
// (N = 3) and across hosts composed in tiers (2 x 2, interleaved, 2 x 3).
// Each of the 32 calls took the host-shared form (its trace span says so:
// the other forms give the same values). Counted as without sharing:
// (N-1) b per call, (H-1) b of it across hosts.
TEST(HostShared, CollectivesAreExactOnOneHostAndAcrossHosts) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  const long long blocks = 1 + 7 + 1000 + 65536, per_call_kind = blocks * (4 + 2) * 2;  // x 2 calls, fp32 + bf16
  for (const std::string layout : {"", "a,a,b,b", "a,b,a,b", "a,a,a,b,b,b"}) {
    const int n = layout.empty() ? 3 : static_cast<int>(std::count(layout.begin(), layout.end(), ',')) + 1;
    const int H = layout.empty() ? 1 : static_cast<int>(std::set<char>(layout.begin(), layout.end()).size()) - 1;
    const std::string trace = temp_dir("hs-collectives-trace");
    std::vector<std::string> env = {"FSDP_TEST_TRACE=" + trace};
    if (!layout.empty()) env.push_back("FSDP_TEST_HOST_LAYOUT=" + layout);
    auto r = run_ranks(n, "hs_collectives", {}, env, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int q = 0; q < n; ++q) {
      const std::string text = slurp(trace + "/trace-rank" + std::to_string(q) + ".json");
      ASSERT_FALSE(text.empty()) << "no trace of rank " << q << " in " << trace;
      const std::string mark = "\"host_shared\":1";
      int shared_spans = 0;
      for (auto at = text.find(mark); at != std::string::npos; at = text.find(mark, at + 1)) ++shared_spans;
      EXPECT_EQ(shared_spans, 32) << "rank " << q << " (" << (layout.empty() ? "one host" : layout) << ")";
    }
    auto lines = lines_with(r.output, "HSC passed ");
    ASSERT_EQ(lines.size(), static_cast<size_t>(n)) << r.output;
    for (auto& l : lines) {
      EXPECT_EQ(field(l, "checks"), 2 * 4 * (2 * n + 2)) << l;
      EXPECT_TRUE(contains(l, layout.empty() ? "path=cma+gloo world=" : "path=cma+tcp tiers world=")) << l;
      EXPECT_TRUE(contains(l, " host-shared ag=")) << l;
      EXPECT_EQ(field(l, "ag"), (n - 1) * per_call_kind) << l;
      EXPECT_EQ(field(l, "rs"), (n - 1) * per_call_kind) << l;
      EXPECT_EQ(field(l, "ag_inter"), (H - 1) * per_call_kind) << l;
      EXPECT_EQ(field(l, "rs_inter"), (H - 1) * per_call_kind) << l;
    }
  }
}

// The shared path against the ring path (FSDP_SHARE_HOST=off), parameter by
// parameter after 4 steps: equal to fp32 rounding (the sums run in another
// order), at N = 2, 3, 4, fp32 and bf16, with a frozen unit, and with a weight
// tied between the root and every unit (hs_train's TiedNet).
// Where autograd wrote the gradients (hs_train's "HS grads" line, each
// .grad right after it was accumulated): sharing, in host-shared memory,
// the block its peers sum it from (no copy into it after backward), never in
// private memory; copying, never there. And the ledger counts those blocks,
// held for the next backward: at least one page (this model's units are
// smaller), at most one block per unit; none without sharing.
void expect_gradients_written_in_peer_memory(const std::string& output, int n, bool shared) {
  auto grads = lines_with(output, "HS grads ");
  ASSERT_EQ(grads.size(), static_cast<size_t>(n)) << output;
  for (auto& l : grads) {
    EXPECT_GT(field(l, "dropped"), 0) << l;  // each unit's last gradient completes it
    if (shared) {
      EXPECT_EQ(field(l, "private"), 0) << l;
      EXPECT_GT(field(l, "in_peer_memory"), 0) << l;
    } else {
      EXPECT_EQ(field(l, "in_peer_memory"), 0) << l;
      EXPECT_GT(field(l, "private"), 0) << l;
    }
  }
  auto ledgers = lines_with(output, "HS ledger ");
  ASSERT_EQ(ledgers.size(), static_cast<size_t>(n)) << output;
  for (auto& l : ledgers) {
    if (shared) {
      EXPECT_GE(field(l, "peer"), field(l, "page")) << l;
      EXPECT_LE(field(l, "peer"), field(l, "page") * field(l, "units")) << l;
    } else {
      EXPECT_EQ(field(l, "peer"), 0) << l;
    }
  }
}

// The final parameters of hs_train (4 steps) with and without sharing,
// compared parameter by parameter. `env`: what else the ranks get (the
// hosts' layout).
void expect_sharing_changes_only_rounding(int n, const std::string& dtype, const std::string& variant,
                                          const std::vector<std::string>& env, const std::string& path) {
  const std::string dir = temp_dir("hs-equal");
  const std::string frozen_arg = variant == "plain" ? "0" : variant == "frozen" ? "1" : "tied";
  std::vector<torch::Tensor> got[2];
  for (int shared = 0; shared < 2; ++shared) {
    const std::string out = dir + (shared ? "/shared.pt" : "/ring.pt");
    std::vector<std::string> e = env;
    e.push_back(shared ? "FSDP_SHARE_HOST=on" : "FSDP_SHARE_HOST=off");
    auto r = run_ranks(n, "hs_train", {dtype, "4", out, "-", frozen_arg}, e, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(lines_with(r.output, std::string(shared ? "HS shares=1" : "HS shares=0") + " path=" + path).size(),
              static_cast<size_t>(n))
        << r.output;
    // The tied weight: one value under its 4 names (the root's, each block's).
    if (variant == "tied") EXPECT_EQ(lines_with(r.output, "HS tied copies=4 equal=4").size(), 1u) << r.output;
    expect_gradients_written_in_peer_memory(r.output, n, shared);
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

// The shared path against the ring path (FSDP_SHARE_HOST=off), parameter by
// parameter after 4 steps: equal to fp32 rounding (the sums run in another
// order), at N = 2, 3, 4, fp32 and bf16, with a frozen unit, and with a weight
// tied between the root and every unit (hs_train's TiedNet).
using PathParam = std::tuple<int, std::string, std::string>;  // N, dtype, plain|frozen|tied
class HostSharedEqualsRing : public ::testing::TestWithParam<PathParam> {};
TEST_P(HostSharedEqualsRing, ParameterByParameter) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  auto [n, dtype, variant] = GetParam();
  expect_sharing_changes_only_rounding(n, dtype, variant, {}, "cma+gloo world=");
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

// Across hosts (the tiers; hosts simulated by FSDP_TEST_HOST_LAYOUT): each
// host keeps one copy of a unit, mapped by its ranks, and only the other
// hosts' blocks move (tiers.h). The same parity against the tiers without
// sharing: 2 hosts of 2, hosts whose ranks interleave (bf16, a frozen
// unit), 2 hosts of 3 with the tied weight.
using TierParam = std::tuple<std::string, std::string, std::string>;  // layout, dtype, plain|frozen|tied
class HostSharedTiersEqualsCopies : public ::testing::TestWithParam<TierParam> {};
TEST_P(HostSharedTiersEqualsCopies, ParameterByParameter) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  auto [layout, dtype, variant] = GetParam();
  const int n = static_cast<int>(std::count(layout.begin(), layout.end(), ',')) + 1;
  expect_sharing_changes_only_rounding(n, dtype, variant, {"FSDP_TEST_HOST_LAYOUT=" + layout},
                                       "cma+tcp tiers world=");
}
INSTANTIATE_TEST_SUITE_P(Layouts, HostSharedTiersEqualsCopies,
                         ::testing::Values(TierParam{"a,a,b,b", "fp32", "plain"},
                                           TierParam{"a,b,a,b", "bf16", "frozen"},
                                           TierParam{"a,a,a,b,b,b", "fp32", "tied"}),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param);
                           for (auto& c : s)
                             if (c == ',') c = '_';
                           const std::string& v = std::get<2>(info.param);
                           return s + "_" + std::get<1>(info.param) + (v == "plain" ? "" : "_" + v);
                         });

// The tiers say why they share, and the ledger counts one copy per host
// mapped by that host's ranks: 2 hosts of 2 ranks, fp32, so each rank's
// share (shared / 2) is two ranks' shards (2 P).
TEST(HostShared, AcrossHostsEachHostKeepsOneCopy) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  auto r = run_ranks(4, "hs_train", {"fp32", "2", "-", "-", "0"}, {"FSDP_TEST_HOST_LAYOUT=a,a,b,b", "FSDP_DEBUG=info"},
                     120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "by tiers (cma inside each host + gloo/tcp between hosts): 2 hosts of 2 ranks: "
                                 "cross-memory attach inside each host, gloo/tcp between the ranks of the same local "
                                 "index; units keep one copy of their parameters per host and reduce gradients where "
                                 "they lie")
                .size(),
            1u)
      << r.output;
  EXPECT_EQ(lines_with(r.output, "HS shares=1 path=cma+tcp tiers world=4 rank=").size(), 4u) << r.output;
  auto ledgers = lines_with(r.output, "HS ledger ");
  ASSERT_EQ(ledgers.size(), 4u) << r.output;
  for (auto& l : ledgers) {
    EXPECT_EQ(field(l, "host_ranks"), 2) << l;
    EXPECT_GT(field(l, "P"), 0) << l;
    EXPECT_EQ(field(l, "shared"), 4 * field(l, "P")) << l;
  }
}

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

// hs_train over `n` ranks under fsdp run (FSDP_TIMEOUT=3), rank 1 raising
// `kind` (kill, stop) at the start of step 3; `env` adds to the ranks'.
ProcResult run_with_a_fault(int n, const std::string& kind, const std::string& flight, const std::string& job,
                            std::vector<std::string> env) {
  env.insert(env.end(), {"FSDP_TIMEOUT=3", "FSDP_FLIGHT_DIR=" + flight, job_env(job)});
  return run_command({bin_path("fsdp"), "run", "-n", std::to_string(n), "--grace", "5", "--",
                      bin_path("fsdp_test_worker"), "hs_train", "fp32", "20", "-", kind + ":1:3", "0"},
                     env, 90);
}

// After a job: no process of it maps host-shared memory, and nothing was
// added to /dev/shm since `before`.
void expect_nothing_stays(const std::string& job, const std::set<std::string>& before) {
  EXPECT_EQ(host_shared_mappings(job), 0);
  std::set<std::string> added;
  for (auto& e : shm_entries())
    if (!before.count(e)) added.insert(e);
  EXPECT_TRUE(added.empty()) << "new in /dev/shm: " << *added.begin();
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
  auto r = run_with_a_fault(3, kind, flight, job, {});
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
    // Killed: at once (the barrier saw its process end); frozen: at the timeout.
    EXPECT_EQ(v.at("timed_out").get<bool>(), kind == "stop") << v.dump();
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
  expect_nothing_stays(job, shm_before);
}
INSTANTIATE_TEST_SUITE_P(Kinds, HostSharedFault, ::testing::Values("kill", "stop"));

// Across hosts (2 x 2, the tiers): rank 1 dies or freezes at the start of
// step 3. Rank 0 waits for it at its host's barrier, rank 3 in the TCP tier
// (the ranks of local index 1): both fail naming rank 1 and the all-gather.
// Rank 2 waits on rank 3, which failed first; the launcher names rank 1.
// After the job no process maps the shared memory.
class HostSharedTiersFault : public ::testing::TestWithParam<std::string> {};
TEST_P(HostSharedTiersFault, TheRankAtFaultIsNamedAndNothingStays) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  const std::string kind = GetParam();
  const auto shm_before = shm_entries();
  const std::string flight = temp_dir("hs-tiers-flight");
  const std::string job = job_name();
  auto r = run_with_a_fault(4, kind, flight, job, {"FSDP_TEST_HOST_LAYOUT=a,a,b,b"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  ASSERT_EQ(lines_with(r.output, "[rank 1] HS rank 1 raises " + kind + " at step 3").size(), 1u) << r.output;
  for (int survivor : {0, 3}) {
    const std::string tag = "[rank " + std::to_string(survivor) + "] ";
    auto failed = lines_with(r.output, tag + "scenario hs_train failed: all_gather '");
    ASSERT_EQ(failed.size(), 1u) << r.output;
    EXPECT_TRUE(contains(failed[0], "cma+tcp tiers world=4 rank=" + std::to_string(survivor) + " host-shared"))
        << failed[0];
    const auto v = verdict_in(flight, survivor);
    EXPECT_EQ(v.at("kind"), "all_gather") << v.dump();
    EXPECT_EQ(ranks_in(v, "waited_on"), std::vector<int>{1}) << v.dump();
    EXPECT_EQ(ranks_in(v, "culprits"), std::vector<int>{1}) << v.dump();
  }
  // Rank 2 waits for rank 3 at host b's barrier; rank 3's collective failed
  // at once (its TCP link to the killed rank broke) and it gave up in the
  // host's memory, so rank 2 fails at once too, saying so.
  if (kind == "kill") {
    bool said = false;
    for (auto& l : lines_with(r.output, "[rank 2] ")) said = said || contains(l, "rank 3 gave up");
    EXPECT_TRUE(said) << r.output;
  }
  const auto lf = launcher_finding(flight);
  EXPECT_EQ(lf.at("culprit"), 1) << lf.dump();
  EXPECT_EQ(lf.at("kind"), kind == "stop" ? "stopped" : "killed") << lf.dump();
  expect_nothing_stays(job, shm_before);
}
INSTANTIATE_TEST_SUITE_P(Kinds, HostSharedTiersFault, ::testing::Values("kill", "stop"));

// A rank killed or frozen right before a host-shared collective, alone (no
// training around it): the others wait for it at that collective's first
// barrier in the host's memory. Each survivor fails naming rank 1 and the
// collective; a killed rank fails them at once (their call did not run out
// of time: the barrier saw its process end), a frozen one when the call's
// time ran out, named by its silent heartbeat.
using BarrierFaultParam = std::tuple<std::string, std::string>;  // kill|stop, all_gather|reduce_scatter
class HostSharedBarrierFault : public ::testing::TestWithParam<BarrierFaultParam> {};
TEST_P(HostSharedBarrierFault, TheRankAtFaultIsNamedAsAtAnyCollective) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  const auto [kind, collective] = GetParam();
  const std::string flight = temp_dir("hs-barrier-flight");
  const std::string job = job_name();
  auto r = run_command({bin_path("fsdp"), "run", "-n", "3", "--grace", "5", "--", bin_path("fsdp_test_worker"),
                        "hs_fault", kind + ":1", collective},
                       {"FSDP_TIMEOUT=3", "FSDP_FLIGHT_DIR=" + flight, job_env(job)}, 90);
  EXPECT_NE(r.exit_code, 0) << r.output;
  ASSERT_EQ(lines_with(r.output, "[rank 1] HSF rank 1 raises " + kind + " before " + collective).size(), 1u)
      << r.output;
  for (int survivor : {0, 2}) {
    const std::string tag = "[rank " + std::to_string(survivor) + "] ";
    auto failed = lines_with(r.output, tag + "scenario hs_fault failed: " + collective + " 'hsf.");
    ASSERT_EQ(failed.size(), 1u) << r.output;
    EXPECT_TRUE(contains(failed[0], "host-shared)")) << failed[0];
    const auto v = verdict_in(flight, survivor);
    EXPECT_EQ(v.at("kind"), collective) << v.dump();
    EXPECT_EQ(ranks_in(v, "waited_on"), std::vector<int>{1}) << v.dump();
    EXPECT_EQ(ranks_in(v, "culprits"), std::vector<int>{1}) << v.dump();
    EXPECT_EQ(ranks_in(v, "dead"), kind == "kill" ? std::vector<int>{1} : std::vector<int>{}) << v.dump();
    // Killed: at once (the call failed long before its 3 s); frozen: at the timeout.
    EXPECT_EQ(v.at("timed_out").get<bool>(), kind == "stop") << v.dump();
    // The barrier's own words: which rank, which barrier, and why.
    const std::string why = kind == "kill" ? "waiting for rank 1 at " : "timed out waiting for rank 1 at ";
    EXPECT_FALSE(lines_with(r.output, tag).empty());
    bool said = false;
    for (auto& l : lines_with(r.output, tag)) said = said || (contains(l, why) && contains(l, "(host-shared memory)"));
    EXPECT_TRUE(said) << "rank " << survivor << " did not say '" << why << "...(host-shared memory)':\n" << r.output;
    if (kind == "kill")
      EXPECT_EQ(lines_with(r.output, tag + "Cause: rank 1 is dead").size(), 1u) << r.output;
  }
  const auto lf = launcher_finding(flight);
  EXPECT_EQ(lf.at("culprit"), 1) << lf.dump();
  EXPECT_EQ(lf.at("kind"), kind == "stop" ? "stopped" : "killed") << lf.dump();
  EXPECT_EQ(host_shared_mappings(job), 0);
}
INSTANTIATE_TEST_SUITE_P(Barriers, HostSharedBarrierFault,
                         ::testing::Combine(::testing::Values("kill", "stop"),
                                            ::testing::Values("all_gather", "reduce_scatter")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// This process's mapping that holds `p`: its permissions ("rw-s", "r--s"),
// "" when none does.
std::string permissions_at(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    const auto dash = line.find('-'), space = line.find(' ');
    const uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
    const uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
    if (lo <= a && a < hi) return line.substr(space + 1, 4);
  }
  return "";
}

// A descriptor of this process taken as a peer takes it (pidfd_getfd), or
// -1 where the kernel has no pidfd_getfd (the test then skips).
int take_as_a_peer(int fd) {
  const int self = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  if (self < 0) return -1;
  const int taken = static_cast<int>(::syscall(SYS_pidfd_getfd, self, fd, 0));
  ::close(self);
  return taken;
}

// Every memfd HostShared makes is sealed once sized: neither its maker nor
// a holder of a duplicate (as a peer takes it) can shrink it (which would
// turn every other rank's next touch into SIGBUS), grow it, or lift the
// seals.
TEST(HostSharedMemory, AMemfdIsSealedAgainstResizingByAnyHolder) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  comm::Memfd m(page + 1, "the test's memory");
  EXPECT_EQ(m.bytes(), 2 * page);
  const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  EXPECT_EQ(::fcntl(m.fd(), F_GET_SEALS) & seals, seals);
  const int peer = take_as_a_peer(m.fd());
  if (peer < 0) GTEST_SKIP() << "no pidfd_getfd here: " << std::strerror(errno);
  for (int fd : {m.fd(), peer}) {
    errno = 0;
    EXPECT_EQ(::ftruncate(fd, 0), -1);
    EXPECT_EQ(errno, EPERM) << "shrinking";
    errno = 0;
    EXPECT_EQ(::ftruncate(fd, 4 * page), -1);
    EXPECT_EQ(errno, EPERM) << "growing";
    errno = 0;
    EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
    EXPECT_EQ(errno, EPERM) << "adding a seal after F_SEAL_SEAL";
  }
  ::close(peer);
  // The mapping still holds its memory (no page was cut away).
  m.base()[2 * page - 1] = 7;
  EXPECT_EQ(m.base()[2 * page - 1], 7);
}

// Taking a peer's memfd checks it before mapping: one smaller than this
// rank asked for, or one not sealed, is refused with words that say so;
// memory mapped for reading only is mapped read-only.
TEST(HostSharedMemory, TakingAPeersMemfdChecksSizeAndSealsAndMapsReadOnly) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int self = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  if (self < 0) GTEST_SKIP() << "no pidfd_open here: " << std::strerror(errno);
  comm::Memfd m(page, "the test's memory");
  std::memcpy(m.base(), "grads", 6);
  std::string why;
  EXPECT_EQ(comm::map_peer_memfd(self, m.fd(), 2 * page, PROT_READ, &why), nullptr);
  EXPECT_TRUE(contains(why, "holds " + std::to_string(page) + " bytes where this rank expected " +
                                std::to_string(2 * page)))
      << why;
  const int unsealed = ::memfd_create("fsdp-host-shared", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, page), 0);
  why.clear();
  EXPECT_EQ(comm::map_peer_memfd(self, unsealed, page, PROT_READ, &why), nullptr);
  EXPECT_TRUE(contains(why, "not sealed against resizing")) << why;
  ::close(unsealed);
  why.clear();
  char* ro = comm::map_peer_memfd(self, m.fd(), page, PROT_READ, &why);
  ASSERT_NE(ro, nullptr) << why;
  EXPECT_EQ(std::string(ro), "grads");
  EXPECT_EQ(permissions_at(ro), "r--s");
  EXPECT_EQ(permissions_at(m.base()), "rw-s");
  ::munmap(ro, page);
  ::close(self);
}

// In a job (3 ranks, one host): peers map each other's gradient blocks
// read-only (each rank: N-1 read-only maps; read-write only its own block
// and the control segment); a peer's memfd taken through its pidfd refuses
// to shrink; and when the ranks ask for shared memory of different sizes,
// every rank (not only rank 0) fails saying which ranks asked for what.
TEST(HostSharedMemory, PeersReadOnlySealedAndEveryRankChecksTheRequest) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  const std::string flight = temp_dir("hs-hardening-flight");
  auto r = run_ranks(3, "hs_hardening", {}, {"FSDP_TIMEOUT=10", "FSDP_FLIGHT_DIR=" + flight}, 120);
  for (int q = 0; q < 3; ++q) {
    const std::string tag = "[rank " + std::to_string(q) + "] ";
    auto maps = lines_with(r.output, tag + "HSH maps ");
    ASSERT_EQ(maps.size(), 1u) << r.output;
    EXPECT_EQ(field(maps[0], "read_only"), 2) << maps[0];
    EXPECT_EQ(field(maps[0], "read_write"), 2) << maps[0];
    auto taken = lines_with(r.output, tag + "HSH peer_memfds=");
    ASSERT_EQ(taken.size(), 1u) << r.output;
    EXPECT_GE(field(taken[0], "peer_memfds"), 1) << taken[0];
    EXPECT_EQ(field(taken[0], "shrink_refused"), field(taken[0], "peer_memfds")) << taken[0];
    auto mismatch = lines_with(r.output, tag + "HSH mismatch: ");
    ASSERT_EQ(mismatch.size(), 1u) << r.output;
    EXPECT_TRUE(contains(mismatch[0], "rank 0 asked for 4000 bytes of host-shared memory where rank 2 asked for 4004"))
        << mismatch[0];
  }
}

// Ranks that issue different host-shared collectives under one sequence
// number (rank 0 an all_gather, the others a reduce_scatter) meet at their
// first barrier, read each other's posts and fail at once, each naming the
// other's barrier and the collective: a barrier never passes for another.
TEST(HostShared, DifferentCollectivesAtOneBarrierFailSayingWhich) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv, so its ranks cannot map each other's memory";
  const std::string flight = temp_dir("hs-desync-flight");
  auto r = run_ranks(3, "hs_desync", {}, {"FSDP_TIMEOUT=10", "FSDP_FLIGHT_DIR=" + flight}, 120);
  for (int q = 0; q < 3; ++q) {
    auto l = lines_with(r.output, "[rank " + std::to_string(q) + "] HSD failed: ");
    ASSERT_EQ(l.size(), 1u) << r.output;
    EXPECT_TRUE(contains(l[0], "failed after 0.0")) << l[0];  // at once, not at the 10 s timeout
    EXPECT_TRUE(contains(l[0], q == 0 ? "reached the reduce_scatter's posting of gradient blocks of collective #2 "
                                        "where this rank reached the all_gather's barrier of #2"
                                      : "rank 0 reached the all_gather's barrier of collective #2 where this rank "
                                        "reached the reduce_scatter's posting of gradient blocks of #2"))
        << l[0];
    EXPECT_TRUE(contains(l[0], "(host-shared memory): the ranks issued different collectives")) << l[0];
  }
}

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
