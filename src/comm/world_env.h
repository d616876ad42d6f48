// fsdp-cpp: where this process sits in the world, read from the environment.
// defines: WorldEnv, read_world_env, resolve_options, ResolvedOptions
//
// torchrun's conventions (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), as `fsdp run` sets them, plus the fsdp knobs:
//   FSDP_TIMEOUT             seconds before a collective fails (default 60)
//   FSDP_RENDEZVOUS_TIMEOUT  seconds to wait for every rank to join (default 60)
//   GLOO_SOCKET_IFNAME       network interface for the Gloo device
//   FSDP_DEBUG               "off" (default) or "detail": check before each
//                            collective that every rank issues the same call
//   FSDP_JOB_TOKEN           secret shared by the ranks of one job (set by
//                            `fsdp run`); store keys live under it
//   FSDP_TRANSPORT           auto (default), tcp or cma: how ranks on one host
//                            move collective bytes (docs/COMM.md)
//   FSDP_TIERS               on (default) or off: across hosts, compose CMA
//                            inside each host with TCP between (comm/tiers.h)
#pragma once

#include <chrono>
#include <string>

#include "fsdp/comm.h"

namespace fsdp::comm {

struct WorldEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool from_env = false;  // RANK and WORLD_SIZE were both set
};

// Throws fsdp::Error naming the variable, its value and what is expected.
WorldEnv read_world_env();

struct ResolvedOptions {
  std::chrono::milliseconds timeout;             // per collective
  std::chrono::milliseconds rendezvous_timeout;  // joining, connecting
  std::string ifname;
  bool debug_detail = false;  // FSDP_DEBUG=detail
  bool debug_info = false;    // FSDP_DEBUG=info or detail: one line per choice made
  std::string transport = "auto";  // FSDP_TRANSPORT: auto, tcp or cma
  bool tiers = true;          // FSDP_TIERS: compose tiers across hosts
  std::string job_token;      // FSDP_JOB_TOKEN, "" when unset
};
ResolvedOptions resolve_options(const CommOptions& opts);

}  // namespace fsdp::comm
