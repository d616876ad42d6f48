// build/bin/gpt: train GPT-mini (docs/GPT_MINI.md) with FSDP on byte-level text.
//
//   fsdp prepare --text a.txt b.txt --out data/x
//   fsdp run -n 2 -- build/bin/gpt --data data/x/train.bin --val data/x/val.bin --steps 300
//
// main() reads like the run: flags -> communicator -> data -> model ->
// fully_shard -> AdamW -> for each step { micro-steps (no_sync but the last),
// clip, lr, step } with a log line and validation -> ledger -> sample -> save.
// Rank 0 prints; every rank runs every collective (forward, evaluation,
// sampling and the final gather all talk to the other ranks).
#include <CLI/CLI.hpp>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "cli_checks.h"
#include "usage.h"
#include "fault_injection.h"
#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "fsdp/init.h"
#include "fsdp/memory.h"
#include "fsdp/optim.h"
#include "fsdp/plan.h"
#include "gpt/plan_gpt.h"
#include "fsdp/progress.h"
#include "fsdp/state_dict.h"
#include "fsdp/straggler.h"
#include "fsdp/trace.h"
#include "gpt/data.h"
#include "gpt/model.h"

namespace {

// ---------------------------------------------------------------------------
// Flags. Defaults: the docs/GPT_MINI.md model size, training settings that suit it.
struct Args {
  // data
  std::string data, val;           // token files (.bin)
  std::vector<std::string> text;   // or text files, split 90/10 on the fly
  std::string shuffle = "off";     // off: the deterministic order of docs/GPT_MINI.md
  // model
  gpt::Config cfg;
  std::string init;                // FILE.safetensors to start from
  // training
  int64_t batch = 8;               // rows per micro-batch per rank
  int64_t accum = 1;               // micro-steps per optimizer step
  int64_t steps = 300;
  double lr = 1e-3, min_lr = -1;   // min_lr < 0: lr / 10
  int64_t warmup = 20;
  double weight_decay = 0.1, clip = 1.0;
  std::string strategy = "full", wrap = "block", dtype = "fp32";
  uint64_t seed = 1337;
  int threads = 0;                 // 0: cores / ranks on this host
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
  bool prefetch = false;
  bool plan = false;  // print the planner's ledger before step 1, compare at the end
  int64_t ckpt_every = 0;
  std::string max_memory;          // "2GiB": the counting allocator's limit
  double timeout = 0;              // seconds per collective; 0: the library default
  // progress and stragglers
  double progress_every = -1;      // seconds between progress lines; < 0: FSDP_PROGRESS_EVERY or 5
  bool no_progress = false;
  double straggler_factor = 1.5;   // 0: no straggler monitor
  int64_t straggler_window = 5;
};

[[noreturn]] void usage_error(const std::string& msg) { throw fsdp::UsageError(msg); }

constexpr int64_t kMaxSteps = int64_t(1) << 40;  // step counts: far beyond any run, no overflow

// Throws CLI::ParseError (bad syntax) or fsdp::UsageError (bad values): exit 2.
// Returns false when --help was printed.
bool parse_args(int argc, char** argv, Args& a) {
  CLI::App app{"Train GPT-mini (byte-level) with FSDP. Run under `fsdp run -n N --` for N ranks.", "gpt"};
  auto* o_data = app.add_option("--data", a.data, "training tokens (.bin, uint16; from `fsdp prepare`)");
  auto* o_text = app.add_option("--text", a.text, "text files instead of --data (split 90/10: train/val)")
                     ->expected(1, -1);
  o_data->excludes(o_text);
  app.add_option("--val", a.val, "validation tokens (.bin); default with --text: its last 10%");
  app.add_option("--shuffle", a.shuffle, "row order: off (deterministic, GPT_MINI.md) or on (seeded)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--vocab", a.cfg.vocab, "vocabulary size (256: bytes)")->check(CLI::Range(int64_t(1), int64_t(65536)));
  app.add_option("--seq", a.cfg.seq, "context length T")->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--dim", a.cfg.dim, "width d")->check(fsdp::cli::integer(1, 1 << 16));
  app.add_option("--layers", a.cfg.layers, "transformer blocks L")->check(fsdp::cli::integer(0, 4096));
  app.add_option("--heads", a.cfg.heads, "attention heads (divide --dim)")->check(fsdp::cli::integer(1, 1 << 16));
  app.add_option("--init", a.init, "start from these weights (.safetensors, docs/GPT_MINI.md names)");
  app.add_option("--batch", a.batch, "rows per micro-batch on each rank")->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--accum", a.accum, "micro-steps per optimizer step (gradient accumulation)")->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--steps", a.steps, "optimizer steps")->check(fsdp::cli::integer(0, kMaxSteps));
  app.add_option("--lr", a.lr, "peak learning rate")->check(fsdp::cli::real(1e-30, 1e3));
  app.add_option("--warmup", a.warmup, "linear warmup steps (0: none)")->check(fsdp::cli::integer(0, kMaxSteps));
  app.add_option("--min-lr", a.min_lr, "cosine decay ends here (= --lr: constant rate; default lr/10)")
      ->check(fsdp::cli::real(0, 1e3));
  app.add_option("--weight-decay", a.weight_decay, "AdamW decay on 2-D weights only")->check(fsdp::cli::real(0, 1e3));
  app.add_option("--clip", a.clip, "global gradient-norm clip (0: off)")->check(fsdp::cli::real(0, 1e12));
  app.add_option("--strategy", a.strategy, "full | grad-op | none (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD)");
  app.add_option("--wrap", a.wrap, "block (one unit per transformer block) | size:N | none");
  app.add_flag("--plan", a.plan, "print the planner's ledger of this run (from the wrapped model's units) before step 1 "
                                 "and compare its peak and traffic with the measured ones at the end");
  app.add_flag("--prefetch", a.prefetch, "overlap: all-gather the next unit early (backward PRE + forward prefetch)");
  app.add_option("--dtype", a.dtype, "fp32 | bf16 (bf16: all-gather and compute in bf16, fp32 master shards)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--seed", a.seed, "initialisation seed (same on every rank) and shuffle seed")
      ->check(fsdp::cli::integer(0, INT64_MAX));
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
  app.add_flag("--resume", a.resume, "continue from the latest checkpoint in --ckpt-dir when there is one (start fresh otherwise)");
  app.add_option("--trace", a.trace, "record a Chrome trace per rank into DIR (then: fsdp report DIR -o report.html)");
  app.add_option("--max-memory", a.max_memory, "per-rank memory limit, e.g. 512MiB (fails like a GPU OOM)");
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return false;
  }
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
  return true;
}

