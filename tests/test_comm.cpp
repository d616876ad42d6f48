// fsdp-cpp tests: the communicator, in-process (world of one) and as real
// rank processes started through `fsdp run` (scenarios in
// tests/workers/comm_scenarios.cpp).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <tuple>

#include "fsdp/comm.h"
#include "test_util.h"

namespace FSDP_TEST_ID {

using fsdp::testing::lines_with;
using fsdp::testing::run_command;
using fsdp::testing::run_ranks;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(CommLocal, WorldOfOneCopiesAndCounts) {
  auto c = fsdp::make_local_communicator();
  EXPECT_EQ(c->world_size(), 1);
  auto in = torch::arange(7, torch::kFloat);
  auto out = torch::empty({7}, torch::kFloat);
  c->all_gather(in, out, {"x"})->wait();
  EXPECT_TRUE(torch::equal(in, out));
  auto rs_out = torch::empty({7}, torch::kBFloat16);
  c->reduce_scatter(in.to(torch::kBFloat16), rs_out, fsdp::ReduceOp::AVG)->wait();
  EXPECT_TRUE(torch::equal(rs_out, in.to(torch::kBFloat16)));
  auto t = in.clone();
  c->all_reduce(t, fsdp::ReduceOp::SUM)->wait();
  c->broadcast(t, 0)->wait();
  c->barrier()->wait();
  EXPECT_TRUE(torch::equal(t, in));
  auto counters = c->counters();
  EXPECT_EQ(counters[fsdp::CollectiveKind::ALL_GATHER].calls, 1);
  EXPECT_EQ(counters.total_bytes_sent(), 0);
  c->reset_counters();
  EXPECT_EQ(c->counters()[fsdp::CollectiveKind::ALL_GATHER].calls, 0);
}

TEST(CommLocal, MisuseSaysWhatWasExpectedAndPoisons) {
  auto c = fsdp::make_local_communicator();
  auto in = torch::ones({4}, torch::kFloat);
  auto out = torch::empty({5}, torch::kFloat);
  try {
    c->all_gather(in, out);
    FAIL() << "a wrong output size must throw";
  } catch (const fsdp::CollectiveError& e) {
    EXPECT_TRUE(contains(e.what(), "expected output.numel() == world_size * input.numel()")) << e.what();
    EXPECT_TRUE(contains(e.what(), "found 5")) << e.what();
  }
  // Every later call fails with the same error.
  EXPECT_THROW(c->barrier()->wait(), fsdp::CollectiveError);
}

TEST(CommLocal, GatherMisuseNamesRootAndOutput) {
  auto in = torch::ones({4}, torch::kFloat);
  {
    auto c = fsdp::make_local_communicator();
    auto out = torch::empty({4}, torch::kFloat);
    c->gather(in, out, 0)->wait();
    EXPECT_TRUE(torch::equal(out, in));
    EXPECT_EQ(c->counters()[fsdp::CollectiveKind::GATHER].calls, 1);
  }
  {
    auto c = fsdp::make_local_communicator();
    try {
      c->gather(in, torch::empty({4}), 1);
      FAIL() << "a root outside the world must throw";
    } catch (const fsdp::CollectiveError& e) {
      EXPECT_TRUE(contains(e.what(), "root 1 is not a rank of this world of 1")) << e.what();
    }
  }
  {
    auto c = fsdp::make_local_communicator();
    try {
      c->gather(in, torch::Tensor(), 0);
      FAIL() << "the root needs an output";
    } catch (const fsdp::CollectiveError& e) {
      EXPECT_TRUE(contains(e.what(), "is the root but its output tensor is undefined")) << e.what();
    }
  }
}

TEST(CommLocal, IntegerAverageIsRejected) {
  auto c = fsdp::make_local_communicator();
  auto t = torch::ones({3}, torch::kLong);
  try {
    c->all_reduce(t, fsdp::ReduceOp::AVG);
    FAIL() << "integer AVG must throw";
  } catch (const fsdp::CollectiveError& e) {
    EXPECT_TRUE(contains(e.what(), "AVG")) << e.what();
  }
}

TEST(CommLocal, TimeoutFromEnvironment) {
  setenv("FSDP_TIMEOUT", "2.5", 1);
  auto c = fsdp::make_local_communicator();
  unsetenv("FSDP_TIMEOUT");
  EXPECT_EQ(c->timeout().count(), 2500);
}

// Every collective x dtype x size at N ranks, checked in each rank, over
// each transport between ranks of this host (FSDP_TRANSPORT): Gloo's TCP
// ring and cross-memory attach. cma is skipped where this host forbids
// reading a peer's memory (auto then falls back to tcp).
using GridParam = std::tuple<int, std::string>;
class CommCollectives : public ::testing::TestWithParam<GridParam> {};

TEST_P(CommCollectives, GridMatchesLocalReference) {
  auto [n, transport] = GetParam();
  if (transport == "cma" && !fsdp::testing::cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  auto r = run_ranks(n, "comm_collectives", {}, {"FSDP_TRANSPORT=" + transport}, 240);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "comm_collectives passed").size(), static_cast<size_t>(n)) << r.output;
  EXPECT_TRUE(lines_with(r.output, "MISMATCH").empty()) << r.output;
  // The transport really used (a world of one has none).
  if (n > 1) {
    EXPECT_EQ(lines_with(r.output, transport == "cma" ? "cma+gloo world=" : "gloo/tcp world=").size(),
              static_cast<size_t>(n))
        << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommCollectives,
                         ::testing::Values(GridParam{1, "auto"}, GridParam{2, "tcp"}, GridParam{2, "cma"},
                                           GridParam{3, "tcp"}, GridParam{3, "cma"}, GridParam{4, "tcp"},
                                           GridParam{4, "cma"}),
                         [](const auto& info) {
                           const int n = std::get<0>(info.param);
                           return "N" + std::to_string(n) + (n == 1 ? "" : "_" + std::get<1>(info.param));
                         });

TEST(CommFailure, TimeoutNamesCollectiveAndMissingRank) {
  // Rank 2 never arrives at collective #3; ranks 0 and 1 fail once the
  // timeout passed (not before) and say what, where and who. That the
  // diagnosis adds at most its budget is checked on an injected clock
  // (DiagnosisEvidence.*), not here against a busy machine's wall clock.
  auto r = run_ranks(3, "comm_timeout", {"2", "3"}, {"FSDP_TIMEOUT=2"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  auto elapsed = lines_with(r.output, "[rank 0] elapsed=");
  ASSERT_EQ(elapsed.size(), 1u) << r.output;
  double s = std::stod(elapsed[0].substr(elapsed[0].find('=') + 1));
  EXPECT_GE(s, 1.9) << r.output;
  auto error = lines_with(r.output, "[rank 0] error:");
  ASSERT_EQ(error.size(), 1u) << r.output;
  EXPECT_TRUE(contains(error[0], "all_reduce 'blocks.3'")) << error[0];
  EXPECT_TRUE(contains(error[0], "collective #3")) << error[0];
  EXPECT_TRUE(contains(error[0], "world of 3")) << error[0];
  EXPECT_TRUE(contains(error[0], "timed out")) << error[0];
  EXPECT_FALSE(lines_with(r.output, "[rank 0] Ranks that never arrived at #3: rank 2 (last entered #2").empty())
      << r.output;
  EXPECT_FALSE(lines_with(r.output, "[rank 0] later call failed after 0.0").empty()) << r.output;
  EXPECT_TRUE(lines_with(r.output, "unexpected: the collective completed").empty()) << r.output;
}

TEST(CommFailure, WorldSizeDisagreementIsAnErrorNotAHang) {
  auto r = run_ranks(2, "comm_world_mismatch", {"1", "3"}, {"FSDP_RENDEZVOUS_TIMEOUT=20"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(lines_with(r.output, "disagree on the world size").empty()) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
}

TEST(CommFailure, UnreachableMasterIsAClearError) {
  auto r = run_command({fsdp::testing::bin_path("fsdp_test_worker"), "comm_hello"},
                       {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                        "MASTER_PORT=" + std::to_string(fsdp::testing::free_port()), "FSDP_RENDEZVOUS_TIMEOUT=2"},
                       60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "could not reach the rendezvous store at 127.0.0.1:")) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
}

}  // namespace FSDP_TEST_ID
