// fsdp-cpp: the engine's stage for replica groups' mean across groups.
// defines: AcrossFn, average_across
//
// Replica groups (fsdp/replicas.h, src/replicas) average each unit's
// reduced gradient shard across the step's groups while backward goes on,
// as HYBRID_SHARD's all-reduce across replicas does (unit/hybrid.cpp,
// Engine::issue_stages). This is all the engine offers them.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"

namespace fsdp::detail {

// Called with a unit's reduced shard (after HYBRID's all-reduce, when any)
// and the unit's name, once per unit and backward, in the same order on
// every group; averages it in place and returns its work. The work's wait()
// must not throw: a failure is the step's vote, not backward's error.
using AcrossFn = std::function<WorkPtr(const torch::Tensor& output, const std::string& unit)>;

// From now on every reduce of `m` goes on to `f`; an empty `f`: none. Not
// while reductions are in flight (call it before forward and after
// FullyShardedModel::wait_pending()).
void average_across(FullyShardedModel& m, AcrossFn f);

}  // namespace fsdp::detail