fsdp::WrapPolicy wrap_policy(const std::string& w) {
  if (w == "block") return fsdp::WrapPolicy::module_type<gpt::BlockImpl>("Block");
  if (w == "none") return fsdp::WrapPolicy::none();
  const std::string n = w.substr(5);  // after "size:"
  char* end = nullptr;
  const long long v = std::strtoll(n.c_str(), &end, 10);
  if (n.empty() || *end != '\0' || v <= 0)
    usage_error("--wrap '" + w + "': expected size:N with N a positive parameter count, e.g. size:100000");
  return fsdp::WrapPolicy::size_based(v);
}

// nanoGPT's schedule: linear warmup to lr, then cosine down to min_lr at the last step.
double lr_at(const Args& a, int64_t step) {
  if (step < a.warmup) return a.lr * double(step + 1) / double(a.warmup);
  const int64_t span = a.steps - a.warmup;
  if (span <= 1) return a.lr;
  const double ratio = double(step - a.warmup) / double(span - 1);  // 0 .. 1
  return a.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (a.lr - a.min_lr);
}

// AdamW with two parameter groups chosen on the shards' original shapes
// (the shards themselves are 1-D): weight decay on 2-D weights (embeddings,
// linear weights) only, the default of fsdp::decay_groups.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const fsdp::FullyShardedModel& m, const Args& a) {
  const auto base = torch::optim::AdamWOptions(a.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(a.weight_decay);
  return std::make_unique<torch::optim::AdamW>(fsdp::decay_groups(m, base, a.weight_decay), base);
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
}

