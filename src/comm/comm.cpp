// fsdp-cpp: the communicator entry points (see include/fsdp/comm.h).
#include "comm/backends.h"

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

// The counting allocator and SIGPIPE are fsdp::init's (init.h), not a side
// effect of the first communicator.
CommPtr make_communicator_from_env(const CommOptions& opts) {
  comm::WorldEnv world = comm::read_world_env();
  comm::ResolvedOptions resolved = comm::resolve_options(opts);
  if (world.world_size == 1) return comm::make_world_of_one(resolved);
  return comm::make_gloo_communicator(world, resolved);
}

CommPtr make_local_communicator(const CommOptions& opts) { return comm::make_world_of_one(comm::resolve_options(opts)); }

double all_reduce_mean(Communicator& comm, double value, const CollectiveInfo& info) {
  if (comm.world_size() == 1) return value;
  auto t = torch::tensor({value}, torch::kFloat64);
  comm.all_reduce(t, ReduceOp::AVG, info)->wait();
  return t.item<double>();
}

}  // namespace fsdp
