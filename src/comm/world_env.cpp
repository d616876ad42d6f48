// fsdp-cpp: the world and the communicator's settings (see world_env.h).
#include "comm/world_env.h"

#include <algorithm>

#include "fsdp/errors.h"

namespace fsdp::comm {

WorldEnv world_of(const config::EnvConfig& env) {
  WorldEnv w;
  w.rank = env.rank;
  w.world_size = env.world_size;
  w.local_rank = env.local_rank;
  w.local_world_size = env.local_world_size;
  w.master_addr = env.master_addr;
  w.master_port = env.master_port;
  w.from_env = env.world_from_env;
  return w;
}

ResolvedOptions resolve_options(const CommOptions& opts, const config::EnvConfig& env) {
  using std::chrono::milliseconds;
  ResolvedOptions r;
  FSDP_USER_CHECK(opts.timeout.count() > 0, "CommOptions::timeout must be positive, found ", opts.timeout.count(),
                  " ms");
  r.timeout = env.timeout_ms ? milliseconds(*env.timeout_ms) : opts.timeout;
  if (env.rendezvous_timeout_ms) r.rendezvous_timeout = milliseconds(*env.rendezvous_timeout_ms);
  r.ifname = env.ifname.empty() ? opts.ifname : env.ifname;
  r.debug_detail = env.debug_detail;
  r.debug_info = env.debug_info;
  r.transport = env.transport;
  r.tiers = env.tiers;
  r.share_host = env.share_host ? *env.share_host : opts.share_host_memory;
  r.compress = env.compress == "off"    ? Compression::OFF
               : env.compress == "int8" ? Compression::INT8
               : env.compress == "int4" ? Compression::INT4
               : env.compress == "fp8"  ? Compression::FP8
                                        : opts.compress;
  r.error_feedback = env.compress_feedback ? *env.compress_feedback : opts.error_feedback;
  r.backend = env.backend == "nccl" ? CommBackend::NCCL : env.backend == "gloo" ? CommBackend::GLOO : opts.backend;
  FSDP_USER_CHECK(opts.device_index >= -1, "CommOptions::device_index must be -1 (LOCAL_RANK) or a CUDA device, found ",
                  opts.device_index);
  r.device_index = opts.device_index;
  r.job_token = env.job_token;
  r.host_id = env.host_id;
  r.store_bind_all = env.store_bind_all;
  r.store_hosted = env.store_hosted;

  FSDP_USER_CHECK(opts.ring_piece_bytes == 0 || (opts.ring_piece_bytes >= config::kMinRingPieceBytes &&
                                                  opts.ring_piece_bytes <= config::kMaxRingPieceBytes),
                  "CommOptions::ring_piece_bytes must be 0 (the default, ", ring::kDefaultPieceBytes,
                  " bytes) or in [", config::kMinRingPieceBytes, ", ", config::kMaxRingPieceBytes, "], found ",
                  opts.ring_piece_bytes);
  r.ring_piece_bytes = env.ring_piece_bytes   ? *env.ring_piece_bytes
                       : opts.ring_piece_bytes ? opts.ring_piece_bytes
                                               : ring::kDefaultPieceBytes;

  const int64_t hb = opts.heartbeat_interval.count();
  FSDP_USER_CHECK(hb == 0 || (hb >= config::kMinHeartbeatMs && hb <= config::kMaxHeartbeatMs),
                  "CommOptions::heartbeat_interval must be 0 (the default: the timeout / 5, between 50 ms and 1 s) "
                  "or in [", config::kMinHeartbeatMs, ", ", config::kMaxHeartbeatMs, "] ms, found ", hb, " ms");
  // A fifth of the timeout, so a silent rank is noticed well before its
  // collective would time out; never busier than 20 a second.
  const int64_t derived = std::clamp<int64_t>(r.timeout.count() / 5, 50, 1000);
  r.heartbeat_interval = milliseconds(env.heartbeat_interval_ms ? *env.heartbeat_interval_ms : hb ? hb : derived);
  return r;
}

}  // namespace fsdp::comm
