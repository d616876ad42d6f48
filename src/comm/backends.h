// fsdp-cpp: the communicator implementations behind fsdp/comm.h.
// defines: make_gloo_communicator, make_world_of_one, make_nccl_communicator,
//          stage_away_from
#pragma once

#include "comm/world_env.h"
#include "fsdp/comm.h"

namespace fsdp::comm {

// WORLD_SIZE >= 2: rendezvous, then collectives on Gloo over TCP.
CommPtr make_gloo_communicator(const WorldEnv& world, const ResolvedOptions& opts);

// A world of one: no rendezvous, every collective is a local copy. A group
// of one (Communicator::split) names its global rank and group.
CommPtr make_world_of_one(const ResolvedOptions& opts, int global_rank = 0, const std::string& group = "");

// NCCL on this rank's GPU (device.h loads the CUDA plugin), at any world
// size: a world of one is a one-rank ProcessGroupNCCL.
CommPtr make_nccl_communicator(const WorldEnv& world, const ResolvedOptions& opts);

// `inner` behind a communicator that also takes tensors away from `home`
// (the device its backend moves), staged through home buffers (staged.cpp).
// A world of one is returned as it is (make_world_of_one's moves any one
// device's tensors), unless `alone_too` (NCCL's world of one moves only its
// GPU's).
CommPtr stage_away_from(CommPtr inner, c10::Device home, bool alone_too = false);

}  // namespace fsdp::comm
