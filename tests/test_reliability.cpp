// fsdp-cpp tests: reliability — collective trace spans, FSDP_DEBUG=detail,
// stragglers, the rendezvous store's binding and job token (scenarios in
// tests/workers/reliability_scenarios.cpp).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "fsdp/comm.h"
#include "fsdp/errors.h"
#include "fsdp/straggler.h"
#include "flight_dump.h"
#include "test_util.h"

namespace FSDP_TEST_ID {

using fsdp::testing::lines_with;
using fsdp::testing::run_command;
using fsdp::testing::run_ranks;
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

using fsdp::testing::ranks_in;
using fsdp::testing::temp_dir;
using fsdp::testing::verdict_in;

TEST(ReliabilityTrace, CollectivesRecordCommSpansOnTheCommThread) {
  std::string dir = temp_dir("trace");
  auto r = run_ranks(2, "rel_trace", {dir}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream f(dir + "/trace-rank" + std::to_string(rank) + ".json");
    ASSERT_TRUE(f.good()) << r.output;
    auto j = nlohmann::json::parse(f);
    int comm_tid = -1;
    for (auto& e : j["traceEvents"])
      if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "comm") comm_tid = e["tid"];
    ASSERT_GE(comm_tid, 0) << "no thread named comm in rank " << rank;
    std::vector<std::string> names;
    std::set<int64_t> seqs;
    for (auto& e : j["traceEvents"]) {
      if (e["ph"] != "X" || e["cat"] != "comm") continue;
      EXPECT_EQ(e["tid"], comm_tid);
      names.push_back(e["name"]);
      ASSERT_TRUE(e["args"].contains("unit") && e["args"].contains("bytes") && e["args"].contains("seq")) << e.dump();
      seqs.insert(e["args"]["seq"].get<int64_t>());
      if (e["name"] == "all_gather") {
        EXPECT_EQ(e["args"]["unit"], "blocks.0");
        EXPECT_EQ(e["args"]["bytes"], 400);  // (N-1)/N of 2 x 100 fp32
      }
      if (e["name"] == "reduce_scatter") EXPECT_EQ(e["args"]["bytes"], 400);
      if (e["name"] == "broadcast") EXPECT_EQ(e["args"]["bytes"], rank == 0 ? 400 : 0);
    }
    EXPECT_EQ(names, (std::vector<std::string>{"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"}));
    EXPECT_EQ(seqs, (std::set<int64_t>{1, 2, 3, 4, 5}));
  }
  fs::remove_all(dir);
}

