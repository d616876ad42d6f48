// fsdp-cpp tests: sub-communicators (Communicator::split) — collectives
// inside groups of 2x2, 1x4 and uneven sizes, global ranks in their errors,
// traffic counted by host tier. Each body runs in every rank (FSDP_IN_RANKS);
// inputs encode the global rank so every expected value is computable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "fsdp/comm.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Every collective of `g` against values computed from the global ranks.
void expect_collectives_work(Communicator& g) {
  const int n = g.world_size(), r = g.rank();
  const std::vector<int> global = g.global_ranks();
  ASSERT_EQ(static_cast<int>(global.size()), n);
  const int me = global[r];
  // all_gather: rank q contributes 3 elements of value 10*global(q) + i.
  auto in = torch::tensor({10.f * me, 10.f * me + 1, 10.f * me + 2});
  auto out = torch::empty({3 * n});
  g.all_gather(in, out, {"test ag"})->wait();
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(out[3 * q + i].item<float>(), 10.f * global[q] + i);
  // reduce_scatter (SUM): element j of every rank's input is global + j.
  auto rs_in = torch::arange(2 * n, torch::kFloat32) + float(me);
  auto rs_out = torch::empty({2});
  g.reduce_scatter(rs_in, rs_out, ReduceOp::SUM, {"test rs"})->wait();
  float sum_global = 0;
  for (int q : global) sum_global += float(q);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(rs_out[i].item<float>(), sum_global + float(n * (2 * r + i)));
  // all_reduce (AVG), an odd length so the chunks are uneven.
  auto ar = torch::full({5}, float(me));
  g.all_reduce(ar, ReduceOp::AVG, {"test ar"})->wait();
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(ar[i].item<float>(), sum_global / float(n));
  // broadcast from the group's last rank.
  auto b = torch::full({4}, float(me));
  g.broadcast(b, n - 1, {"test bcast"})->wait();
  EXPECT_EQ(b[0].item<float>(), float(global[n - 1]));
  // gather to the group's rank 0.
  auto gin = torch::full({2}, float(me));
  auto gout = r == 0 ? torch::empty({2 * n}) : torch::Tensor();
  g.gather(gin, gout, 0, {"test gather"})->wait();
  if (r == 0)
    for (int q = 0; q < n; ++q) EXPECT_EQ(gout[2 * q].item<float>(), float(global[q]));
  g.barrier({"test barrier"})->wait();
}

