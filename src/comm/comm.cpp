// fsdp-cpp: the communicator entry points (see include/fsdp/comm.h).
#include "comm/backends.h"
#include "fsdp/device.h"

#include <atomic>
#include <cstdio>

#include "fsdp/flight.h"

namespace fsdp {

const char* to_string(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::ALL_GATHER: return "all_gather";
    case CollectiveKind::REDUCE_SCATTER: return "reduce_scatter";
    case CollectiveKind::ALL_REDUCE: return "all_reduce";
    case CollectiveKind::BROADCAST: return "broadcast";
    case CollectiveKind::BARRIER: return "barrier";
    case CollectiveKind::GATHER: return "gather";
    case CollectiveKind::kCount: break;
  }
  return "unknown";
}

int64_t CommCounters::total_bytes_sent() const {
  int64_t total = 0;
  for (const auto& e : by_kind) total += e.bytes_sent;
  return total;
}

int64_t CommCounters::total_bytes_inter_host() const {
  int64_t total = 0;
  for (const auto& e : by_kind) total += e.bytes_inter_host;
  return total;
}

int64_t CommCounters::total_bytes_inter_host_logical() const {
  int64_t total = 0;
  for (const auto& e : by_kind) total += e.bytes_inter_host_logical;
  return total;
}

CommCounters& CommCounters::operator+=(const CommCounters& o) {
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    by_kind[k].calls += o.by_kind[k].calls;
    by_kind[k].bytes_sent += o.by_kind[k].bytes_sent;
    by_kind[k].bytes_inter_host += o.by_kind[k].bytes_inter_host;
    by_kind[k].bytes_inter_host_logical += o.by_kind[k].bytes_inter_host_logical;
    by_kind[k].seconds += o.by_kind[k].seconds;
  }
  return *this;
}

std::vector<int> Communicator::global_ranks() const {
  std::vector<int> out(world_size());
  for (int q = 0; q < world_size(); ++q) out[q] = q;
  return out;
}

std::vector<int> Communicator::hosts() const { return std::vector<int>(world_size(), 0); }

torch::Tensor Communicator::shared_tensor(int64_t, torch::ScalarType, const CollectiveInfo& info) {
  throw Error(detail::cat("shared_tensor", info.label.empty() ? "" : " for '" + info.label + "'", ": this communicator (",
                          describe(), ") shares no memory between its ranks. Expected: shares_host_memory() "
                          "true (ranks that can map their host's memory, FSDP_SHARE_HOST on); ask it before calling"));
}

torch::Tensor Communicator::peer_tensor(int64_t, torch::ScalarType) {
  throw Error(detail::cat("peer_tensor: this communicator (", describe(), ") shares no memory between its ranks. "
                          "Expected: shares_host_memory() true (ranks that can map their host's memory, "
                          "FSDP_SHARE_HOST on); ask it before calling"));
}

Residuals Communicator::residuals() { return {}; }

void Communicator::load_residuals(const std::map<std::string, torch::Tensor>& by_buffer) {
  if (by_buffer.empty()) return;  // none to keep, none kept
  throw Error(detail::cat("load_residuals: this communicator (", describe(), ") compresses nothing, so it keeps no "
                          "error-feedback residuals, but ", by_buffer.size(), " were given (the first '",
                          by_buffer.begin()->first, "'). Expected: a communicator whose residuals().compress is not "
                          "off (CommOptions::compress / FSDP_COMPRESS on a path that compresses), or an empty map"));
}

CommPtr Communicator::split(int color, const SplitOptions& opts) {
  FSDP_USER_CHECK(color >= 0, "Communicator::split: the color must be >= 0, found ", color,
                  " (every rank names the group it joins by a color >= 0)");
  if (world_size() > 1)
    throw Error(detail::cat("this communicator (", describe(), ") cannot be split into groups; "
                            "use one made by fsdp::make_communicator_from_env()"));
  comm::ResolvedOptions o;  // a group of one needs only its timeout
  o.timeout = opts.timeout.count() > 0 ? opts.timeout : timeout();
  return comm::make_world_of_one(o, global_ranks().front(), opts.name);
}

// The counting allocator and SIGPIPE are fsdp::init's (init.h), not a side
// effect of the first communicator.
// The environment is parsed here, once (fsdp/config.h), and what it
// says travels down as WorldEnv and ResolvedOptions.
// Each rank's log starts with which launcher placed it and from which
// variables (once per process, before the rendezvous can fail or hang).
CommPtr make_communicator_from_env(const CommOptions& opts) {
  const config::EnvConfig env = config::read_env();
  static std::atomic<bool> said{false};
  if (!env.launcher.empty() && !said.exchange(true)) std::fprintf(stderr, "fsdp: %s\n", env.launch.c_str());
  comm::WorldEnv world = comm::world_of(env);
  comm::ResolvedOptions resolved = comm::resolve_options(opts, env);
  flight::apply_env(env);
  detail::set_rank_for_errors(world.rank);
  if (resolved.device_index < 0) resolved.device_index = world.local_rank;
  // The one place the backend is chosen. NCCL needs its GPU even alone, and
  // is NCCL even alone: a one-rank ProcessGroupNCCL, so a run at N = 1
  // exercises the same path as N = 8 (a world of one on Gloo is a copy).
  if (resolved.backend == CommBackend::NCCL) {
    const c10::Device gpu(c10::kCUDA, static_cast<c10::DeviceIndex>(resolved.device_index));
    require_device(gpu, "CommOptions::backend = NCCL (or FSDP_BACKEND=nccl) on this rank's GPU");
    return comm::stage_away_from(comm::make_nccl_communicator(world, resolved), gpu, /*alone_too=*/true);
  }
  if (world.world_size == 1) return comm::make_world_of_one(resolved);
  return comm::stage_away_from(comm::make_gloo_communicator(world, resolved), c10::kCPU);
}

const char* to_string(CommBackend b) { return b == CommBackend::NCCL ? "nccl" : "gloo"; }

const char* to_string(Compression c) {
  switch (c) {
    case Compression::OFF: return "off";
    case Compression::INT8: return "int8";
    case Compression::INT4: return "int4";
    case Compression::FP8: return "fp8";
  }
  return "?";
}

CommPtr make_local_communicator(const CommOptions& opts) {
  return comm::make_world_of_one(comm::resolve_options(opts, config::read_env()));
}

double all_reduce_mean(Communicator& comm, double value, const CollectiveInfo& info) {
  if (comm.world_size() == 1) return value;
  auto t = torch::tensor({value}, torch::kFloat64);
  comm.all_reduce(t, ReduceOp::AVG, info)->wait();
  return t.item<double>();
}

}  // namespace fsdp
