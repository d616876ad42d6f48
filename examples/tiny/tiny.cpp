// fsdp-cpp: the FSDP guide's demo in C++ — TinyModel, FULL_SHARD, Adam, gradient
// accumulation, loss per epoch, the ledger next to the guide's formulas, and
// the full weights saved at the end.
//
//   build/bin/fsdp run -n 2 -- build/bin/tiny [--strategy full|grad-op|none|hybrid|hybrid-zero2]
//
// tiny::run reads top to bottom like the FSDP guide's Python demo
// (docs/GUIDE.md); main.cpp calls it. The helpers above it are the command
// line and the end-of-run report.
#include "tiny/tiny.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <optional>

#include "cli_checks.h"
#include "program.h"
#include "fsdp/flight.h"
#include "fsdp/fsdp.h"
#include "fsdp/plan.h"
#include "fsdp/progress.h"
#include "fsdp/straggler.h"
#include "traffic_line.h"
#include "usage.h"

namespace tiny {
namespace {

// The guide's TinyModel: three Linear(512, 512) with ReLU. Each Linear will
// be its own unit (size policy, min 2048 params), so its forward is routed
// through fsdp::call — a plain call when the model is not wrapped.
struct TinyModelImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  TinyModelImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(512, 512));
    fc2 = register_module("fc2", torch::nn::Linear(512, 512));
    fc3 = register_module("fc3", torch::nn::Linear(512, 512));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fsdp::call(fc1, x));
    x = torch::relu(fsdp::call(fc2, x));
    return fsdp::call(fc3, x);
  }
};
TORCH_MODULE(TinyModel);

// The command line; the defaults are the guide's demo.
struct Flags {
  std::string strategy = "full", save = "fsdp_model.safetensors", ckpt_dir, trace_dir, max_memory, device = "cpu";
  int epochs = 3, accum = 4, micro_bs = 64, ckpt_every = 0;
  int64_t min_params = 2048;
  double lr = 2e-4;
  bool resume = false, no_sync = false, no_progress = false;
  double progress_every = -1, straggler_factor = 1.5;
  int straggler_window = 5;
};

// Returns nullopt to train; otherwise the exit code (0 after --help; 2 for a
// bad flag, said on stderr). Throws fsdp::UsageError for a bad value.
std::optional<int> parse_flags(int argc, char** argv, Flags& f) {
  CLI::App app{"the FSDP guide's demo: TinyModel trained with Adam and gradient accumulation", "tiny"};
  app.add_option("--strategy", f.strategy, "full | grad-op | none | hybrid | hybrid-zero2 (hybrid: shard groups of one host)")
      ->check(CLI::IsMember({"full", "grad-op", "none", "hybrid", "hybrid-zero2"}));
  app.add_option("--epochs", f.epochs, "optimizer steps (the FSDP guide calls them epochs)")->check(CLI::Range(1, 1000000));
  app.add_option("--accum", f.accum, "micro-steps per optimizer step")->check(CLI::Range(1, 10000));
  app.add_option("--batch", f.micro_bs, "micro-batch per rank")->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", f.lr, "Adam learning rate")->check(fsdp::cli::real(1e-30, 1e3));
  app.add_option("--min-params", f.min_params, "size-based wrap policy threshold")->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  app.add_flag("--no-sync", f.no_sync, "accumulate with no_sync (reduce once per step)");
  app.add_option("--save", f.save, "full weights (safetensors) written at the end; '' = none");
  app.add_option("--ckpt-dir", f.ckpt_dir, "sharded checkpoints directory");
  app.add_option("--ckpt-every", f.ckpt_every, "save a sharded checkpoint every N steps")->check(CLI::Range(0, 1 << 30));
  app.add_flag("--resume", f.resume, "continue from the latest checkpoint in --ckpt-dir when there is one");
  app.add_option("--trace", f.trace_dir, "write a Chrome trace per rank into DIR (then: fsdp report DIR)");
  app.add_option("--max-memory", f.max_memory, "per-rank memory budget, e.g. 8MiB (enforced by the device's allocator: the counting allocator on the CPU, the caching allocator on a GPU)");
  app.add_option("--device", f.device, "cpu | cuda (cuda:LOCAL_RANK) | cuda:K (ranks sharing a GPU: FSDP_BACKEND=gloo)")
      ->check([](const std::string& s) {
        return s == "cpu" || s == "cuda" || s.rfind("cuda:", 0) == 0 ? std::string()
                                                                     : "expected cpu, cuda or cuda:K, found '" + s + "'";
      });
  app.add_option("--progress-every", f.progress_every,
                 "seconds between progress lines (training, checkpoint saves) when stdout is not a terminal (0: every "
                 "update; default: FSDP_PROGRESS_EVERY or 5)")
      ->check(fsdp::cli::real(0, 1e6));
  app.add_flag("--no-progress", f.no_progress, "no progress lines, checkpoint saves included (same as FSDP_PROGRESS=off)");
  app.add_option("--straggler-factor", f.straggler_factor,
                 "name a rank busy (wall - blocked in collectives) more than F x the other ranks' median for "
                 "--straggler-window steps in a row (F > 1; 0: off)")
      ->check(fsdp::cli::real(0, 1e6));
  app.add_option("--straggler-window", f.straggler_window, "consecutive slow steps before a rank is named")
      ->check(CLI::Range(1, 1000000));
  if (const std::optional<int> rc = fsdp::cli::parse(app, argc, argv)) return rc;
  if (!f.max_memory.empty()) {
    try {
      fsdp::cli::parse_bytes(f.max_memory);
    } catch (const fsdp::Error& e) {
      throw fsdp::UsageError(std::string("--max-memory: ") + e.what());
    }
  }
  if (f.straggler_factor > 0 && !(f.straggler_factor > 1))
    throw fsdp::UsageError("--straggler-factor " + std::to_string(f.straggler_factor) +
                           ": expected a factor > 1 (e.g. 1.5: 50% slower than the other ranks) or 0 to turn the "
                           "monitor off");
  return std::nullopt;
}