TEST(CommGroups, TwoGroupsOfTwo) {
  FSDP_IN_RANKS(4);
  auto world = make_communicator_from_env();
  const int r = world->rank();
  auto shard = world->split(r / 2, {"shard", std::chrono::milliseconds(0)});
  auto replica = world->split(r % 2, {"replica", std::chrono::milliseconds(0)});
  ASSERT_EQ(shard->world_size(), 2);
  ASSERT_EQ(replica->world_size(), 2);
  EXPECT_EQ(shard->rank(), r % 2);
  EXPECT_EQ(replica->rank(), r / 2);
  EXPECT_EQ(shard->global_ranks(), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(replica->global_ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
  EXPECT_TRUE(contains(shard->describe(), "group 'shard' of ranks")) << shard->describe();
  EXPECT_EQ(shard->timeout(), world->timeout());
  // Collectives on both, interleaved with the world's: each has its own
  // sequence numbers and thread.
  world->reset_counters();
  expect_collectives_work(*shard);
  expect_collectives_work(*world);
  expect_collectives_work(*replica);
  // Own counters; the world's include its groups'.
  auto s = shard->counters(), w = world->counters(), p = replica->counters();
  EXPECT_EQ(s[CollectiveKind::ALL_GATHER].calls, 1);
  EXPECT_EQ(p[CollectiveKind::ALL_GATHER].calls, 1);
  EXPECT_EQ(w[CollectiveKind::ALL_GATHER].calls, 3);
  EXPECT_GT(s.total_bytes_sent(), 0);
  EXPECT_GT(p.total_bytes_sent(), 0);
  EXPECT_GT(w.total_bytes_sent(), s.total_bytes_sent() + p.total_bytes_sent());  // + the world's own
  shard->reset_counters();
  EXPECT_EQ(shard->counters().total_bytes_sent(), 0);
  EXPECT_EQ(world->counters()[CollectiveKind::ALL_GATHER].calls, 3);
  // A group of a group.
  auto inner = shard->split(0, {"inner", std::chrono::milliseconds(0)});
  EXPECT_EQ(inner->global_ranks(), shard->global_ranks());
  expect_collectives_work(*inner);
}

TEST(CommGroups, OneGroupOfFour) {
  FSDP_IN_RANKS(4);
  auto world = make_communicator_from_env();
  auto all = world->split(0, {"all", std::chrono::milliseconds(0)});
  ASSERT_EQ(all->world_size(), 4);
  EXPECT_EQ(all->rank(), world->rank());
  EXPECT_EQ(all->global_ranks(), (std::vector<int>{0, 1, 2, 3}));
  expect_collectives_work(*all);
  // And four groups of one: worlds of one that keep their global rank.
  auto alone = world->split(world->rank(), {"alone", std::chrono::milliseconds(0)});
  ASSERT_EQ(alone->world_size(), 1);
  EXPECT_EQ(alone->global_ranks(), (std::vector<int>{world->rank()}));
  expect_collectives_work(*alone);
}

TEST(CommGroups, UnevenGroupsOfThreeAndOne) {
  FSDP_IN_RANKS(4);
  auto world = make_communicator_from_env();
  const int r = world->rank();
  // Colors need not be dense or ordered: rank 1 alone in color 7.
  auto g = world->split(r == 1 ? 7 : 3, {"uneven", std::chrono::milliseconds(0)});
  if (r == 1) {
    EXPECT_EQ(g->world_size(), 1);
    EXPECT_EQ(g->global_ranks(), (std::vector<int>{1}));
  } else {
    ASSERT_EQ(g->world_size(), 3);
    EXPECT_EQ(g->global_ranks(), (std::vector<int>{0, 2, 3}));
    EXPECT_EQ(g->rank(), r == 0 ? 0 : r - 1);
  }
  expect_collectives_work(*g);
  expect_collectives_work(*world);
}

// Rank 3 skips a collective of group {2, 3}: rank 2 times out after the
// group's own (short) timeout, and the message names global ranks.
TEST(CommGroups, TimeoutNamesGlobalRanks) {
  FSDP_IN_RANKS(4);
  auto world = make_communicator_from_env();
  const int r = world->rank();
  auto g = world->split(r / 2, {"shard", std::chrono::milliseconds(1500)});
  EXPECT_EQ(g->timeout(), std::chrono::milliseconds(1500));
  if (r == 2) {
    auto t = torch::ones({8});
    try {
      g->all_reduce(t, ReduceOp::SUM, {"skipped by rank 3"})->wait();
      ADD_FAILURE() << "the all_reduce should have timed out";
    } catch (const CollectiveError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(contains(m, "of rank 2 (group rank 0) in a group of 2")) << m;
      EXPECT_TRUE(contains(m, "rank 3 (group rank 1) (last entered #")) << m;
      EXPECT_TRUE(contains(m, "group 'shard' of ranks 2, 3")) << m;
      EXPECT_TRUE(contains(m, "timed out")) << m;
    }
  } else if (r == 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // rank 2 gives up meanwhile
  }
  // The world is unaffected.
  world->barrier({"after"})->wait();
}

TEST(CommGroups, NegativeColorAndWorldOfOne) {
  auto one = make_local_communicator();
  try {
    one->split(-1);
    ADD_FAILURE() << "a negative color should throw";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "the color must be >= 0, found -1")) << e.what();
  }
  auto g = one->split(5, {"solo", std::chrono::milliseconds(0)});
  EXPECT_EQ(g->world_size(), 1);
  EXPECT_EQ(g->global_ranks(), (std::vector<int>{0}));
  EXPECT_EQ(g->hosts(), (std::vector<int>{0}));
}