TEST(ReliabilityDebug, DetailCheckTurnsASizeMismatchIntoAnErrorOnEveryRank) {
  auto r = run_ranks(3, "rel_mismatch", {"1"}, {"FSDP_DEBUG=detail", "FSDP_TIMEOUT=20"}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto errors = lines_with(r.output, "mismatch error:");
  ASSERT_EQ(errors.size(), 3u) << r.output;
  for (auto& e : errors) {
    EXPECT_TRUE(contains(e, "ranks issued different collectives at #2")) << e;
    EXPECT_TRUE(contains(e, "rank 0: all_reduce 'blocks.1' #2 (fp32, 1000 elements, SUM)")) << e;
    EXPECT_TRUE(contains(e, "rank 1: all_reduce 'blocks.1' #2 (fp32, 999 elements, SUM)   <-- differs")) << e;
    EXPECT_TRUE(contains(e, "rank 2: all_reduce 'blocks.1' #2 (fp32, 1000 elements, SUM)|")) << e;
  }
  // Found by the exchange before the collective ran, not by its 20 s
  // timeout: the check's message (above) is the event; none timed out.
  EXPECT_EQ(lines_with(r.output, "elapsed=").size(), 3u) << r.output;
  EXPECT_TRUE(lines_with(r.output, "timed out after").empty()) << r.output;
}

// The compressible mark is part of the call: a rank that would send
// quantized bytes where the others send exact ones is named as the size is.
TEST(ReliabilityDebug, DetailCheckComparesTheCompressibleMark) {
  auto r = run_ranks(2, "rel_mismatch", {"1", "lossy"}, {"FSDP_DEBUG=detail", "FSDP_TIMEOUT=20"}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto errors = lines_with(r.output, "mismatch error:");
  ASSERT_EQ(errors.size(), 2u) << r.output;
  for (auto& e : errors) {
    EXPECT_TRUE(contains(e, "rank 0: all_reduce 'blocks.1' #2 (fp32, 1000 elements, SUM)|")) << e;
    EXPECT_TRUE(contains(e, "rank 1: all_reduce 'blocks.1' #2 (fp32, 1000 elements, SUM, compressible)   <-- differs"))
        << e;
    EXPECT_TRUE(contains(e, "root, reduce op and compressible mark")) << e;
  }
  EXPECT_TRUE(lines_with(r.output, "timed out after").empty()) << r.output;
}

TEST(ReliabilityDebug, WithoutDetailTheSameMismatchIsNamedOnlyAfterItFails) {
  // Without the check nothing compares the calls before they run: the
  // mismatched all_reduce (999 vs 1000 elements) is issued, fails in the
  // transfer (cross-memory attach sees the sizes differ; TCP would wait for
  // the timeout), and only the diagnosis of that failure, reading every
  // rank's progress key, names the disagreement. Both ranks get there and
  // report it; neither with the detail check's message.
  const std::string flight = temp_dir("mismatch-flight");
  auto r = run_ranks(2, "rel_mismatch", {"1"}, {"FSDP_TIMEOUT=2", "FSDP_FLIGHT_DIR=" + flight}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto errors = lines_with(r.output, "mismatch error:");
  ASSERT_EQ(errors.size(), 2u) << r.output;
  for (auto& e : errors) {
    EXPECT_FALSE(contains(e, "FSDP_DEBUG=detail")) << e;
    EXPECT_TRUE(contains(e, "Ranks issued different collectives at #2:")) << e;  // the words, once
  }
  // Each rank's decision (its flight dump): in #2, the other rank entered a
  // different collective, and it was found before any timeout.
  for (int q : {0, 1}) {
    const auto v = verdict_in(flight, q);
    EXPECT_EQ(v.at("seq"), 2) << v.dump();
    EXPECT_EQ(v.at("kind"), "all_reduce") << v.dump();
    EXPECT_EQ(v.at("unit"), "blocks.1") << v.dump();
    EXPECT_EQ(v.at("timed_out"), false) << v.dump();
    EXPECT_EQ(ranks_in(v, "desync"), std::vector<int>{1 - q}) << v.dump();
    EXPECT_EQ(ranks_in(v, "culprits"), std::vector<int>{1 - q}) << v.dump();
  }
  EXPECT_TRUE(lines_with(r.output, "unexpected: the mismatched collective completed").empty()) << r.output;
}

TEST(ReliabilityDebug, UnknownLevelIsAClearError) {
  auto r = run_ranks(2, "rel_latency", {"1", "1"}, {"FSDP_DEBUG=verbose"}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "FSDP_DEBUG='verbose' is not a known level; expected off or detail")) << r.output;
}

TEST(ReliabilityDebug, DetailCheckCostPerCall) {
  // Measured, printed, loosely bounded: the check is one extra ring exchange.
  double us[2] = {0, 0};
  for (int detail = 0; detail < 2; ++detail) {
    auto r = run_ranks(4, "rel_latency", {"300", "256"}, {detail ? "FSDP_DEBUG=detail" : "FSDP_DEBUG=off"}, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto l = lines_with(r.output, "[rank 0] latency_us=");
    ASSERT_EQ(l.size(), 1u) << r.output;
    us[detail] = std::stod(l[0].substr(l[0].find('=') + 1));
  }
  std::printf("all_reduce of 256 fp32 at N=4: %.1f us plain, %.1f us with FSDP_DEBUG=detail (+%.1f us)\n", us[0],
              us[1], us[1] - us[0]);
  EXPECT_LT(us[1], us[0] * 4 + 2000);
}

TEST(ReliabilityStraggler, ASleepingRankIsNamedAfterTheWindow) {
  auto r = run_ranks(3, "rel_straggler", {"2", "8", "20", "80"}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto log = lines_with(r.output, "fsdp: straggler at step 5: rank 2 (");
  ASSERT_EQ(log.size(), 1u) << r.output;  // rank 0 only, once per window
  EXPECT_TRUE(contains(log[0], "[rank 0]")) << log[0];
  EXPECT_TRUE(contains(log[0], "slower than 1.5 x the median step time")) << log[0];
  EXPECT_EQ(lines_with(r.output, "first named at step 5").size(), 3u) << r.output;
  EXPECT_EQ(lines_with(r.output, "stragglers at step 5: 2").size(), 3u) << r.output;
  // The summary is the same on every rank: rank 2 named once (step 5; the
  // next window would end at step 10).
  auto sum = lines_with(r.output, "summary: fsdp: straggler monitor: 8 steps, mean busy ms per rank r0 ");
  ASSERT_EQ(sum.size(), 3u) << r.output;
  for (auto& l : sum)
    EXPECT_TRUE(contains(l, "; rank 2 named at step 5 (slower than 1.5 x the other ranks' median for 5 steps in a row)"))
        << l;
}

TEST(ReliabilityStraggler, EvenRanksNameNobody) {
  auto r = run_ranks(3, "rel_straggler", {"-1", "8", "20", "20"}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(lines_with(r.output, "fsdp: straggler at").empty()) << r.output;
  EXPECT_EQ(lines_with(r.output, "first named at step -1").size(), 3u) << r.output;
  EXPECT_EQ(lines_with(r.output, "; no rank was slower than 1.5 x the other ranks' median for 5 steps in a row").size(),
            3u)
      << r.output;
}

TEST(ReliabilityStraggler, BadOptionsAreRejected) {
  auto c = fsdp::make_local_communicator();
  EXPECT_THROW(fsdp::StragglerMonitor bad(c, 1.0, 5), fsdp::Error);
  EXPECT_THROW(fsdp::StragglerMonitor bad(c, 1.5, 0), fsdp::Error);
  fsdp::StragglerMonitor ok(c);
  auto rep = ok.observe(0.25);
  EXPECT_EQ(rep.seconds, std::vector<double>{0.25});
  EXPECT_TRUE(rep.stragglers.empty());
}

TEST(ReliabilityStore, ListensOnTheMasterAddressOnly) {
  auto r = run_ranks(2, "rel_store_bind", {}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = lines_with(r.output, "store listens on");
  ASSERT_FALSE(l.empty()) << r.output;
  for (auto& x : l) {
    // 127.0.0.1 as /proc/net/tcp spells it, or its IPv4-mapped IPv6 form.
    EXPECT_TRUE(contains(x, "0100007F")) << x;
    EXPECT_FALSE(contains(x, " 00000000\n") || contains(x, "00000000000000000000000000000000")) << x;
  }
}

// The library installs no signal handler behind a program's back
// (fsdp/init.h): its own SIGUSR1 handler outlives a communicator, a wrap and
// a training step, and is what SIGUSR1 runs.
TEST(ProcessState, AProgramsOwnSigusr1HandlerIsKept) {
  auto r = run_ranks(2, "rel_own_sigusr1", {}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "handler own, ran 1 time(s)").size(), 2u) << r.output;
}

TEST(ReliabilityStore, BindAllIsTheEscapeHatch) {
  auto r = run_ranks(2, "rel_store_bind", {}, {"FSDP_STORE_BIND=all"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = lines_with(r.output, "store listens on");
  ASSERT_FALSE(l.empty()) << r.output;
  EXPECT_FALSE(contains(l[0], "0100007F")) << l[0];
}

TEST(ReliabilityStore, ARankWithAnotherJobTokenFailsFast) {
  // Rank 1 is started by hand with a different token against rank 0's
  // store, right after rank 0: its store client waits for rank 0's store to
  // listen and for its job key (the events), within the rendezvous timeout.
  // Failing fast is failing on the job check, long before that timeout.
  auto port = std::to_string(29000 + getpid() % 1000);
  std::string worker = fsdp::testing::bin_path("fsdp_test_worker");
  pid_t pid = fork();
  if (pid == 0) {
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port.c_str(), 1);
    setenv("FSDP_JOB_TOKEN", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 1);
    setenv("FSDP_RENDEZVOUS_TIMEOUT", "60", 1);
    freopen("/dev/null", "w", stdout);
    freopen("/dev/null", "w", stderr);
    execl(worker.c_str(), worker.c_str(), "rel_latency", "1", "1", nullptr);
    _exit(127);
  }
  auto r = run_command({worker, "rel_latency", "1", "1"},
                       {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                        "FSDP_JOB_TOKEN=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "FSDP_RENDEZVOUS_TIMEOUT=60"},
                       90);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "belongs to another job")) << r.output;
  EXPECT_FALSE(contains(r.output, "did not join") || contains(r.output, "did not register")) << r.output;
  EXPECT_LT(r.seconds, 45) << "waited for the 60 s rendezvous timeout: " << r.output;
}

TEST(ReliabilityStore, ShortTokenIsRejected) {
  auto r = run_ranks(2, "rel_latency", {"1", "1"}, {"FSDP_JOB_TOKEN=short"}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "FSDP_JOB_TOKEN has 5 characters; expected 16 to 128")) << r.output;
}

TEST(ReliabilityTwoHosts, TwoNamespacesTrainLikeOneHostWithFourRanks) {
  auto r = fsdp::testing::run_command(
      {"/bin/bash", fsdp::testing::source_path("tests/netns/two_hosts.sh"), fsdp::testing::bin_path("")}, {}, 600);
  if (r.exit_code == 77) {
    auto why = fsdp::testing::lines_with(r.output, "two_hosts: SKIP:");
    GTEST_SKIP() << (why.empty() ? r.output : why[0]);
  }
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fsdp::testing::lines_with(r.output, "two_hosts: PASS").empty()) << r.output;
  std::printf("%s\n", fsdp::testing::lines_with(r.output, "two_hosts: node 0 exit").at(0).c_str());
}

}  // namespace FSDP_TEST_ID