// "r0 12.3 MiB (peak 20.1 MiB)  r1 ..." from an all-gather of every rank's stats.
std::string memory_line(fsdp::Communicator& comm) {
  const auto st = fsdp::memory::stats();
  auto mine = torch::tensor({float(st.current), float(st.peak)});
  auto all = torch::empty({comm.world_size() * 2}, torch::kFloat);
  comm.all_gather(mine, all, {"memory stats"})->wait();
  std::string s;
  for (int r = 0; r < comm.world_size(); r++) {
    s += (r ? "  r" : "r") + std::to_string(r) + " " + fsdp::memory::format_bytes(int64_t(all[2 * r].item<float>())) +
         " (peak " + fsdp::memory::format_bytes(int64_t(all[2 * r + 1].item<float>())) + ")";
  }
  return s;
}

// Wrapped through the shared_ptr: call() on it reaches the non-const forward().
using Model = fsdp::Sharded<std::shared_ptr<gpt::GPTImpl>>;

// Mean validation loss over eval_batches micro-batches per rank, then over ranks.
double evaluate(Model& model, fsdp::Communicator& comm, const gpt::data::Tokens& val,
                const gpt::data::Order& order, int64_t batches) {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t e = 0; e < batches; e++) {
    auto b = gpt::data::eval_batch(val, order, e, comm.rank());
    sum += gpt::loss(model.forward(b.x), b.y).item<double>();  // logits [B,T,V]
  }
  return fsdp::all_reduce_mean(comm, sum / double(batches), {"validation loss"});
}

// Generates n tokens after `prompt`. Every rank runs the model (each forward
// all-gathers); rank 0 decides each token and broadcasts it, so all ranks
// extend the same context.
std::string sample(Model& model, fsdp::Communicator& comm, const Args& a) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(a.sample_seed);
  gpt::data::Tokens ctx = gpt::data::encode(a.prompt.empty() ? std::string("\n") : a.prompt);
  const size_t prompt_len = ctx.size();
  for (int64_t i = 0; i < a.sample; i++) {
    const size_t t = std::min<size_t>(ctx.size(), size_t(a.cfg.seq));
    auto idx = torch::empty({1, int64_t(t)}, torch::kLong);  // [1,t] the last t tokens
    for (size_t j = 0; j < t; j++) idx[0][int64_t(j)] = int64_t(ctx[ctx.size() - t + j]);
    auto logits = model.forward(idx)[0][int64_t(t) - 1].to(torch::kFloat);  // [V]
    int64_t next = 0;
    if (a.top_k == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      auto top = logits.topk(a.top_k);                               // values, indices [k]
      auto probs = torch::softmax(std::get<0>(top), -1);             // [k]
      auto pick = torch::multinomial(probs, 1, false, gen);          // [1]
      next = std::get<1>(top)[pick.item<int64_t>()].item<int64_t>();
    }
    auto tt = torch::tensor({float(next)});  // exact for ids < 2^24
    comm.broadcast(tt, 0, {"sample token"})->wait();
    ctx.push_back(uint16_t(tt.item<float>()));
  }
  return gpt::data::decode(gpt::data::Tokens(ctx.begin() + prompt_len, ctx.end()));
}

// --init: docs/GPT_MINI.md names and shapes, fp32 (or any float dtype, converted).
// Collective; every rank loads the whole model before wrapping.
void load_init(fsdp::Communicator& comm, gpt::GPT& net, const std::string& path) {
  torch::NoGradGuard no_grad;
  std::vector<fsdp::ckpt::Slice> wanted;
  for (auto& p : net->named_parameters()) {
    auto dst = p.value().detach().view({-1});  // writes land in the parameter
    wanted.push_back({p.key(), p.value().sizes().vec(), torch::kFloat32, 0, dst.numel(), dst});
  }
  fsdp::ckpt::LoadOptions lo;
  lo.allow_dtype_cast = true;  // e.g. weights saved in bf16
  fsdp::ckpt::load_full_safetensors(comm, path, wanted, lo);
}

// --save: rank 0 streams the gathered tensors into one .safetensors file
// (progress lines when that takes more than a few seconds).
int64_t save_full(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& full,
                  const gpt::Config& c, fsdp::ProgressOptions po) {
  std::vector<fsdp::ckpt::TensorSpec> specs;
  for (auto& [name, t] : full) specs.push_back({name, t.sizes().vec(), t.scalar_type()});
  po.label = "saving " + path;
  po.unit = "bytes";
  for (auto& [name, t] : full) po.total += t.numel() * int64_t(t.element_size());
  fsdp::Progress prog(po);
  size_t next = 0;
  int64_t handed = 0;  // bytes of the tensors handed to the writer (each written before the next is asked for)
  const int64_t bytes = fsdp::ckpt::write_full_safetensors(
      path, specs,
      [&](const fsdp::ckpt::TensorSpec&) {
        prog.update(handed);
        const torch::Tensor& t = full[next++].second;
        handed += t.numel() * int64_t(t.element_size());
        return t;
      },
      {{"model", "gpt-mini"}, {"vocab", std::to_string(c.vocab)}, {"seq", std::to_string(c.seq)},
       {"dim", std::to_string(c.dim)}, {"layers", std::to_string(c.layers)}, {"heads", std::to_string(c.heads)}});
  prog.update(handed);
  prog.finish();
  return bytes;
}

