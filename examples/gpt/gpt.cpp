// build/bin/gpt: train GPT-mini (docs/GPT_MINI.md) with FSDP on byte-level text
// (gpt::run here; main.cpp calls it).
//
//   fsdp prepare --text a.txt b.txt --out data/x
//   fsdp run -n 2 -- build/bin/gpt --data data/x/train.bin --val data/x/val.bin --steps 300
//
// train() reads like the run: flags -> communicator -> data -> model ->
// fully_shard -> AdamW -> for each step { micro-steps (no_sync but the last),
// clip, lr, step } with a log line and validation -> ledger -> sample -> save.
// Rank 0 prints; every rank runs every collective (forward, evaluation,
// sampling and the final gather all talk to the other ranks).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <unistd.h>

#include "cli_checks.h"
#include "program.h"
#include "usage.h"
#include "fsdp/device.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "fsdp/init.h"
#include "fsdp/memory.h"
#include "gpt/plan_gpt.h"
#include "gpt/train.h"

namespace {

using gpt::Args;

[[noreturn]] void usage_error(const std::string& msg) { throw fsdp::UsageError(msg); }

constexpr int64_t kMaxSteps = int64_t(1) << 40;  // step counts: far beyond any run, no overflow

// Returns the exit code to return now (after --help, or a bad flag said on
// stderr), or nullopt to train. Throws fsdp::UsageError for a bad value.
std::optional<int> parse_args(int argc, char** argv, Args& a) {
  CLI::App app{"Train GPT-mini (byte-level) with FSDP. Run under `fsdp run -n N --` for N ranks.", "gpt"};
  auto* o_data = app.add_option("--data", a.data, "training tokens (.bin, uint16; from `fsdp prepare`)");
  auto* o_text = app.add_option("--text", a.text, "text files instead of --data (split 90/10: train/val)")
                     ->expected(1, -1);
  o_data->excludes(o_text);
  app.add_option("--val", a.val, "validation tokens (.bin); default with --text: its last 10%");
  app.add_option("--shuffle", a.shuffle, "row order: off (deterministic, docs/GPT_MINI.md) or on (seeded)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--vocab", a.cfg.vocab, "vocabulary size (256: bytes)")->check(CLI::Range(int64_t(1), int64_t(65536)));
  app.add_option("--seq", a.cfg.seq, "context length T")->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--dim", a.cfg.dim, "width d")->check(fsdp::cli::integer(1, 1 << 16));
  app.add_option("--layers", a.cfg.layers, "transformer blocks L")->check(fsdp::cli::integer(0, 4096));
  app.add_option("--heads", a.cfg.heads, "attention heads (divide --dim)")->check(fsdp::cli::integer(1, 1 << 16));
  app.add_option("--attention", a.attention,
                 "matmul (scores, mask, softmax: the reference) | sdpa (one fused kernel, "
                 "at::scaled_dot_product_attention; flash attention on a GPU)")
      ->check(CLI::IsMember({"matmul", "sdpa"}));
  app.add_option("--init", a.init, "start from these weights (.safetensors, docs/GPT_MINI.md names; with "
                                   "--construct sharded each rank reads only its shards' bytes)");
  app.add_option("--construct", a.construct,
                 "sharded: build the model without memory (fsdp::DeferredInit) and give each unit its values "
                 "while sharding, so no rank ever holds the whole model (default); eager: build it in full on "
                 "every rank, then shard (same initial weights, bitwise)")
      ->check(CLI::IsMember({"sharded", "eager"}));
  app.add_flag("--rank-memory", a.rank_memory,
               "at the end every rank prints its memory: the plan's peak, the counting allocator's peak of "
               "construction and of training, and the process's VmHWM");
  app.add_option("--batch", a.batch, "rows per micro-batch on each rank")->check(fsdp::cli::integer(1, 1 << 20));
  auto* o_accum = app.add_option("--accum", a.accum, "micro-steps per optimizer step (gradient accumulation)")
                      ->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--global-batch", a.global_batch,
                 "rows per optimizer step over all ranks: the accumulation is chosen as ROWS / (--batch x world "
                 "size), so a run resumed at another world size keeps it (instead of --accum)")
      ->check(fsdp::cli::integer(1, int64_t(1) << 40))
      ->excludes(o_accum);
  app.add_option("--steps", a.steps, "optimizer steps")->check(fsdp::cli::integer(0, kMaxSteps));
  app.add_option("--lr", a.lr, "peak learning rate")->check(fsdp::cli::real(1e-30, 1e3));
  app.add_option("--warmup", a.warmup, "linear warmup steps (0: none)")->check(fsdp::cli::integer(0, kMaxSteps));
  app.add_option("--min-lr", a.min_lr, "cosine decay ends here (= --lr: constant rate; default lr/10)")
      ->check(fsdp::cli::real(0, 1e3));
  app.add_option("--weight-decay", a.weight_decay, "AdamW decay on 2-D weights only")->check(fsdp::cli::real(0, 1e3));
  app.add_option("--clip", a.clip, "global gradient-norm clip (0: off)")->check(fsdp::cli::real(0, 1e12));
  app.add_option("--strategy", a.strategy,
                 "full | grad-op | none | hybrid | hybrid-zero2 (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                 "HYBRID_SHARD, HYBRID_SHARD_ZERO2)");
  app.add_option("--shard-group", a.shard_group,
                 "hybrid: ranks per shard group, a divisor of the world size (0: the ranks of one host)")
      ->check(fsdp::cli::integer(0, 1 << 20));
  app.add_option("--wrap", a.wrap, "block (one unit per transformer block) | size:N | none");
  app.add_flag("--plan", a.plan, "print the planner's ledger of this run (from the wrapped model's units) before step 1 "
                                 "and compare its peak and traffic with the measured ones at the end");
  app.add_flag("--prefetch,!--no-prefetch", a.prefetch,
               "overlap: all-gather the next unit early (backward PRE + forward prefetch; default on)");
  app.add_option("--ac", a.ac,
                 "activation checkpointing: none | block (every transformer block keeps only its input and "
                 "runs its forward again in backward) | every:K (every K-th block: the 1st, the K+1-th, ...)");
  app.add_option("--dtype", a.dtype, "fp32 | bf16 (bf16: all-gather and compute in bf16, fp32 master shards)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--seed", a.seed, "initialisation seed (same on every rank) and shuffle seed")
      ->check(fsdp::cli::integer(0, INT64_MAX));
  app.add_option("--device", a.device, "cpu | cuda (cuda:LOCAL_RANK) | cuda:K: where the shards, gathered "
                 "parameters, gradients and activations live")
      ->check([](const std::string& s) {
        return s == "cpu" || s == "cuda" || s.rfind("cuda:", 0) == 0 ? std::string()
                                                                     : "expected cpu, cuda or cuda:K, found '" + s + "'";
      });
  app.add_option("--backend", a.backend, "auto | gloo | nccl: the collectives' engine (auto: nccl when --device is "
                 "a GPU and each rank of this host has its own, else gloo; FSDP_BACKEND overrides)")
      ->check(CLI::IsMember({"auto", "gloo", "nccl"}));
  app.add_option("--threads", a.threads, "intra-op threads per rank (0: cores / ranks per host)")
      ->check(fsdp::cli::integer(0, 1024));
  app.add_option("--log-every", a.log_every, "a step line every N steps")->check(fsdp::cli::integer(1, kMaxSteps));
  app.add_option("--eval-every", a.eval_every, "validation loss every N steps (0: off)")->check(fsdp::cli::integer(0, kMaxSteps));
  app.add_option("--eval-batches", a.eval_batches, "validation micro-batches per rank")->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--sample", a.sample, "generate N bytes at the end (printed by rank 0)")->check(fsdp::cli::integer(0, 1 << 24));
  app.add_option("--top-k", a.top_k, "sample from the k most likely bytes (0: greedy)")->check(fsdp::cli::integer(0, 65536));
  app.add_option("--sample-seed", a.sample_seed, "seed of top-k sampling")->check(fsdp::cli::integer(0, INT64_MAX));
  app.add_option("--prompt", a.prompt, "text the sample continues (default: a newline)");
  app.add_option("--save", a.save, "write the full weights at the end (.safetensors)");
  app.add_option("--ckpt-dir", a.ckpt_dir, "sharded checkpoints folder (step-NNNNNN dirs and a `latest` pointer)");
  app.add_option("--ckpt-every", a.ckpt_every, "save a sharded checkpoint every N steps (0 = only at the end when --ckpt-dir)")->check(fsdp::cli::integer(0, kMaxSteps));
  app.add_flag("--save-async", a.save_async,
               "save checkpoints in the background: training goes on while a snapshot of the shards is written");
  app.add_option("--replicas", a.replicas,
                 "this run is one of R replica groups of a fault-tolerant job (`fsdp coordinator`; FSDP_COORDINATOR, "
                 "FSDP_REPLICA_GROUP): a lost group costs one step, and heals from a peer when it comes back")
      ->check(fsdp::cli::integer(1, 1 << 20));
  app.add_flag("--resume", a.resume, "continue from the latest checkpoint in --ckpt-dir when there is one (start fresh otherwise)");
  app.add_option("--trace", a.trace, "record a Chrome trace per rank into DIR (then: fsdp report DIR -o report.html)");
  app.add_option("--max-memory", a.max_memory,
                 "per-rank memory limit from process start, e.g. 512MiB (fails like a GPU OOM); a run the "
                 "planner says cannot fit is refused before anything is built");
  app.add_flag("--no-budget-check", a.no_budget_check,
               "run even when the planner says --max-memory cannot hold it (to see the out-of-memory "
               "diagnosis in the act)");
  app.add_option("--timeout", a.timeout, "seconds before a collective fails (0: default)")->check(fsdp::cli::real(0, 1e6));
  app.add_option("--progress-every", a.progress_every,
                 "seconds between progress lines (training steps, ETA, loss, tok/s; checkpoint saves) when stdout "
                 "is not a terminal; 0: every update (default: FSDP_PROGRESS_EVERY or 5)")
      ->check(fsdp::cli::real(0, 1e6));
  app.add_flag("--no-progress", a.no_progress, "no progress lines, checkpoint saves included (same as FSDP_PROGRESS=off)");
  app.add_option("--straggler-factor", a.straggler_factor,
                 "name a rank busy (wall - blocked in collectives) more than F x the other ranks' median for "
                 "--straggler-window steps in a row (F > 1; 0: off)")
      ->check(fsdp::cli::real(0, 1e6));
  app.add_option("--straggler-window", a.straggler_window, "consecutive slow steps before a rank is named")
      ->check(fsdp::cli::integer(1, 1000000));
  // A repeated single-value flag takes the last value (scripts append overrides).
  for (CLI::Option* o : app.get_options())
    if (o->get_expected_max() == 1) o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  if (const std::optional<int> rc = fsdp::cli::parse(app, argc, argv)) return rc;
  // Values CLI11 cannot check alone.
  if (a.data.empty() && a.text.empty()) usage_error("give the training data: --data FILE.bin or --text FILE...");
  a.cfg.validate();
  {
    // Every rank builds the whole model before sharding it: it must fit in RAM.
    const long double bytes = (long double)a.cfg.num_params() * 4;
    const long double ram = (long double)sysconf(_SC_PHYS_PAGES) * (long double)sysconf(_SC_PAGE_SIZE);
    if (ram > 0 && bytes > ram)
      usage_error("--vocab/--seq/--dim/--layers give " + std::to_string(a.cfg.num_params()) + " parameters (" +
                  fsdp::memory::format_bytes(int64_t(bytes)) + " in fp32), more than this machine's memory (" +
                  fsdp::memory::format_bytes(int64_t(ram)) + "); every rank builds the full model first: choose "
                  "a smaller model");
  }
  if (a.min_lr < 0) a.min_lr = a.lr / 10;
  if (a.min_lr > a.lr)
    usage_error("--min-lr " + std::to_string(a.min_lr) + " is above --lr " + std::to_string(a.lr) +
                "; the cosine decays from --lr down to --min-lr");
  try {
    fsdp::parse_strategy(a.strategy);
  } catch (const fsdp::Error& e) {
    usage_error(std::string("--strategy: ") + e.what());
  }
  if (a.wrap != "block" && a.wrap != "none" && a.wrap.rfind("size:", 0) != 0)
    usage_error("--wrap '" + a.wrap + "': expected block, none or size:N (N parameters per unit)");
  if (a.wrap.rfind("size:", 0) == 0) {
    const std::string n = a.wrap.substr(5);
    if (n.empty() || n.size() > 15 || n.find_first_not_of("0123456789") != std::string::npos || std::stoll(n) <= 0)
      usage_error("--wrap '" + a.wrap + "': expected size:N with N a positive parameter count, e.g. size:100000");
  }
  a.cfg.sdpa = a.attention == "sdpa";
  try {
    gpt::recompute_every(a.ac);
  } catch (const fsdp::Error& e) {
    usage_error(e.what());
  }
  if (a.straggler_factor > 0 && !(a.straggler_factor > 1))
    usage_error("--straggler-factor " + std::to_string(a.straggler_factor) +
                ": expected a factor > 1 (e.g. 1.5: 50% slower than the other ranks) or 0 to turn the monitor off");
  if (a.top_k > a.cfg.vocab)
    usage_error("--top-k " + std::to_string(a.top_k) + " is larger than --vocab " + std::to_string(a.cfg.vocab));
  if (!a.max_memory.empty()) {
    try {
      fsdp::cli::parse_bytes(a.max_memory);
    } catch (const fsdp::UsageError& e) {
      usage_error(std::string("--max-memory: ") + e.what());
    }
  }
  return std::nullopt;
}

}  // namespace

namespace gpt {

int run(int argc, char** argv, const examples::StepHooks& hooks) {
  return fsdp::cli::run_program("gpt", [&] {
    fsdp::init();  // the counting allocator (ledger, --max-memory) and SIGPIPE, before any tensor
    Args a;
    if (const std::optional<int> rc = parse_args(argc, argv, a)) return *rc;
    // The device first: a GPU's CUDA support is loaded before anything asks
    // libtorch about CUDA (fsdp/device.h).
    const torch::Device dev = fsdp::parse_device(a.device);
    // The budget covers the whole process: construction and loading included.
    if (!a.max_memory.empty()) fsdp::set_device_memory_limit(dev, fsdp::cli::parse_bytes(a.max_memory));
    return gpt::train(a, hooks);
  });
}

}  // namespace gpt