// Two simulated hosts (FSDP_HOST_ID): ranks 0,1 on host a, 2,3 on host b.
// The world's all-gather composes the tiers where CMA works (src/comm/tiers.h):
// each rank sends its block across once ((H-1) b) and the host's two blocks
// inside ((S-1) H b); on the flat ring (FSDP_TRANSPORT=tcp, or no CMA) it
// sends only to the right neighbour, so ranks 1 and 3 send everything
// across hosts and ranks 0 and 2 nothing. The shard groups {0,1}, {2,3}
// stay inside a host and the replica groups {0,2}, {1,3} cross for every
// byte.
void traffic_by_host_tier(const std::string& transport) {
  const bool tiers = transport == "auto";
  // Asked in the test process only (it starts ranks of its own).
  if (tiers && !std::getenv("FSDP_RANK_TEST") && !cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  FSDP_IN_RANKS(4);
  const int r = std::atoi(std::getenv("RANK"));
  setenv("FSDP_HOST_ID", r < 2 ? "host-a" : "host-b", 1);
  setenv("FSDP_TRANSPORT", transport.c_str(), 1);
  auto world = make_communicator_from_env();
  EXPECT_EQ(world->describe().find("tiers") != std::string::npos, tiers) << world->describe();
  EXPECT_EQ(world->hosts(), (std::vector<int>{0, 0, 1, 1}));
  auto shard = world->split(r / 2, {"shard", std::chrono::milliseconds(0)});
  auto replica = world->split(r % 2, {"replica", std::chrono::milliseconds(0)});
  EXPECT_EQ(shard->hosts(), (std::vector<int>{0, 0}));
  EXPECT_EQ(replica->hosts(), (std::vector<int>{0, 1}));
  EXPECT_EQ(shard->local_world_size(), 2);
  EXPECT_EQ(replica->local_world_size(), 1);
  world->reset_counters();
  shard->reset_counters();
  replica->reset_counters();
  const int64_t block = 1000;  // floats per rank
  auto in = torch::ones({block});
  {
    auto out = torch::empty({4 * block});
    world->all_gather(in, out)->wait();
  }
  auto c = world->counters()[CollectiveKind::ALL_GATHER];
  EXPECT_EQ(c.bytes_sent, 3 * block * 4);
  const int64_t ag_inter = tiers ? block * 4 : (r == 1 || r == 3) ? 3 * block * 4 : 0;
  EXPECT_EQ(c.bytes_inter_host, ag_inter);
  {
    auto out = torch::empty({2 * block});
    shard->all_gather(in, out)->wait();
  }
  EXPECT_EQ(shard->counters()[CollectiveKind::ALL_GATHER].bytes_sent, block * 4);
  EXPECT_EQ(shard->counters()[CollectiveKind::ALL_GATHER].bytes_inter_host, 0);
  auto t = torch::ones({2 * block});
  replica->all_reduce(t, ReduceOp::SUM)->wait();
  // 2 (R-1)/R of the tensor at R = 2: the tensor's bytes, all across hosts.
  EXPECT_EQ(replica->counters()[CollectiveKind::ALL_REDUCE].bytes_sent, 2 * block * 4);
  EXPECT_EQ(replica->counters()[CollectiveKind::ALL_REDUCE].bytes_inter_host, 2 * block * 4);
  // The world adds up its groups, tier by tier.
  auto w = world->counters();
  EXPECT_EQ(w.total_bytes_sent(), 3 * block * 4 + block * 4 + 2 * block * 4);
  EXPECT_EQ(w.total_bytes_inter_host(), ag_inter + 2 * block * 4);
  EXPECT_EQ(w.total_bytes_intra_host(), w.total_bytes_sent() - w.total_bytes_inter_host());
  // Broadcast from rank 0: one peer on its host, two on the other.
  world->reset_counters();
  auto b = torch::ones({block});
  world->broadcast(b, 0)->wait();
  EXPECT_EQ(world->counters()[CollectiveKind::BROADCAST].bytes_inter_host, r == 0 ? 2 * block * 4 : 0);
}
TEST(CommGroups, TrafficCountedByHostTier) { traffic_by_host_tier("auto"); }
TEST(CommGroups, TrafficCountedByHostTierOverFlatTcp) { traffic_by_host_tier("tcp"); }

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
