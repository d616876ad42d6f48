// fsdp-cpp: checkpoints of a wrapped model — the engine side of src/checkpoint.
//
// defines: CheckpointOptions, save_checkpoint, prepare_background_saves, wait_for_snapshot, wait_for_checkpoint,
//          load_checkpoint,
//          save_full, load_full, save_full_optim, load_full_optim, model_slices
//
// Sharded checkpoints (for training): every rank writes its own shards of the
// parameters and of the optimizer state; they load at any world size and
// strategy (reshard N -> M), all or nothing. Full checkpoints (for inference
// and other tools): one safetensors file in the unwrapped model's names,
// gathered to rank 0 unit by unit.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>

#include "fsdp/checkpoint.h"
#include "fsdp/fully_shard.h"

namespace fsdp {

// How save_checkpoint keeps and syncs checkpoints.
struct CheckpointOptions {
  int keep_last = 0;  // 0: keep every checkpoint
  // fsync files and directories, so a crash leaves the last checkpoint
  // whole; off only in tests of speed.
  bool fsync = true;
  // Save in the background (as PyTorch DCP's async_save): the call copies
  // this rank's shards of the parameters and of the optimizer state, and
  // `train_state`, into memory (the snapshot, the ledger's term C) and
  // returns; a thread writes, checksums and commits them exactly as a
  // synchronous save does, over a communicator of its own (split from the
  // model's at the first such save). The model's next save_checkpoint or
  // load_checkpoint, wait_for_checkpoint and the model's destruction wait
  // for it first.
  bool async = false;
  // With async: the snapshot is copied by the save's thread, first, so the
  // call returns without copying; the model waits for the copy at the end
  // of the next backward (before an optimizer step can change a shard), in
  // its next save or load, and in wait_for_snapshot. Parameters or optimizer
  // state changed in place before then (not through backward and the
  // optimizer's step) fail that save on every rank, naming the tensor.
  // false: the call copies before it returns (on a device, it always does).
  bool snapshot_on_thread = true;
  // Each rank writes at most this many bytes per second (0: no limit).
  int64_t max_write_bytes_per_second = 0;
  // How rank 0 shows a save's progress (ckpt::SaveOptions::progress): e.g.
  // enabled = false for a program's --no-progress.
  ProgressOptions progress;
};

// Collective. Writes root/step-<step> and moves root/latest to it (with
// opts.async, in the background: the call returns once the snapshot is
// taken, with in_background set and `seconds` the time it blocked). The
// optimizer (may be null) must be built on model.parameters(); the state of
// SGD, Adam, AdamW (fsdp::FusedAdamW too), Adagrad and RMSprop is saved per
// original parameter (their state tensors, e.g. exp_avg and exp_avg_sq, and
// the step); any other optimizer (LBFGS: one state for all parameters) is
// refused before anything is written. `train_state` is stored as given (step,
// data position, RNG state...), with "optimizer" and, when a communicator
// compresses (CommOptions::compress), "error_feedback" added. Each rank's
// error-feedback residuals (Communicator::residuals of the model's
// communicators) are saved as its own (docs/CHECKPOINT_FORMAT.md,
// "Per-rank tensors"); a background save's snapshot holds them too.
ckpt::SaveResult save_checkpoint(FullyShardedModel& model, const torch::optim::Optimizer* opt,
                                 const std::string& root, int64_t step, const nlohmann::json& train_state,
                                 const CheckpointOptions& opts = {});

// Collective: makes the communicator background saves run over now (a
// split of the model's: a rendezvous and connections), and touches once
// the memory of a snapshot (this rank's slices and, with `opt`, its state
// fields), which the allocator then keeps for the first snapshot, so that
// the first save with CheckpointOptions::async blocks no longer than the
// others (later ones reuse the last snapshot's freed blocks). Optional:
// that save pays for both otherwise.
void prepare_background_saves(FullyShardedModel& model, const torch::optim::Optimizer* opt = nullptr);

// Returns once the snapshot of the model's background save is copied (at
// once when there is none, or it was copied in the call): from then on
// parameters and optimizer state may change. The end of a backward calls
// it; call it yourself before changing them any other way.
void wait_for_snapshot(FullyShardedModel& model);

// Waits for the model's background save (CheckpointOptions::async) and
// returns what it wrote: its SaveResult (seconds: the write's own), or
// nothing when no background save was started since the last wait.
// Rethrows its error (fsdp::Error naming the checkpoint; the previous one is
// intact). Every rank's save fails or succeeds together.
std::optional<ckpt::SaveResult> wait_for_checkpoint(FullyShardedModel& model);

// Collective. `path_or_root`: a checkpoint directory or a root with `latest`.
// Returns found=false (and changes nothing) when the root holds no checkpoint
// yet. On any error every rank throws fsdp::Error and neither the model nor
// the optimizer changed. Error feedback's residuals come back to each rank
// bit for bit at the same world size, strategy, compression and units (a
// compressed run resumes exactly); otherwise they start at zero and
// LoadResult::note says why (rank 0 prints it on stderr): the load itself
// never fails for them.
ckpt::LoadResult load_checkpoint(FullyShardedModel& model, torch::optim::Optimizer* opt,
                                 const std::string& path_or_root, const ckpt::LoadOptions& lopts = {});

// Collective: rank 0 writes one safetensors file with every parameter and
// buffer under the unwrapped model's names (fp32 parameters), streaming unit
// by unit. Each unit is gathered to rank 0 alone (Communicator::gather), so
// rank 0 holds at most one unsharded unit beside its shards and the other
// ranks hold nothing beyond their shards. `progress`: how rank 0 shows the
// write's progress (as ckpt::SaveOptions::progress).
void save_full(const FullyShardedModel& model, const std::string& path, const ProgressOptions& progress = {});

// Collective: the optimizer's state consolidated by parameter name, written
// by rank 0 as one safetensors file streamed unit by unit like save_full:
// "<param>.exp_avg", "<param>.exp_avg_sq" (+ "max_exp_avg_sq" with amsgrad)
// for Adam/AdamW, "<param>.momentum_buffer" for SGD, each in the parameter's
// full shape (fp32), and "<param>.step" (int64 scalar). The header metadata
// says {"format": "fsdp-optim", "optimizer": "adamw", "param_groups": [...]}
// (hyper-parameters and the names of each group's parameters). Parameters
// the optimizer has not stepped yet are written as zeros with step 0.
void save_full_optim(const FullyShardedModel& model, const torch::optim::Optimizer& opt, const std::string& path);

// Collective: restores the optimizer's state from a save_full_optim file, at
// any world size and strategy; each rank reads only its shards' bytes. The
// optimizer type must match; hyper-parameters (lr, betas...) are left as the
// optimizer was built. All or nothing: on any error every rank throws and
// the optimizer is unchanged.
void load_full_optim(FullyShardedModel& model, torch::optim::Optimizer& opt, const std::string& path,
                     const ckpt::LoadOptions& lopts = {});

// Collective: initialises the model from a full safetensors file (ours, or
// written from a PyTorch state dict); each rank reads only its shards' bytes
// (returned: the tensor bytes this rank read). Works on a model built under
// fsdp::DeferredInit: the shards get their values without any rank holding
// the whole model. All or nothing, like load_checkpoint.
int64_t load_full(FullyShardedModel& model, const std::string& path, const ckpt::LoadOptions& lopts = {});

// The slices behind the two calls above (for tools and tests).
std::vector<ckpt::Slice> model_slices(const FullyShardedModel& model);

}  // namespace fsdp