int default_threads(const fsdp::Communicator& comm) {
  if (std::getenv("OMP_NUM_THREADS")) return 0;  // the user decided
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, comm.local_world_size()));
}

// ---------------------------------------------------------------------------
int train(const Args& a) {
  // Communicator first: it installs the counting allocator, so every tensor
  // below (the model included) is in the memory numbers.
  // The flags reach the library's reporters (checkpoint saves) through the environment.
  if (a.no_progress) ::setenv("FSDP_PROGRESS", "off", 1);
  if (a.progress_every >= 0) ::setenv("FSDP_PROGRESS_EVERY", std::to_string(a.progress_every).c_str(), 1);
  try {  // a bad FSDP_PROGRESS / FSDP_PROGRESS_EVERY is the user's flag error (exit 2), found before step 1
    fsdp::ProgressOptions check;
    check.enabled = false;
    fsdp::Progress probe(check);
  } catch (const fsdp::Error& e) {
    throw fsdp::UsageError(e.what());
  }
  fsdp::CommOptions copts;
  if (a.timeout > 0) copts.timeout = std::chrono::milliseconds(int64_t(a.timeout * 1000));
  fsdp::CommPtr comm = fsdp::make_communicator_from_env(copts);
  // Time blocked in collectives, so a step's busy time (wall - blocked) shows
  // which rank the others wait for (fsdp/straggler.h).
  auto waits = std::make_shared<fsdp::WaitClock>();
  comm = fsdp::with_wait_clock(comm, waits);
  const int rank = comm->rank(), N = comm->world_size();
  const bool lead = rank == 0;
  if (!a.max_memory.empty()) fsdp::memory::set_limit(fsdp::cli::parse_bytes(a.max_memory));
  if (int th = a.threads ? a.threads : default_threads(*comm)) torch::set_num_threads(th);
  if (a.resume && a.ckpt_dir.empty()) throw fsdp::UsageError("--resume needs --ckpt-dir DIR (where to look)");
  if (!a.trace.empty()) fsdp::trace::start(a.trace, rank, N);

  // Data: every rank reads the same stream and picks its rows by the order.
  gpt::data::Tokens train_tokens, val_tokens;
  if (!a.text.empty()) {
    auto s = gpt::data::split(gpt::data::encode(gpt::data::read_texts(a.text)));
    train_tokens = std::move(s.train);
    val_tokens = std::move(s.val);
  } else {
    train_tokens = gpt::data::read_tokens(a.data, a.cfg.vocab);
  }
  if (!a.val.empty()) val_tokens = gpt::data::read_tokens(a.val, a.cfg.vocab);
  const gpt::data::Order order{a.cfg.seq, a.batch, a.accum, N, a.shuffle == "on", a.seed};
  gpt::data::row_offset(order, int64_t(train_tokens.size()), 0);  // throws: data shorter than --seq
  const bool eval_on = a.eval_every > 0 && !val_tokens.empty();
  if (eval_on) {
    try {
      gpt::data::row_offset(order, int64_t(val_tokens.size()), 0);
    } catch (const fsdp::Error& e) {
      throw fsdp::Error(std::string("validation data: ") + e.what());
    }
  }
  if (lead && a.eval_every > 0 && !eval_on)
    std::printf("note: no validation data (give --val FILE.bin or use --text); validation off\n");

  // Model: the same seed on every rank (and FSDP broadcasts rank 0's anyway).
  torch::manual_seed(a.seed);
  gpt::GPT net(a.cfg);
  if (!a.init.empty()) load_init(*comm, net, a.init);  // every rank reads; checked names and shapes
  fsdp::FsdpOptions fopts;
  fopts.strategy = fsdp::parse_strategy(a.strategy);
  fopts.wrap = wrap_policy(a.wrap);
  if (a.dtype == "bf16") fopts.mixed_precision.param_dtype = torch::kBFloat16;
  if (a.prefetch) {
    fopts.backward_prefetch = fsdp::BackwardPrefetch::BACKWARD_PRE;
    fopts.forward_prefetch = true;
  }
  Model model = fsdp::fully_shard(net.ptr(), comm, fopts);
  auto opt = make_optimizer(*model, a);
  fsdp::verify_optimizer(*model, *opt);

  const int64_t tokens_per_step = N * a.batch * a.accum * a.cfg.seq;
  if (lead) {
    std::printf("gpt: %s\n", a.cfg.str().c_str());
    std::printf("data: %zu train tokens, %zu val tokens, order %s\n", train_tokens.size(), val_tokens.size(),
                order.shuffle ? "shuffled" : "deterministic");
    std::printf("fsdp: %s, world %d, wrap %s, dtype %s, %d thread(s)/rank\n", fsdp::to_string(fopts.strategy), N,
                fopts.wrap.description.c_str(), a.dtype.c_str(), torch::get_num_threads());
    std::printf("train: %lld steps x (%d ranks x %lld rows x %lld accum x %lld tokens) = %lld tokens/step, "
                "lr %.2e -> %.2e, warmup %lld\n",
                (long long)a.steps, N, (long long)a.batch, (long long)a.accum, (long long)a.cfg.seq,
                (long long)tokens_per_step, a.lr, a.min_lr, (long long)a.warmup);
    std::printf("%s\n", model->describe_units().c_str());
    std::fflush(stdout);
  }
  // The planner on this run: the real units, GPT-mini's activation estimate.
  std::optional<fsdp::plan::Plan> plan;
  if (a.plan) {
    const gpt::GptShape shape{a.cfg.layers, a.cfg.dim, a.cfg.heads, a.cfg.vocab, a.cfg.seq, a.batch};
    fsdp::plan::PlanOptions po;
    po.world = N;
    po.strategy = fopts.strategy;
    po.param_bytes = a.dtype == "bf16" ? 2 : 4;
    po.optimizer = fsdp::plan::Optimizer::ADAM;
    po.micro_steps = static_cast<int>(a.accum);
    po.prefetch = a.prefetch ? 1 : 0;
    const int act_bytes = po.param_bytes;
    plan = fsdp::plan::make_plan(fsdp::plan::units_from(model->units()),
                                 gpt::gpt_activations(shape, act_bytes).total, po,
                                 gpt::gpt_released(shape, a.wrap, act_bytes));
    if (lead) std::printf("%s\n", plan->str().c_str()), std::fflush(stdout);
  }

  auto validate = [&](int64_t step) {
    const double vl = evaluate(model, *comm, val_tokens, order, a.eval_batches);
    if (lead) fsdp::progress::clear_line(), std::printf("step %5lld | val loss %.4f\n", (long long)step, vl), std::fflush(stdout);
  };

  // -------------------------------------------------------------------------
  // The training loop.
  using clock = std::chrono::steady_clock;
  int64_t first_step = 0;
  if (a.resume) {
    // Model shards, optimizer state and the step; the data position is a
    // function of the step (docs/GPT_MINI.md's order), so nothing else is needed.
    auto r = fsdp::load_checkpoint(*model, opt.get(), a.ckpt_dir);
    if (r.found) {
      first_step = r.train_state.value("step", int64_t(0));
      if (lead)
        std::printf("resumed from %s: step %lld (saved at world size %d, %s)%s\n", r.path.c_str(),
                    (long long)first_step, r.saved_world_size, r.saved_strategy.c_str(),
                    r.note.empty() ? "" : ("; " + r.note).c_str());
    } else if (lead) {
      std::printf("no checkpoint in %s yet: starting at step 0\n", a.ckpt_dir.c_str());
    }
  }
  auto checkpoint = [&](int64_t done) {
    auto r = fsdp::save_checkpoint(*model, opt.get(), a.ckpt_dir, done,
                                   {{"step", done}, {"seed", a.seed}, {"shuffle", a.shuffle}, {"world", N}});
    if (lead) fsdp::progress::clear_line(), std::printf("checkpoint %s (%.2f s)\n", r.path.c_str(), r.seconds), std::fflush(stdout);
  };
  // Progress on rank 0 (fsdp/progress.h): steps, ETA, loss, tokens/s.
  fsdp::ProgressOptions popts;
  popts.rank = rank;
  popts.enabled = !a.no_progress;
  popts.interval_s = a.progress_every;
  fsdp::ProgressOptions train_popts = popts;
  train_popts.label = "train";
  train_popts.unit = "steps";
  train_popts.total = a.steps;
  train_popts.initial = std::min(first_step, a.steps);
  train_popts.rate_scale = double(tokens_per_step);
  train_popts.rate_unit = "tok/s";
  fsdp::Progress progress(train_popts);
  // Per-rank busy time (wall - blocked in collectives) every step; a rank
  // slower than factor x the median for `window` steps in a row is named.
  std::optional<fsdp::StragglerMonitor> stragglers;
  if (a.straggler_factor > 0) {
    stragglers.emplace(comm, a.straggler_factor, int(a.straggler_window));
    stragglers->set_logging(false);  // printed below, between the step lines
  }
  const auto run_start = clock::now();
  int64_t train_bytes = 0;  // sent inside the steps' spans (what the plan predicts)
  for (int64_t step = first_step; step < a.steps; step++) {
    if (eval_on && step % a.eval_every == 0) validate(step);
    // The step span covers training only: evaluation traffic stays outside
    // the report's per-step traffic (compared with 3P / 2P).
    fsdp::trace::Span step_span("step", "step");
    if (step_span.active()) step_span.arg("step", step);
    const int64_t sent0 = comm->counters().total_bytes_sent();
    const auto t0 = clock::now();
    const double waited0 = waits->seconds();
    examples::inject_step_delay(rank);  // fault injection: FSDP_INJECT_STEP_DELAY=RANK:MS (tests of the monitor)
    const double lr = lr_at(a, step);
    set_lr(*opt, lr);

    // K micro-steps; gradients of the first K-1 stay local (no_sync), the
    // last backward reduce-scatters their sum. Dividing each loss by K makes
    // the step's gradient the mean over all N*B*K rows.
    double loss_sum = 0;
    for (int64_t k = 0; k < a.accum; k++) {
      auto b = gpt::data::batch(train_tokens, order, step, k, rank);  // x, y [B,T]
      auto micro = [&] {
        auto logits = model.forward(b.x);  // [B,T,V]
        auto loss = gpt::loss(logits, b.y);
        (loss / double(a.accum)).backward();
        loss_sum += loss.item<double>();
      };
      if (k + 1 < a.accum) {
        auto guard = model->no_sync();
        micro();
      } else {
        micro();
      }
    }
    const double norm = a.clip > 0 ? model->clip_grad_norm(a.clip) : 0.0;
    {
      FSDP_TRACE_SPAN("optimizer_step", "optim");
      opt->step();
      opt->zero_grad();
    }
    if (step_span.active()) step_span.arg("loss", loss_sum / double(a.accum));
    step_span.end();
    train_bytes += comm->counters().total_bytes_sent() - sent0;
    if (!a.ckpt_dir.empty() && a.ckpt_every > 0 && (step + 1) % a.ckpt_every == 0 && step + 1 < a.steps)
      checkpoint(step + 1);

    const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    fsdp::StragglerReport srep;
    if (stragglers) srep = stragglers->observe(ms / 1000.0 - (waits->seconds() - waited0));  // collective
    if (lead && !srep.message.empty()) {
      fsdp::progress::clear_line();
      std::printf("%s\n", srep.message.c_str());
      std::fflush(stdout);
    }
    if (step % a.log_every == 0 || step + 1 == a.steps) {
      // Collectives: every rank takes this branch at the same steps.
      const double loss = fsdp::all_reduce_mean(*comm, loss_sum / double(a.accum), {"train loss"});
      const std::string mem = memory_line(*comm);
      if (lead) {
        fsdp::progress::clear_line();
        std::printf("step %5lld | loss %.4f | lr %.2e | norm %6.3f | %7.1f ms/step | %7.0f tok/s | %s\n",
                    (long long)step, loss, lr, norm, ms, double(tokens_per_step) / (ms / 1000.0), mem.c_str());
        if (!srep.seconds.empty()) {
          std::string busy;
          for (size_t q = 0; q < srep.seconds.size(); q++) {
            char b[48];
            std::snprintf(b, sizeof b, "%sr%zu %.1f", q ? "  " : "", q, srep.seconds[q] * 1000.0);
            busy += b;
          }
          std::printf("step %5lld | busy ms per rank (wall - blocked in collectives): %s | median %.1f\n",
                      (long long)step, busy.c_str(), srep.median * 1000.0);
        }
        std::fflush(stdout);
      }
    }
    char loss_text[32];
    std::snprintf(loss_text, sizeof loss_text, "%.4f", loss_sum / double(a.accum));
    progress.update(step + 1, {{"loss", loss_text}});
  }
  progress.finish();
  if (eval_on) validate(a.steps);
  if (!a.ckpt_dir.empty() && first_step < a.steps) checkpoint(a.steps);
  const double seconds = std::chrono::duration<double>(clock::now() - run_start).count();

  // The ledger: measured memory terms against the FSDP guide's formulas.
  const fsdp::Ledger ledger = model->ledger(opt.get());
  if (lead) {
    std::printf("trained %lld steps in %.1f s (%.0f tokens/s)\n", (long long)(a.steps - first_step), seconds,
                double(tokens_per_step * (a.steps - first_step)) / std::max(seconds, 1e-9));
    std::printf("%s\n", ledger.str().c_str());
    if (plan) {
      const int64_t steps_run = a.steps - first_step, sent = train_bytes;
      std::printf("plan vs measured (rank 0): peak %s predicted, %s measured (%.3f); traffic %s/step predicted, "
                  "%s/step measured in the training steps (%.3f)\n",
                  fsdp::memory::format_bytes(plan->peak).c_str(), fsdp::memory::format_bytes(ledger.peak).c_str(),
                  double(plan->peak) / std::max<double>(1, ledger.peak),
                  fsdp::memory::format_bytes(plan->traffic.total()).c_str(),
                  fsdp::memory::format_bytes(steps_run > 0 ? sent / steps_run : 0).c_str(),
                  steps_run > 0 && sent > 0 ? double(plan->traffic.total()) * steps_run / double(sent) : 0.0);
    }
    std::fflush(stdout);
  }

  if (a.sample > 0) {
    const std::string text = sample(model, *comm, a);
    if (lead) {
      std::printf("sample (%lld bytes, %s):\n----\n%s%s\n----\n", (long long)a.sample,
                  a.top_k ? ("top-k " + std::to_string(a.top_k) + ", seed " + std::to_string(a.sample_seed)).c_str()
                          : "greedy",
                  a.prompt.c_str(), text.c_str());
      std::fflush(stdout);
    }
  }

  if (!a.save.empty()) {
    auto full = model->full_state(0);  // collective: (name, tensor) on rank 0 only
    if (lead) {
      const int64_t bytes = save_full(a.save, full, a.cfg, popts);
      std::printf("saved %zu tensors (%s) to %s\n", full.size(), fsdp::memory::format_bytes(bytes).c_str(),
                  a.save.c_str());
    }
  }
  if (!a.trace.empty()) {
    fsdp::trace::stop();
    comm->barrier()->wait();  // every rank's file is written
    if (lead) std::printf("trace: %s\n", fsdp::trace::merge(a.trace).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::init();  // the counting allocator (ledger, --max-memory) and SIGPIPE, before any tensor
  Args a;
  try {
    if (!parse_args(argc, argv, a)) return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "gpt: usage error: %s\nrun 'gpt --help' for the flags\n", e.what());
    return 2;
  } catch (const fsdp::UsageError& e) {
    std::fprintf(stderr, "gpt: usage error: %s\nrun 'gpt --help' for the flags\n", e.what());
    return 2;
  }
  try {
    return train(a);
  } catch (const fsdp::UsageError& e) {
    std::fprintf(stderr, "gpt: usage error: %s\n", e.what());
    return 2;
  } catch (const c10::Error& e) {  // libtorch's message, without its C++ backtrace
    const char* r = std::getenv("RANK");
    std::fprintf(stderr, "gpt: error (rank %s): %s\n", r ? r : "0", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    const char* r = std::getenv("RANK");
    std::fprintf(stderr, "gpt: error (rank %s): %s\n", r ? r : "0", e.what());
    return 1;
  }
}
