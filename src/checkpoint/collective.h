// fsdp-cpp checkpoints: failing together, and the per-rank steps of a save
// that offline tools run for every rank in one process.
// defines: fail_together_at, check_slices, per_rank_slices, write_rank_shard, commit_checkpoint,
//          prune_checkpoints, save_sharded_checked
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/metadata.h"
#include "fsdp/checkpoint.h"

namespace fsdp::ckpt::detail {

// The checkpoint wording of comm::fail_together (src/comm/fail_together.h): when any rank
// reported an error every rank throws fsdp::Error: its own message, or one
// naming the failed ranks and `consequence` ("nothing was loaded").
void fail_together_at(Communicator& comm, const char* phase, const std::string& local_error, const std::string& consequence);

// User-error checks of slices before anything happens (throws fsdp::Error).
// `for_load`: data is a destination that must match the slice.
void check_slices(const char* section, const std::vector<Slice>& slices, bool for_load);

// This rank's per_rank tensors (save_sharded) as slices of the section
// kPerRank: "rank-RRRRR/<name>", 1-D, held whole.
std::vector<Slice> per_rank_slices(int rank, const std::map<std::string, torch::Tensor>& per_rank);

// Writes dir/rank-r-of-w.safetensors holding the non-empty entries (in
// order; write_entry(i, writer) writes entry i's hi-lo elements) and the
// rank's index dir/rank-r.index.json, both fsynced. Returns the index.
RankIndex write_rank_shard(const std::string& dir, int rank, int world, std::vector<RankIndex::Entry> entries,
                           const std::function<void(size_t, SafetensorsWriter&)>& write_entry, bool fsync);

// Rank 0's part once every rank's shard is durable in tmp_dir: merge the
// indexes into metadata.json, rename tmp_dir to root/step-N, update `latest`,
// prune beyond keep_last. Each step leaves a loadable state if killed.
std::string commit_checkpoint(const std::string& root, const std::string& tmp_dir, int world, int64_t step,
                              const std::string& strategy, const nlohmann::json& train_state, int keep_last,
                              bool fsync);

// save_sharded with a check of the caller's, asked on this rank right before
// the agreement that ends preparing and again before the one that ends
// writing: a non-empty answer is this rank's error there, so every rank
// fails and nothing is committed (BackgroundSave: its snapshot was changed
// while it was copied). `per_rank`: per_rank_slices' slices.
SaveResult save_sharded_checked(Communicator& comm, const std::string& root, int64_t step,
                                const std::vector<Slice>& model, const std::vector<Slice>& optim,
                                const std::vector<Slice>& per_rank, const nlohmann::json& train_state,
                                const SaveOptions& opts, const std::function<std::string()>& check);

}  // namespace fsdp::ckpt::detail