// What this rank sent in the training steps: the last step's counters and
// every step's bytes (the traffic lines at the end).
struct Sent {
  fsdp::CommCounters before, after;  // around the last step
  int64_t total = 0, inter_host = 0, inter_logical = 0, steps = 0;
  void add_step() {
    total += after.total_bytes_sent() - before.total_bytes_sent();
    inter_host += after.total_bytes_inter_host() - before.total_bytes_inter_host();
    inter_logical += after.total_bytes_inter_host_logical() - before.total_bytes_inter_host_logical();
    ++steps;
  }
};

// Rank 0, after the ledger: the last step's bytes against the FSDP guide's
// formulas (fsdp::plan::traffic: every micro-step all-gathers; the gradients
// are reduced every micro-step, or once with --no-sync), then every step's
// bytes by host tier.
void print_traffic(const fsdp::FullyShardedModel& model, const Flags& f, const Sent& sent) {
  using fsdp::memory::format_bytes;
  fsdp::plan::PlanOptions po;
  po.world = model.comm()->world_size();
  po.shard_group = model.shard_group()->world_size();
  po.micro_steps = f.accum;
  int64_t padded = 0;
  for (auto& u : model.units()) padded += u.padded_numel;
  const auto strategy = model.options().strategy;
  fsdp::plan::Traffic plan = fsdp::plan::traffic(strategy, padded, po);
  po.micro_steps = f.no_sync ? 1 : f.accum;
  const fsdp::plan::Traffic reduces = fsdp::plan::traffic(strategy, padded, po);
  plan.reduce_scatter = reduces.reduce_scatter;
  plan.all_reduce = reduces.all_reduce;
  const int64_t last = sent.after.total_bytes_sent() - sent.before.total_bytes_sent();
  if (!model.replica_group()) {
    std::printf("  traffic   %14s   sent by this rank in the last step | plan: %s (fsdp::plan::traffic)\n",
                format_bytes(last).c_str(), format_bytes(plan.total()).c_str());
  } else {
    // HYBRID: the shard group's all-gathers and reduce-scatters stay inside
    // the host; the replicas' all-reduce of each shard crosses hosts.
    const int64_t inter = sent.after.total_bytes_inter_host() - sent.before.total_bytes_inter_host();
    std::printf("  traffic   %14s   sent by this rank in the last step: intra-host %s, inter-host %s | plan: %s "
                "inside the shard group, %s across (fsdp::plan::traffic)\n",
                format_bytes(last).c_str(), format_bytes(last - inter).c_str(), format_bytes(inter).c_str(),
                format_bytes(plan.all_gather + plan.reduce_scatter).c_str(), format_bytes(plan.all_reduce).c_str());
  }
  std::printf("%s", examples::traffic_by_tier_line(sent.total, sent.inter_host, sent.inter_logical, sent.steps).c_str());
}

