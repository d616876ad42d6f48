// fsdp-cpp: failing together — every rank learns which ranks failed a step,
// so a failure on one rank throws on all of them and none waits forever in
// the next collective.
// defines: comm::fail_together, comm::fail_together_sharing
//
// Used wherever a step may fail on some ranks only (a file rank 0 cannot
// write, a checkpoint a rank cannot read): the engine's full-state files
// (src/state/state_dict.cpp, hf_*.cpp) and the sharded checkpoints
// (src/checkpoint/). The comm layer offers this header to those layers
// (cmake/layers.cmake, EXPORTS); it is not installed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/comm.h"

namespace fsdp::comm {

// Collective (one all_reduce of a flag per rank, so also a barrier; `info`
// labels it in errors and traces). When no rank failed, returns. Otherwise
// every rank throws fsdp::Error: a rank that failed throws `local_error`
// (its own message), the others throw `others_failed(failed_ranks)`.
// `local_error` empty means this rank succeeded.
void fail_together(Communicator& comm, const std::string& local_error, const CollectiveInfo& info,
                   const std::function<std::string(const std::vector<int>& failed_ranks)>& others_failed);

// fail_together, whose one all_reduce also carries each rank's `words` (the
// same number of them on every rank, or the collective does not match):
// when no rank failed, returns every rank's words, by rank. The ranks
// compare them to learn whether they saw the same thing (load_hf: the
// digests of the files each read) without a second collective.
std::vector<std::vector<uint32_t>> fail_together_sharing(
    Communicator& comm, const std::string& local_error, const std::vector<uint32_t>& words,
    const CollectiveInfo& info, const std::function<std::string(const std::vector<int>& failed_ranks)>& others_failed);

}  // namespace fsdp::comm
