// fsdp-cpp: checkpoints of a wrapped model — the engine side of src/checkpoint.
//
// defines: CheckpointOptions, save_checkpoint, load_checkpoint, save_full, load_full,
//          model_slices, optimizer_slices
//
// Sharded checkpoints (for training): every rank writes its own shards of the
// parameters and of the optimizer state; they load at any world size and
// strategy (reshard N -> M), all or nothing. Full checkpoints (for inference
// and other tools): one safetensors file in the unwrapped model's names,
// gathered to rank 0 unit by unit.
#pragma once

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint.h"
#include "fsdp/fully_shard.h"

namespace fsdp {

struct CheckpointOptions {
  int keep_last = 0;  // 0: keep every checkpoint
  bool fsync = true;
};

// Collective. Writes root/step-<step> and moves root/latest to it. The
// optimizer (may be null) must be built on model.parameters(); AdamW, Adam
// and SGD state is saved per original parameter (exp_avg, exp_avg_sq, step;
// momentum_buffer). `train_state` is stored as given (step, data position,
// RNG state...).
ckpt::SaveResult save_checkpoint(FullyShardedModel& model, const torch::optim::Optimizer* opt,
                                 const std::string& root, int64_t step, const nlohmann::json& train_state,
                                 const CheckpointOptions& opts = {});

// Collective. `path_or_root`: a checkpoint directory or a root with `latest`.
// Returns found=false (and changes nothing) when the root holds no checkpoint
// yet. On any error every rank throws fsdp::Error and neither the model nor
// the optimizer changed.
ckpt::LoadResult load_checkpoint(FullyShardedModel& model, torch::optim::Optimizer* opt,
                                 const std::string& path_or_root, const ckpt::LoadOptions& lopts = {});

// Collective: rank 0 writes one safetensors file with every parameter and
// buffer under the unwrapped model's names (fp32 parameters), streaming unit
// by unit.
void save_full(const FullyShardedModel& model, const std::string& path);

// Collective: initialises the model from a full safetensors file (ours, or
// written from a PyTorch state dict); each rank reads only its shards' bytes.
void load_full(FullyShardedModel& model, const std::string& path, const ckpt::LoadOptions& lopts = {});

// The slices behind the two calls above (for tools and tests).
std::vector<ckpt::Slice> model_slices(const FullyShardedModel& model);

}  // namespace fsdp
