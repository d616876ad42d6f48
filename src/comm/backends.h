// fsdp-cpp: the communicator implementations behind fsdp/comm.h.
// defines: make_gloo_communicator, make_world_of_one
#pragma once

#include "comm/world_env.h"
#include "fsdp/comm.h"

namespace fsdp::comm {

// WORLD_SIZE >= 2: rendezvous, then collectives on Gloo over TCP.
CommPtr make_gloo_communicator(const WorldEnv& world, const ResolvedOptions& opts);

// A world of one: no rendezvous, every collective is a local copy. A group
// of one (Communicator::split) names its global rank and group.
CommPtr make_world_of_one(const ResolvedOptions& opts, int global_rank = 0, const std::string& group = "");

}  // namespace fsdp::comm
