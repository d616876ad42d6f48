// fsdp-cpp tests: the same-host transport (FSDP_TRANSPORT, src/comm/cma.*)
// with real rank processes: its choice, the ring's summation order, a rank
// killed mid-transfer, timeouts, hosts simulated with FSDP_HOST_ID, and
// parity of training over each transport. Scenarios:
// tests/workers/cma_scenarios.cpp and comm_scenarios.cpp.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <thread>

#include "flight_dump.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Two `fsdp run --nnodes 2` launchers of 2 ranks each on this machine, at
// once; env0/env1 go to node 0/1 (FSDP_HOST_ID there makes them two hosts).
std::pair<ProcResult, ProcResult> two_nodes(const std::string& scenario, const std::vector<std::string>& env0,
                                                const std::vector<std::string>& env1, double timeout_s = 240) {
  return run_launcher_pair({bin_path("fsdp_test_worker"), scenario}, env0, env1, timeout_s);
}

std::set<std::string> shm_entries() {
  std::set<std::string> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) out.insert(e.path().filename().string());
  return out;
}

TEST(CommTransport, ForcedCmaWorksOrSaysWhy) {
  auto r = run_ranks(2, "comm_hello", {}, {"FSDP_TRANSPORT=cma", "FSDP_DEBUG=info"}, 60);
  if (r.exit_code != 0) {
    // A host that forbids it (Yama, a container): one clear message.
    EXPECT_TRUE(contains(r.output, "FSDP_TRANSPORT=cma, but rank")) << r.output;
    EXPECT_FALSE(cma_available()) << r.output;
    return;
  }
  EXPECT_EQ(lines_with(r.output, "hello from cma+gloo").size(), 2u) << r.output;
  EXPECT_EQ(lines_with(r.output, "FSDP_DEBUG: collectives move bytes by cma").size(), 1u) << r.output;
  EXPECT_TRUE(cma_available()) << "auto must choose cma where cma works";
}

// libtorch carries Gloo (built in, symbols exported); a second Gloo in the
// process would be two versions of one library under one set of names.
TEST(CommTransport, OneGlooInTheProcess) {
  auto r = run_ranks(2, "comm_one_gloo", {}, {"FSDP_TRANSPORT=tcp"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(lines_with(r.output, " maps ").empty()) << "a Gloo library is mapped:\n" << r.output;
  auto from = lines_with(r.output, " gloo from ");
  ASSERT_EQ(from.size(), 2u) << r.output;
  for (auto& l : from) EXPECT_TRUE(contains(l, "/libtorch_cpu.so")) << l;
  EXPECT_EQ(lines_with(r.output, " sum 2").size(), 2u) << r.output;
}

TEST(CommTransport, UnknownTransportIsAClearError) {
  auto r = run_ranks(2, "comm_hello", {}, {"FSDP_TRANSPORT=shm"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "FSDP_TRANSPORT='shm' is not a known transport; expected auto")) << r.output;
}

// Reduced values equal a local sum in the ring's order bit for bit, over
// both transports, so the two give identical results for any input.
using OrderParam = std::tuple<int, std::string>;
class CommSumOrder : public ::testing::TestWithParam<OrderParam> {};
TEST_P(CommSumOrder, BitwiseEqualToTheRingOrderSum) {
  auto [n, transport] = GetParam();
  if (transport == "cma" && !cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  auto r = run_ranks(n, "comm_sum_order", {}, {"FSDP_TRANSPORT=" + transport}, 240);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "comm_sum_order passed").size(), static_cast<size_t>(n)) << r.output;
  EXPECT_TRUE(lines_with(r.output, "MISMATCH").empty()) << r.output;
}
INSTANTIATE_TEST_SUITE_P(Transports, CommSumOrder,
                         ::testing::Values(OrderParam{2, "cma"}, OrderParam{3, "cma"}, OrderParam{4, "cma"},
                                           OrderParam{3, "tcp"}),
                         [](const auto& info) {
                           return "N" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                         });

// Rank 1 of 3 SIGKILLs itself while 16 MiB blocks are being read from it:
// ranks 0 and 2 fail (the harness bounds the run; the diagnosis's budget is
// checked on an injected clock, DiagnosisEvidence.*) with an error naming
// rank 1, and nothing is left in /dev/shm (the transport creates no files
// at all).
TEST(CommTransport, RankKilledMidGatherFailsTheOthersNamingIt) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  const auto shm_before = shm_entries();
  auto r = run_command({bin_path("fsdp"), "run", "-n", "3", "--grace", "10", "--", bin_path("fsdp_test_worker"),
                        "comm_kill_gather", "1"},
                       {"FSDP_TRANSPORT=cma", "FSDP_TIMEOUT=3"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "] transport cma+gloo").size(), 3u) << r.output;
  for (int survivor : {0, 2}) {
    const std::string tag = "[rank " + std::to_string(survivor) + "] ";
    EXPECT_EQ(lines_with(r.output, tag + "after ").size(), 1u) << r.output;
    auto error = lines_with(r.output, tag + "error:");
    ASSERT_EQ(error.size(), 1u) << r.output;
    EXPECT_TRUE(contains(error[0], "rank 1")) << error[0];
    EXPECT_TRUE(contains(error[0], "all_gather 'big.ag'")) << error[0];
  }
  std::set<std::string> added;
  for (auto& e : shm_entries())
    if (!shm_before.count(e)) added.insert(e);
  EXPECT_TRUE(added.empty()) << "new in /dev/shm: " << *added.begin();
}

