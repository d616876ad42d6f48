// fsdp-cpp: where this process sits in the world, and the communicator's
// settings, from the one parsed environment (fsdp/config.h) and the
// program's CommOptions.
// defines: WorldEnv, world_of, resolve_options, ResolvedOptions
//
// The environment is parsed once per communicator made from it
// (make_communicator_from_env); groups split from a communicator inherit
// its ResolvedOptions and never read the environment again.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "fsdp/config.h"
#include "common/ring_math.h"
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

// The world the environment describes (torchrun's conventions).
WorldEnv world_of(const config::EnvConfig& env);

struct ResolvedOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};             // per collective
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(60)};  // joining, connecting
  std::string ifname;
  bool debug_detail = false;  // FSDP_DEBUG=detail
  bool debug_info = false;    // FSDP_DEBUG=info or detail: one line per choice made
  std::string transport = "auto";  // FSDP_TRANSPORT: auto, tcp or cma
  CommBackend backend = CommBackend::GLOO;  // CommOptions::backend, or FSDP_BACKEND
  int device_index = 0;       // NCCL: CommOptions::device_index, -1 resolved to LOCAL_RANK
  bool tiers = true;          // FSDP_TIERS: compose tiers across hosts
  bool share_host = true;     // CommOptions::share_host_memory, or FSDP_SHARE_HOST
  Compression compress = Compression::OFF;  // CommOptions::compress, or FSDP_COMPRESS
  bool error_feedback = true;  // CommOptions::error_feedback, or FSDP_COMPRESS_FEEDBACK
  std::string job_token;      // FSDP_JOB_TOKEN, "" when unset
  std::string host_id;        // FSDP_HOST_ID, "" when unset (cma.h, host_identity)
  bool store_bind_all = false;  // FSDP_STORE_BIND=all
  bool store_hosted = false;    // FSDP_STORE_HOSTED=1: the launcher hosts the store
  int64_t ring_piece_bytes = ring::kDefaultPieceBytes;  // the rings' piece target
  std::chrono::milliseconds heartbeat_interval{1000};
};

// The program's options with the environment's overrides applied; throws
// fsdp::Error for an option out of range (naming the option).
ResolvedOptions resolve_options(const CommOptions& opts, const config::EnvConfig& env);

}  // namespace fsdp::comm
