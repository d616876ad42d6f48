// The one decision of which path collectives take (common/collective_path.h):
// every branch, as the communicator and the planner ask it.
#include <gtest/gtest.h>

#include "common/collective_path.h"
#include "common/ring_math.h"
#include "common/traffic_math.h"

using fsdp::path::choose;
using fsdp::path::Facts;
using fsdp::path::Path;

namespace FSDP_TEST_ID {
Facts several_hosts() {
  Facts f;
  f.ranks = 4;
  f.hosts_differ = "the ranks are not all on one host (rank 0 on 'a', rank 2 on 'b')";
  f.ranks_sharing_a_host = 4;
  return f;
}

TEST(CollectivePath, EveryBranchAndItsReason) {
  Facts tcp;
  tcp.transport = "tcp";
  tcp.ranks = 3;
  EXPECT_EQ(choose(tcp).path, Path::TCP);
  EXPECT_EQ(choose(tcp).reason, "FSDP_TRANSPORT=tcp");

  Facts one;
  one.ranks = 3;
  EXPECT_EQ(choose(one).path, Path::CMA);
  EXPECT_EQ(choose(one).reason,
            "all 3 ranks are on this host and may read each other's memory; units keep one copy of their parameters "
            "per host and reduce gradients where they lie");
  EXPECT_TRUE(choose(one).host_shared);

  Facts unshared = one;
  unshared.share_host = false;
  EXPECT_EQ(choose(unshared).path, Path::CMA);
  EXPECT_FALSE(choose(unshared).host_shared);
  EXPECT_EQ(choose(unshared).reason,
            "all 3 ranks are on this host and may read each other's memory; each rank keeps its own copy of the "
            "parameters (FSDP_SHARE_HOST=off)");
  Facts unmappable = one;
  unmappable.share_blocked = "rank 1 could not map rank 0's memory (pidfd_getfd: Operation not permitted (errno 1))";
  EXPECT_EQ(choose(unmappable).path, Path::CMA);
  EXPECT_FALSE(choose(unmappable).host_shared);
  EXPECT_EQ(choose(unmappable).reason,
            "all 3 ranks are on this host and may read each other's memory; each rank keeps its own copy of the "
            "parameters: " + unmappable.share_blocked);

  Facts blocked = one;
  blocked.cma_blocked = "rank 1 cannot read rank 0's memory (EPERM)";
  EXPECT_EQ(choose(blocked).path, Path::TCP);
  EXPECT_EQ(choose(blocked).reason, blocked.cma_blocked);
  EXPECT_TRUE(choose(blocked).refused.empty()) << "auto falls back to TCP";
  blocked.transport = "cma";
  EXPECT_EQ(choose(blocked).refused, blocked.cma_blocked);

  EXPECT_FALSE(choose(blocked).host_shared) << "no shared memory without the CMA path";

  // The tiers share memory inside each host as one host does: on unless
  // switched off or some host's ranks cannot map each other's memory.
  Facts tiers = several_hosts();
  EXPECT_EQ(choose(tiers).path, Path::TIERS);
  EXPECT_TRUE(choose(tiers).host_shared) << "inside each host, as on one";
  EXPECT_EQ(choose(tiers).reason,
            "the hosts have equal numbers (> 1) of ranks: cross-memory attach inside each host, gloo/tcp between "
            "the ranks of the same local index; units keep one copy of their parameters per host and reduce "
            "gradients where they lie");
  tiers.tiers_shape = "2 hosts of 2 ranks";
  EXPECT_EQ(choose(tiers).reason.rfind("2 hosts of 2 ranks: cross-memory attach inside each host", 0), 0u)
      << choose(tiers).reason;
  Facts tiers_off = tiers;
  tiers_off.share_host = false;
  EXPECT_EQ(choose(tiers_off).path, Path::TIERS);
  EXPECT_FALSE(choose(tiers_off).host_shared);
  EXPECT_EQ(choose(tiers_off).reason,
            "2 hosts of 2 ranks: cross-memory attach inside each host, gloo/tcp between the ranks of the same local "
            "index; each rank keeps its own copy of the parameters (FSDP_SHARE_HOST=off)");
  Facts tiers_unmappable = tiers;
  tiers_unmappable.share_blocked = "the ranks on the host of rank 2 cannot map each other's memory";
  EXPECT_EQ(choose(tiers_unmappable).path, Path::TIERS);
  EXPECT_FALSE(choose(tiers_unmappable).host_shared);
  EXPECT_NE(choose(tiers_unmappable).reason.find("; each rank keeps its own copy of the parameters: the ranks on the "
                                                 "host of rank 2 cannot map each other's memory"),
            std::string::npos)
      << choose(tiers_unmappable).reason;
  Facts off = several_hosts();
  off.tiers = false;
  off.transport = "cma";
  EXPECT_EQ(choose(off).path, Path::TCP);
  EXPECT_EQ(choose(off).reason, off.hosts_differ + "; tiers not composed: FSDP_TIERS=off");
  EXPECT_TRUE(choose(off).refused.empty()) << "FSDP_TIERS=off is the user's own choice";

  Facts uneven = several_hosts();
  uneven.layout_blocked = "the hosts have different numbers of ranks (...)";
  EXPECT_EQ(choose(uneven).path, Path::TCP);
  EXPECT_EQ(choose(uneven).reason, uneven.hosts_differ + "; tiers not composed: " + uneven.layout_blocked);
  uneven.transport = "cma";
  EXPECT_NE(choose(uneven).refused.find("cannot compose: the hosts have different numbers"), std::string::npos);

  Facts failed = several_hosts();
  failed.tiers_blocked = "the ranks on the host of rank 2 cannot use cross-memory attach";
  EXPECT_EQ(choose(failed).path, Path::TCP);
  failed.transport = "cma";
  failed.ranks_sharing_a_host = 0;  // a replica group: one rank per host, nothing to move by CMA
  EXPECT_TRUE(choose(failed).refused.empty());
}

// The rings' pieces and the bytes per step, as the collectives and the
// planner both compute them.
TEST(CollectivePath, RingPiecesAndTrafficAreOneArithmetic) {
  using namespace fsdp;
  EXPECT_EQ(ring::pieces_for(0, 4, ring::kDefaultPieceBytes), 1);
  EXPECT_EQ(ring::pieces_for(1 << 20, 4, ring::kDefaultPieceBytes), 4);       // 4 MiB in 1 MiB pieces
  EXPECT_EQ(ring::pieces_for(1000, 4, 4096), 1);
  EXPECT_EQ(ring::pieces_for(1025, 4, 4096), 2);
  EXPECT_EQ(ring::pieces_for(3, 8, 1), 3);  // a piece is at least one element
  int64_t covered = 0;
  for (int64_t j = 0; j < 7; ++j) {
    const shard::Range r = ring::piece(100, 7, j);
    EXPECT_EQ(r.lo, covered);
    EXPECT_TRUE(r.size() == 14 || r.size() == 15) << j;
    covered = r.hi;
  }
  EXPECT_EQ(covered, 100);
  EXPECT_EQ(ring::reduce_scatter_staging_bytes(1 << 20, 4, 2, ring::kDefaultPieceBytes), 0) << "N = 2: no staging";
  EXPECT_EQ(ring::reduce_scatter_staging_bytes(1 << 20, 4, 3, ring::kDefaultPieceBytes), 4 * (1 << 20));
  EXPECT_EQ(ring::reduce_scatter_staging_bytes(1000, 4, 3, ring::kDefaultPieceBytes), 4 * 4000);

  const int64_t P = 1200;  // padded elements, fp32
  const auto full = traffic::per_step(ShardingStrategy::FULL_SHARD, P, 4, 4, 1, 4, 4);
  EXPECT_EQ(full.all_gather, 2 * 900 * 4);
  EXPECT_EQ(full.reduce_scatter, 900 * 4);
  EXPECT_EQ(full.total(), 3 * 900 * 4) << "3P (N-1)/N";
  EXPECT_EQ(traffic::per_step(ShardingStrategy::SHARD_GRAD_OP, P, 4, 4, 2, 2, 4).total(), 2 * (900 * 2 + 900 * 4));
  EXPECT_EQ(traffic::per_step(ShardingStrategy::NO_SHARD, P, 4, 4, 1, 4, 4).all_reduce, 2 * 900 * 4);
  // HYBRID over S = 2 of N = 4: 3P (S-1)/S inside, 2 (R-1)/R P/S across.
  const auto h = traffic::per_step(ShardingStrategy::HYBRID_SHARD, P, 4, 2, 1, 4, 4);
  EXPECT_EQ(h.all_gather + h.reduce_scatter, 3 * 600 * 4);
  EXPECT_EQ(h.all_reduce, 2 * 600 / 2 * 4);
  EXPECT_EQ(traffic::inter_host_part(3 * 900 * 4, 4, 2), 3 * 900 * 4 / 3);
  EXPECT_EQ(traffic::inter_host_part(100, 4, 1), 0);
}

// Compression is decided with the path: taken on the tiers and on a flat
// ring of one rank per host, and the reason says the formats; asked for
// elsewhere it is ignored, and the reason says why (nothing fails).
TEST(CollectivePath, CompressionOnlyWhereEveryByteOfARingCrossesAHost) {
  Facts tiers = several_hosts();
  tiers.tiers_shape = "2 hosts of 2 ranks";
  tiers.compress = "int4";
  auto c = choose(tiers);
  EXPECT_EQ(c.path, Path::TIERS);
  EXPECT_TRUE(c.compressed);
  EXPECT_NE(c.reason.find("; between hosts compressible collectives travel quantized (FSDP_COMPRESS=int4: parameters "
                          "int8, gradients int4 with error feedback, blocks of 256 with fp32 scales)"),
            std::string::npos)
      << c.reason;
  tiers.compress = "fp8";
  EXPECT_NE(choose(tiers).reason.find("parameters float8 e4m3, gradients int8"), std::string::npos);
  tiers.compress = "off";
  EXPECT_FALSE(choose(tiers).compressed);
  EXPECT_EQ(choose(tiers).reason.find("FSDP_COMPRESS"), std::string::npos);

  Facts flat = several_hosts();
  flat.tiers = false;
  flat.compress = "int8";
  EXPECT_EQ(choose(flat).path, Path::TCP);
  EXPECT_FALSE(choose(flat).compressed);
  EXPECT_NE(choose(flat).reason.find("FSDP_COMPRESS=int8 ignored: 4 ranks share a host with another, so the flat "
                                     "TCP ring mixes links inside and across hosts"),
            std::string::npos)
      << choose(flat).reason;
  // Hosts of unequal sizes: the flat ring, some ranks sharing a host.
  Facts uneven = several_hosts();
  uneven.ranks_sharing_a_host = 3;
  uneven.layout_blocked = "the hosts have different numbers of ranks";
  uneven.compress = "int8";
  EXPECT_EQ(choose(uneven).path, Path::TCP);
  EXPECT_FALSE(choose(uneven).compressed);
  EXPECT_NE(choose(uneven).reason.find("ignored: 3 ranks share a host"), std::string::npos) << choose(uneven).reason;

  // One rank per host (HYBRID's replica groups, FULL_SHARD with one rank a
  // host): every byte of the flat ring crosses a host, compressed whatever
  // FSDP_TIERS and FSDP_TRANSPORT say.
  Facts apart = several_hosts();
  apart.ranks_sharing_a_host = 0;
  apart.layout_blocked = "every host has one rank: nothing moves inside a host";
  apart.compress = "int4";
  for (const char* transport : {"auto", "tcp", "cma"})
    for (bool tiers_on : {true, false}) {
      apart.transport = transport;
      apart.tiers = tiers_on;
      const auto a = choose(apart);
      EXPECT_EQ(a.path, Path::TCP) << transport;
      EXPECT_TRUE(a.refused.empty()) << transport << ": " << a.refused;
      EXPECT_TRUE(a.compressed) << transport << " tiers " << tiers_on << ": " << a.reason;
      EXPECT_NE(a.reason.find("; every rank is on a host of its own, so every byte of the flat ring crosses a host: "
                              "compressible collectives travel quantized (FSDP_COMPRESS=int4: parameters int8, "
                              "gradients int4 with error feedback, blocks of 256 with fp32 scales)"),
                std::string::npos)
          << a.reason;
    }
  apart.compress = "off";
  EXPECT_FALSE(choose(apart).compressed);
  EXPECT_EQ(choose(apart).reason.find("FSDP_COMPRESS"), std::string::npos);

  Facts one;
  one.ranks = 2;
  one.compress = "int8";
  EXPECT_EQ(choose(one).path, Path::CMA);
  EXPECT_FALSE(choose(one).compressed);
  EXPECT_NE(choose(one).reason.find("FSDP_COMPRESS=int8 ignored: every rank is on one host"), std::string::npos);

  Facts tcp;
  tcp.transport = "tcp";
  tcp.compress = "int8";
  EXPECT_FALSE(choose(tcp).compressed);
  EXPECT_NE(choose(tcp).reason.find("ignored: every rank is on one host"), std::string::npos);
}

}  // namespace FSDP_TEST_ID
