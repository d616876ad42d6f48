// fsdp-cpp: the communicator entry points (see include/fsdp/comm.h).
#include <csignal>

#include "comm/backends.h"
#include "fsdp/memory.h"

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

CommPtr make_communicator_from_env(const CommOptions& opts) {
  // Before any tensor exists, so the ledger counts every byte of the run.
  memory::install();
  comm::WorldEnv world = comm::read_world_env();
  comm::ResolvedOptions resolved = comm::resolve_options(opts);
  if (world.world_size == 1) return comm::make_world_of_one(resolved);
  // A peer that dies makes our next socket write raise SIGPIPE, which would
  // kill this rank silently instead of failing the collective with a message.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  return comm::make_gloo_communicator(world, resolved);
}

CommPtr make_local_communicator(const CommOptions& opts) {
  memory::install();
  return comm::make_world_of_one(comm::resolve_options(opts));
}

}  // namespace fsdp
