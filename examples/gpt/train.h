// GPT-mini's trainer (train.cpp), the flags it runs with (gpt.cpp parses them;
// main.cpp is the program).
// defines: gpt::Args, gpt::train, gpt::run
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpt/model.h"
#include "step_hooks.h"

namespace gpt {

// Flags. Defaults: the docs/GPT_MINI.md model size, training settings that suit it.
struct Args {
  // data
  std::string data, val;           // token files (.bin)
  std::vector<std::string> text;   // or text files, split 90/10 on the fly
  std::string shuffle = "off";     // off: the deterministic order of docs/GPT_MINI.md
  std::string attention = "matmul";  // matmul | sdpa: gpt::Config::sdpa
  // model
  gpt::Config cfg;
  std::string init;                // FILE.safetensors to start from
  std::string construct = "sharded";  // sharded (fsdp::DeferredInit) | eager
  // training
  int64_t batch = 8;               // rows per micro-batch per rank
  int64_t accum = 1;               // micro-steps per optimizer step
  // Rows per optimizer step over all ranks (0: batch x accum x world size).
  // Set: accum = global_batch / (batch x world size), chosen at start-up, so
  // a run resumed at another world size (fsdp run --nnodes MIN:MAX) trains
  // the same rows per step.
  int64_t global_batch = 0;
  int64_t steps = 300;
  double lr = 1e-3, min_lr = -1;   // min_lr < 0: lr / 10
  int64_t warmup = 20;
  double weight_decay = 0.1, clip = 1.0;
  std::string strategy = "full", wrap = "block", dtype = "fp32";
  int shard_group = 0;             // hybrid: ranks per shard group; 0: the ranks of one host
  uint64_t seed = 1337;
  int threads = 0;                 // 0: cores / ranks on this host
  std::string device = "cpu";      // cpu | cuda (cuda:LOCAL_RANK) | cuda:K: FsdpOptions::device
  std::string backend = "auto";    // auto | gloo | nccl: CommOptions::backend (auto: nccl on a GPU per rank)
  // reporting
  int64_t log_every = 10, eval_every = 50, eval_batches = 8;
  int64_t sample = 0;              // bytes to generate at the end
  int64_t top_k = 0;               // 0: greedy
  uint64_t sample_seed = 0;
  std::string prompt = "\n";
  std::string save;                // FILE.safetensors: full weights at the end
  // accepted now, wired by later issues (checkpoints, trace)
  std::string ckpt_dir, trace;
  bool resume = false;
  // > 0: this run is one of that many replica groups of a fault-tolerant
  // job (fsdp/replicas.h; FSDP_COORDINATOR, FSDP_REPLICA_GROUP): each step
  // is the mean over the groups that take part, and a group that joins or
  // restarts heals from a peer.
  int64_t replicas = 0;
  bool save_async = false;  // checkpoints written in the background (CheckpointOptions::async)
  bool prefetch = true;  // as PyTorch FSDP (BACKWARD_PRE by default); --no-prefetch turns it off
  std::string ac = "none";  // activation checkpointing: none | block | every:K
  bool plan = false;  // print the planner's ledger before step 1, compare at the end
  int64_t ckpt_every = 0;
  std::string max_memory;          // "2GiB": the counting allocator's limit (set in main, before anything)
  bool rank_memory = false;        // every rank prints its memory at the end
  bool no_budget_check = false;    // skip the planner's refusal before construction
  double timeout = 0;              // seconds per collective; 0: the library default
  // progress and stragglers
  double progress_every = -1;      // seconds between progress lines; < 0: FSDP_PROGRESS_EVERY or 5
  bool no_progress = false;
  double straggler_factor = 1.5;   // 0: no straggler monitor
  int64_t straggler_window = 5;
};

// The whole run on this rank: communicator, data, model, the steps, the
// ledger, then sample / save / trace as the flags ask. Collective. Returns
// the exit code; throws fsdp::Error (and fsdp::UsageError for flag values
// only a rank can check, e.g. --resume without --ckpt-dir). `hooks`: empty
// in the gpt program; the tests slow a rank down or stop its data loader.
int train(const Args& a, const examples::StepHooks& hooks = {});

// The gpt program (gpt.cpp): flags, then train(). Returns the exit code: 0;
// 1 for an error; 2 for a usage error (said on stderr).
int run(int argc, char** argv, const examples::StepHooks& hooks = {});

}  // namespace gpt