// One run of the demo, its flags parsed. Collective; returns the exit code.
int train(const Flags& f, const examples::StepHooks& hooks) {
  // First: a CUDA device loads CUDA support before anything (the seed
  // below, a communicator) asks libtorch about CUDA (fsdp/device.h).
  const torch::Device dev = fsdp::parse_device(f.device);
  fsdp::CommOptions copts;
  if (dev.is_cuda()) copts.backend = fsdp::CommBackend::NCCL;  // ranks sharing one GPU: FSDP_BACKEND=gloo
  // Time blocked in collectives: busy = wall - blocked names a straggler.
  auto waits = std::make_shared<fsdp::WaitClock>();
  auto comm = fsdp::with_wait_clock(fsdp::make_communicator_from_env(copts), waits);
  const int rank = comm->rank();
  if (!f.trace_dir.empty()) fsdp::trace::start(f.trace_dir, rank, comm->world_size());
  // Flight recorder dumps (a failed collective, SIGUSR1) go next to the
  // checkpoints unless FSDP_FLIGHT_DIR / fsdp run --flight-dir says.
  if (!f.ckpt_dir.empty()) fsdp::flight::set_default_dir(f.ckpt_dir + "/flight");
  if (!f.max_memory.empty()) fsdp::set_device_memory_limit(dev, fsdp::cli::parse_bytes(f.max_memory));

  torch::manual_seed(0);
  TinyModel net;
  fsdp::FsdpOptions opts;
  opts.strategy = fsdp::parse_strategy(f.strategy);
  opts.wrap = fsdp::WrapPolicy::size_based(f.min_params);
  opts.device = dev;
  auto model = fsdp::fully_shard(net, comm, opts);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(f.lr));
  fsdp::verify_optimizer(*model, opt);
  if (rank == 0) std::printf("%s", model->describe_units().c_str()), std::fflush(stdout);

  int start = 0;
  if (f.resume && !f.ckpt_dir.empty()) {
    auto r = fsdp::load_checkpoint(*model, &opt, f.ckpt_dir);
    start = r.found ? r.train_state.value("step", 0) : 0;
    if (rank == 0 && r.found)
      std::printf("resumed from %s at step %d%s\n", r.path.c_str(), start, r.note.empty() ? "" : ("; " + r.note).c_str());
    if (rank == 0 && !r.found) std::printf("no checkpoint in %s yet: starting fresh\n", f.ckpt_dir.c_str());
  }

  torch::manual_seed(1000 + rank);  // each rank its own data, as in the FSDP guide
  auto data = torch::randn({f.micro_bs, 512}).to(model->options().device);
  // Progress lines on rank 0; checkpoint and weight saves show theirs the same way.
  fsdp::ProgressOptions po;
  po.rank = rank;
  po.enabled = !f.no_progress;
  po.interval_s = f.progress_every;
  fsdp::CheckpointOptions ckpt_opts;
  ckpt_opts.progress = po;
  po.label = "train";
  po.unit = "steps";
  po.total = f.epochs;
  po.initial = std::min(start, f.epochs);
  po.rate_scale = double(f.micro_bs) * f.accum * comm->world_size();
  po.rate_unit = "samples/s";
  fsdp::Progress progress(po);
  // Per-rank busy time every step; a rank slower than the factor x the
  // others' median for the window's steps in a row is named.
  std::optional<fsdp::StragglerMonitor> stragglers;
  if (f.straggler_factor > 0) stragglers.emplace(comm, f.straggler_factor, f.straggler_window);
  if (stragglers) stragglers->set_logging(false);  // printed below with the epoch lines
  Sent sent;

  for (int epoch = start; epoch < f.epochs; ++epoch) {
    sent.before = comm->counters();
    const auto t0 = std::chrono::steady_clock::now();
    const double waited0 = waits->seconds();
    fsdp::set_step(epoch);
    {
      fsdp::PhaseScope phase(fsdp::Phase::DATA);  // one fixed batch: nothing to load
      if (hooks.data) hooks.data(rank, epoch);
    }
    if (hooks.step) hooks.step(rank, epoch);
    fsdp::trace::Span step_span("step", "step");
    if (step_span.active()) step_span.arg("step", epoch);
    opt.zero_grad();
    torch::Tensor loss;
    for (int micro = 0; micro < f.accum; ++micro) {
      // --no-sync: the gradients of all but the last micro-step stay local.
      std::optional<fsdp::FullyShardedModel::NoSyncGuard> local;
      if (f.no_sync && micro < f.accum - 1) local.emplace(model->no_sync());
      {
        fsdp::PhaseScope phase(fsdp::Phase::FORWARD);
        loss = model.forward(data).sum() / f.accum;
      }
      fsdp::PhaseScope phase(fsdp::Phase::BACKWARD);
      loss.backward();
    }
    {
      FSDP_TRACE_SPAN("optimizer_step", "optim");
      fsdp::PhaseScope phase(fsdp::Phase::OPTIMIZER);
      opt.step();
    }
    if (step_span.active()) step_span.arg("loss", loss.item<double>());
    step_span.end();
    if (rank == 0)
      fsdp::progress::clear_line(), std::printf("epoch %d loss %.6f\n", epoch, loss.item<double>()), std::fflush(stdout);
    if (!f.ckpt_dir.empty() && f.ckpt_every > 0 && (epoch + 1) % f.ckpt_every == 0) {
      fsdp::PhaseScope phase(fsdp::Phase::CHECKPOINT);
      fsdp::save_checkpoint(*model, &opt, f.ckpt_dir, epoch + 1, {{"step", epoch + 1}}, ckpt_opts);
    }
    sent.after = comm->counters();  // before the monitor's own all-gather
    sent.add_step();
    if (stragglers) {
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      auto rep = stragglers->observe(wall - (waits->seconds() - waited0));  // collective
      // Quiet when healthy: a line only when a rank is named (and the summary at the end).
      if (rank == 0 && !rep.message.empty()) fsdp::progress::clear_line(), std::printf("%s\n", rep.message.c_str());
    }
    char loss_text[32];
    std::snprintf(loss_text, sizeof loss_text, "%.6f", loss.item<double>());
    progress.update(epoch + 1, {{"loss", loss_text}});
  }

  progress.finish();
  if (stragglers && rank == 0 && !stragglers->summary().empty()) std::printf("%s\n", stragglers->summary().c_str());
  if (sent.steps == 0) sent.after = sent.before = comm->counters();
  auto ledger = model->ledger(&opt);
  if (rank == 0) std::printf("\n%s", ledger.str().c_str()), print_traffic(*model, f, sent);
  if (!f.save.empty()) {
    fsdp::save_full(*model, f.save, ckpt_opts.progress);
    if (rank == 0) std::printf("saved full weights to %s\n", f.save.c_str());
  }
  if (!f.trace_dir.empty()) fsdp::trace::stop();
  comm->barrier()->wait();
  if (!f.trace_dir.empty() && rank == 0)
    std::printf("trace: %s (fsdp report %s -o report.html)\n", fsdp::trace::merge(f.trace_dir).c_str(),
                f.trace_dir.c_str());
  return 0;
}

}  // namespace

int run(int argc, char** argv, const examples::StepHooks& hooks) {
  return fsdp::cli::run_program("tiny", [&] {
    fsdp::init();  // the counting allocator (ledger, --max-memory) and SIGPIPE, before any tensor
    Flags f;
    if (const std::optional<int> rc = parse_flags(argc, argv, f)) return *rc;
    return train(f, hooks);
  });
}

}  // namespace tiny