// The existing timeout contract over each transport: rank 2 never arrives
// at #3, the others fail once the timeout passed, naming it.
class CommTimeoutOver : public ::testing::TestWithParam<std::string> {};
TEST_P(CommTimeoutOver, NamesTheMissingRank) {
  const std::string transport = GetParam();
  if (transport == "cma" && !cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  const std::string flight = temp_dir("timeout-flight");
  auto r = run_ranks(3, "comm_timeout", {"2", "3"},
                     {"FSDP_TIMEOUT=2", "FSDP_TRANSPORT=" + transport, "FSDP_FLIGHT_DIR=" + flight}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  auto elapsed = lines_with(r.output, "[rank 0] elapsed=");
  ASSERT_EQ(elapsed.size(), 1u) << r.output;
  const double s = std::stod(elapsed[0].substr(elapsed[0].find('=') + 1));
  EXPECT_GE(s, 1.9) << r.output;
  // Each waiting rank's decision (its flight dump; the words are
  // CommFailure.TimeoutNamesCollectiveAndMissingRank's): it timed out in #3,
  // and the rank at fault is rank 2, alive in no collective.
  for (int q : {0, 1}) {
    const auto v = verdict_in(flight, q);
    EXPECT_EQ(v.at("seq"), 3) << v.dump();
    EXPECT_EQ(v.at("kind"), "all_reduce") << v.dump();
    EXPECT_EQ(v.at("unit"), "blocks.3") << v.dump();
    EXPECT_EQ(v.at("timed_out"), true) << v.dump();
    EXPECT_FALSE(ranks_in(v, "waited_on").empty()) << v.dump();  // the peer it waited on: the path's
    EXPECT_EQ(ranks_in(v, "elsewhere"), std::vector<int>{2}) << v.dump();
    EXPECT_EQ(ranks_in(v, "culprits"), std::vector<int>{2}) << v.dump();
    EXPECT_TRUE(ranks_in(v, "dead").empty() && ranks_in(v, "silent").empty()) << v.dump();
  }
  EXPECT_FALSE(lines_with(r.output, "[rank 0] later call failed after 0.0").empty()) << r.output;
}
INSTANTIATE_TEST_SUITE_P(Transports, CommTimeoutOver, ::testing::Values("tcp", "cma"));

// Two launchers whose host identities differ look like two hosts: auto
// composes the tiers (CMA inside each launcher's host, TCP between,
// tests/test_comm_tiers.cpp) where CMA works, else falls back to TCP for
// everything and says why; the whole grid passes over either.
TEST(CommTransport, TwoHostsComposeTiersAndPassTheGrid) {
  auto [a, b] = two_nodes("comm_collectives", {"FSDP_HOST_ID=node-a", "FSDP_DEBUG=info"},
                              {"FSDP_HOST_ID=node-b", "FSDP_DEBUG=info"});
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(lines_with(a.output + b.output, "comm_collectives passed").size(), 4u) << a.output << b.output;
  const bool tiers = cma_available();
  EXPECT_EQ(lines_with(a.output + b.output, tiers ? "cma+tcp tiers world=4" : "gloo/tcp world=4").size(), 4u)
      << a.output << b.output;
  EXPECT_FALSE(lines_with(a.output, tiers ? "collectives move bytes by tiers" : "tiers not composed").empty())
      << a.output;
}

// FSDP_TRANSPORT=tcp still forces the flat ring across hosts.
TEST(CommTransport, TwoHostsUnderForcedTcpStayFlat) {
  auto [a, b] = two_nodes("comm_hello", {"FSDP_HOST_ID=node-a", "FSDP_TRANSPORT=tcp"},
                              {"FSDP_HOST_ID=node-b", "FSDP_TRANSPORT=tcp"}, 60);
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(lines_with(a.output + b.output, "hello from gloo/tcp world=4").size(), 4u) << a.output << b.output;
}

// The same two launchers without FSDP_HOST_ID are on one host, whatever
// LOCAL_WORLD_SIZE says: CMA.
TEST(CommTransport, TwoLaunchersOnOneHostUseCma) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  auto [a, b] = two_nodes("comm_hello", {}, {}, 60);
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(lines_with(a.output + b.output, "hello from cma+gloo world=4").size(), 4u) << a.output << b.output;
}

// FSDP_TRANSPORT=cma across hosts: ranks that share a host must use CMA,
// so 2 x 2 composes the tiers; hosts of unequal sizes cannot, a clear error
// (tests/test_comm_tiers.cpp has it inside a group).
TEST(CommTransport, ForcedCmaAcrossHostsComposesOrIsAClearError) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  auto [a, b] = two_nodes("comm_hello", {"FSDP_HOST_ID=node-a", "FSDP_TRANSPORT=cma"},
                              {"FSDP_HOST_ID=node-b", "FSDP_TRANSPORT=cma"}, 60);
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(lines_with(a.output + b.output, "hello from cma+tcp tiers world=4").size(), 4u) << a.output << b.output;
  auto r = run_ranks(4, "comm_hello", {}, {"FSDP_TEST_HOST_LAYOUT=a,a,a,b", "FSDP_TRANSPORT=cma"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "FSDP_TRANSPORT=cma, but the ranks are not all on one host (rank 0 on "
                                 "'FSDP_HOST_ID=test-host-a', rank 3 on 'FSDP_HOST_ID=test-host-b')"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "the hosts have different numbers of ranks (host of rank 0: 3, host of rank 3: 1)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "Use FSDP_TRANSPORT=auto")) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

TEST(CommTransport, RanksThatDisagreeOnTheTransportFailClearly) {
  auto [a, b] = two_nodes("comm_hello", {"FSDP_TRANSPORT=tcp"}, {"FSDP_TRANSPORT=auto"}, 60);
  EXPECT_NE(a.exit_code, 0) << a.output;
  EXPECT_NE(b.exit_code, 0) << b.output;
  EXPECT_TRUE(contains(a.output, "ranks disagree on FSDP_TRANSPORT: rank 0 has 'tcp', rank 2 has 'auto'"))
      << a.output;
}

// Training parity (tests/test_core.cpp's scenario) over each transport: a
// subset of the grid that covers all_gather, reduce_scatter (FULL_SHARD,
// SHARD_GRAD_OP with no_sync) and all_reduce (NO_SHARD).
using CoreParam = std::tuple<std::string, int, std::string, std::string>;
class CoreParityOver : public ::testing::TestWithParam<CoreParam> {};
TEST_P(CoreParityOver, MatchesUnshardedReference) {
  auto [transport, n, strategy, mode] = GetParam();
  if (transport == "cma" && !cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  auto r = run_ranks(n, "core_parity", {strategy, mode}, {"FSDP_TRANSPORT=" + transport});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ok = lines_with(r.output, "PARITY");
  ASSERT_EQ(static_cast<int>(ok.size()), n) << r.output;
  for (auto& l : ok) EXPECT_NE(l.find(" OK"), std::string::npos) << l;
}
INSTANTIATE_TEST_SUITE_P(Transports, CoreParityOver,
                         ::testing::Values(CoreParam{"tcp", 3, "full", "rs"}, CoreParam{"cma", 3, "full", "rs"},
                                           CoreParam{"tcp", 2, "none", "plain"}, CoreParam{"cma", 2, "none", "plain"},
                                           CoreParam{"tcp", 3, "grad-op", "nosync"},
                                           CoreParam{"cma", 3, "grad-op", "nosync"}),
                         [](const auto& info) {
                           std::string s = std::get<2>(info.param);
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return std::get<0>(info.param) + "_N" + std::to_string(std::get<1>(info.param)) + "_" +
                                  s + "_" + std::get<3>(info.param);
                         });

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
