// fsdp-cpp: which path a communicator's collectives take, decided in one
// place and torch-free.
// defines: path::Path, path::words, path::Facts, path::Choice, path::choose, path::compression_words,
//          path::UnitSharing, path::host_shared_unit, path::grads_in_peer_memory
//
// The communicator (src/comm/gloo_communicator.cpp) gathers the facts: the
// settings (FSDP_TRANSPORT, FSDP_TIERS), every rank's host (exchanged), what
// the cross-memory-attach probe found, whether the hosts' layout composes
// tiers, and whether connecting them worked; it asks choose() and moves
// bytes the way the answer says. The planner (src/plan/tier_traffic.cpp) asks the
// same function with the facts it assumes (hosts of equal size, memory
// readable inside a host), so the path it prints is the one a run takes.
// FSDP_DEBUG=info prints the choice and its reason; the trace keeps them
// (metadata "collective_path").
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/strategy.h"

namespace fsdp::path {

enum class Path {
  TCP,    // Gloo over TCP: the flat ring (ring.h)
  CMA,    // cross-memory attach between the ranks of one host (cma.h)
  TIERS,  // CMA inside each host, TCP between the ranks of the same local index (tiers.h)
};

// For messages: "gloo/tcp", "cma (cross-memory attach)", "tiers (...)".
const char* words(Path p);

// What is known when the path is chosen. Probes not run yet read "" (fine).
struct Facts {
  std::string transport = "auto";  // FSDP_TRANSPORT: auto, tcp or cma
  bool tiers = true;               // FSDP_TIERS
  int ranks = 1;
  // "" when every rank is on one host; else why not (names two ranks on two hosts).
  std::string hosts_differ;
  // One host: why its ranks cannot read each other's memory ("" they can).
  std::string cma_blocked;
  // Several hosts: how many ranks share a host with another (0: one rank per host).
  int ranks_sharing_a_host = 0;
  // Several hosts: why the layout does not compose tiers ("" it does).
  std::string layout_blocked;
  // Several hosts: why connecting the tiers failed ("" it did not, or not tried).
  std::string tiers_blocked;
  // Several hosts, the tiers connected: "2 hosts of 3 ranks" ("" not yet).
  std::string tiers_shape;
  // FSDP_SHARE_HOST / CommOptions::share_host_memory.
  bool share_host = true;
  // One host, or each host of the tiers: why its ranks cannot map each
  // other's memory ("" they can, or not probed yet).
  std::string share_blocked;
  // FSDP_COMPRESS / CommOptions::compress: "off", "int8", "int4" or "fp8".
  std::string compress = "off";
};

struct Choice {
  Path path = Path::TCP;
  std::string reason;  // why this path (FSDP_DEBUG=info prints it)
  // FSDP_TRANSPORT=cma cannot be honoured: why (the caller's message reads
  // "FSDP_TRANSPORT=cma<where>, but <refused>. Use ..."); "" otherwise.
  std::string refused;
  // CMA, and TIERS inside each host: the ranks of a host also map each
  // other's memory, so units keep one copy of their parameters per host and
  // reduce gradients where they lie (comm/host_shared.h;
  // Communicator::shares_host_memory).
  bool host_shared = false;
  // TIERS, or TCP across hosts with one rank per host, with compression on:
  // compressible all-gathers, reduce-scatters and all-reduces cross hosts
  // quantized (comm/quantized.h; docs/COMM.md "Quantized formats"). The
  // reason then says the formats; compression asked for on another path is
  // ignored, and the reason says why.
  bool compressed = false;
};

// The one decision:
//   FSDP_TRANSPORT=tcp                              -> TCP
//   one host, memory readable                       -> CMA (host-shared: FSDP_SHARE_HOST
//                                                      on and memory mappable)
//   one host, not readable                          -> TCP (cma: refused)
//   several hosts, FSDP_TIERS=off                   -> TCP
//   several hosts, the layout composes and connects -> TIERS (host-shared inside
//                                                      each host: as on one host)
//   several hosts, otherwise                        -> TCP (cma with ranks
//                                                      sharing a host: refused)
// and, with compression asked for, compressed on TIERS (the inter-host tier
// is one TCP ring per local index, the bytes that cross the slow link and
// nothing else) and on TCP across hosts when no two ranks share a host
// (ranks_sharing_a_host == 0, whatever FSDP_TRANSPORT and FSDP_TIERS say:
// every byte of that ring crosses a host). On one host nothing crosses a
// host; a flat ring with ranks sharing a host mixes links inside and across
// hosts and is not compressed (the reason says so; nothing fails).
Choice choose(const Facts& f);

// The words of one compression for the reason and messages: "parameters
// int8, gradients int4 (error feedback), blocks of 256 with fp32 scales".
std::string compression_words(const std::string& compress);

// What decides whether one unit keeps its parameters once per host.
struct UnitSharing {
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  bool on_cpu = true;        // its tensors live in host memory (FsdpOptions::device)
  int64_t numel = 0;         // its parameters
  int ranks = 1;             // the ranks it is sharded over (HYBRID: the shard group's)
  bool host_memory = false;  // they map each other's memory: Communicator::shares_host_memory
                             // in a run, Choice::host_shared on the facts a plan assumes
};
// The one rule, asked by the layout (src/unit/layout.cpp, Unit::host_shared)
// and by the planner (src/plan/plan.cpp): a unit whose parameters are
// sharded, in host memory, not empty, over ranks that map each other's
// memory keeps one copy of them per host that every rank maps (docs/COMM.md
// "Host-shared units"). NO_SHARD keeps a whole replica on every rank instead.
constexpr bool host_shared_unit(const UnitSharing& u) {
  return u.strategy != ShardingStrategy::NO_SHARD && u.on_cpu && u.numel > 0 && u.ranks > 1 && u.host_memory;
}

// Where a host-shared unit's backward writes its gradients, asked by the
// unit (src/unit/layout.cpp, Unit::grads_in_peer_memory) and the planner:
// straight into the rank's peer memory, where the reduce sums them, when
// they need no cast on the way (reduced in the parameter dtype); otherwise
// in the allocator's memory, and the cast writes the peer block.
constexpr bool grads_in_peer_memory(bool host_shared, bool reduce_in_param_dtype) {
  return host_shared && reduce_in_param_dtype;
}

}  // namespace fsdp::path
