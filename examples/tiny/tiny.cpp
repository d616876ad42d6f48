// fsdp-cpp: the FSDP guide's demo in C++ — TinyModel, FULL_SHARD, Adam, gradient
// accumulation, loss per epoch, the ledger next to the guide's formulas, and
// the full weights saved at the end.
//
//   build/bin/fsdp run -n 2 -- build/bin/tiny [--strategy full|grad-op|none|hybrid|hybrid-zero2]
//
// Reads top to bottom like the FSDP guide's Python demo (docs/GUIDE.md).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "cli_checks.h"
#include "usage.h"
#include "fault_injection.h"
#include "traffic_line.h"
#include "fsdp/flight.h"
#include "fsdp/fsdp.h"
#include "fsdp/progress.h"
#include "fsdp/straggler.h"

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

int main(int argc, char** argv) {
  try {
    fsdp::init();  // the counting allocator (ledger, --max-memory) and SIGPIPE, before any tensor
  } catch (const std::exception& e) {  // an environment variable set wrong (docs/CONFIG.md)
    std::fprintf(stderr, "tiny: error: %s\n", e.what());
    return 1;
  }
  CLI::App app{"the FSDP guide's demo: TinyModel trained with Adam and gradient accumulation"};
  std::string strategy = "full", save = "fsdp_model.safetensors", ckpt_dir, trace_dir, max_memory, device = "cpu";
  int epochs = 3, accum = 4, micro_bs = 64, ckpt_every = 0;
  int64_t min_params = 2048;
  double lr = 2e-4;
  bool resume = false, no_sync = false, no_progress = false;
  double progress_every = -1, straggler_factor = 1.5;
  int straggler_window = 5;
  app.add_option("--strategy", strategy, "full | grad-op | none | hybrid | hybrid-zero2 (hybrid: shard groups of one host)")
      ->check(CLI::IsMember({"full", "grad-op", "none", "hybrid", "hybrid-zero2"}));
  app.add_option("--epochs", epochs, "optimizer steps (the FSDP guide calls them epochs)")->check(CLI::Range(1, 1000000));
  app.add_option("--accum", accum, "micro-steps per optimizer step")->check(CLI::Range(1, 10000));
  app.add_option("--batch", micro_bs, "micro-batch per rank")->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", lr, "Adam learning rate")->check(fsdp::cli::real(1e-30, 1e3));
  app.add_option("--min-params", min_params, "size-based wrap policy threshold")->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  app.add_flag("--no-sync", no_sync, "accumulate with no_sync (reduce once per step)");
  app.add_option("--save", save, "full weights (safetensors) written at the end; '' = none");
  app.add_option("--ckpt-dir", ckpt_dir, "sharded checkpoints directory");
  app.add_option("--ckpt-every", ckpt_every, "save a sharded checkpoint every N steps")->check(CLI::Range(0, 1 << 30));
  app.add_flag("--resume", resume, "continue from the latest checkpoint in --ckpt-dir when there is one");
  app.add_option("--trace", trace_dir, "write a Chrome trace per rank into DIR (then: fsdp report DIR)");
  app.add_option("--max-memory", max_memory, "per-rank memory budget, e.g. 8MiB (enforced by the device's allocator: the counting allocator on the CPU, the caching allocator on a GPU)");
  app.add_option("--device", device, "cpu | cuda (cuda:LOCAL_RANK) | cuda:K (ranks sharing a GPU: FSDP_BACKEND=gloo)")
      ->check([](const std::string& s) {
        return s == "cpu" || s == "cuda" || s.rfind("cuda:", 0) == 0 ? std::string()
                                                                     : "expected cpu, cuda or cuda:K, found '" + s + "'";
      });
  app.add_option("--progress-every", progress_every,
                 "seconds between progress lines (training, checkpoint saves) when stdout is not a terminal (0: every "
                 "update; default: FSDP_PROGRESS_EVERY or 5)")
      ->check(fsdp::cli::real(0, 1e6));
  app.add_flag("--no-progress", no_progress, "no progress lines, checkpoint saves included (same as FSDP_PROGRESS=off)");
  app.add_option("--straggler-factor", straggler_factor,
                 "name a rank busy (wall - blocked in collectives) more than F x the other ranks' median for "
                 "--straggler-window steps in a row (F > 1; 0: off)")
      ->check(fsdp::cli::real(0, 1e6));
  app.add_option("--straggler-window", straggler_window, "consecutive slow steps before a rank is named")
      ->check(CLI::Range(1, 1000000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "tiny: usage error: %s\nrun 'tiny --help' for the flags\n", e.what());
    return 2;
  }
  if (!max_memory.empty()) {
    try {
      fsdp::cli::parse_bytes(max_memory);
    } catch (const fsdp::Error& e) {
      std::fprintf(stderr, "tiny: usage error: --max-memory: %s\nrun 'tiny --help' for the flags\n", e.what());
      return 2;
    }
  }
  if (straggler_factor > 0 && !(straggler_factor > 1)) {
    std::fprintf(stderr,
                 "tiny: usage error: --straggler-factor %g: expected a factor > 1 (e.g. 1.5: 50%% slower than the "
                 "other ranks) or 0 to turn the monitor off\n",
                 straggler_factor);
    return 2;
  }
  try {
    // First: a CUDA device loads CUDA support before anything (the seed
    // below, a communicator) asks libtorch about CUDA (fsdp/device.h).
    const torch::Device dev = fsdp::parse_device(device);
    // The flags reach the library's reporters (checkpoint saves) through the environment.
    if (no_progress) ::setenv("FSDP_PROGRESS", "off", 1);
    if (progress_every >= 0) ::setenv("FSDP_PROGRESS_EVERY", std::to_string(progress_every).c_str(), 1);
    fsdp::CommOptions copts;
    // On GPUs, NCCL unless FSDP_BACKEND=gloo (ranks sharing one GPU).
    if (dev.is_cuda()) copts.backend = fsdp::CommBackend::NCCL;
    auto comm = fsdp::make_communicator_from_env(copts);
    // Time blocked in collectives: busy = wall - blocked names a straggler.
    auto waits = std::make_shared<fsdp::WaitClock>();
    comm = fsdp::with_wait_clock(comm, waits);
    const int rank = comm->rank();
    if (!trace_dir.empty()) fsdp::trace::start(trace_dir, rank, comm->world_size());
    // Flight recorder dumps (a failed collective, SIGUSR1) go next to the
    // checkpoints unless FSDP_FLIGHT_DIR / fsdp run --flight-dir says.
    if (!ckpt_dir.empty()) fsdp::flight::set_default_dir(ckpt_dir + "/flight");
    if (!max_memory.empty()) fsdp::set_device_memory_limit(dev, fsdp::cli::parse_bytes(max_memory));

    torch::manual_seed(0);
    TinyModel net;
    fsdp::FsdpOptions opts;
    opts.strategy = fsdp::parse_strategy(strategy);
    opts.wrap = fsdp::WrapPolicy::size_based(min_params);
    opts.device = dev;
    auto model = fsdp::fully_shard(net, comm, opts);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(lr));
    fsdp::verify_optimizer(*model, opt);
    if (rank == 0) std::printf("%s", model->describe_units().c_str()), std::fflush(stdout);

    int start = 0;
    if (resume && !ckpt_dir.empty()) {
      auto r = fsdp::load_checkpoint(*model, &opt, ckpt_dir);
      if (r.found) {
        start = r.train_state.value("step", 0);
        if (rank == 0)
          std::printf("resumed from %s at step %d%s\n", r.path.c_str(), start,
                      r.note.empty() ? "" : ("; " + r.note).c_str());
      } else if (rank == 0) {
        std::printf("no checkpoint in %s yet: starting fresh\n", ckpt_dir.c_str());
      }
    }

    torch::manual_seed(1000 + rank);  // each rank its own data, as in the FSDP guide
    auto data = torch::randn({micro_bs, 512}).to(model->options().device);
    fsdp::CommCounters before, after;  // around the last step (the monitor's all-gather excluded)
    int64_t train_sent = 0, train_inter = 0;  // every step's, the same way (the traffic-by-tier line)
    fsdp::ProgressOptions po;
    po.label = "train";
    po.unit = "steps";
    po.total = epochs;
    po.initial = std::min(start, epochs);
    po.rank = rank;
    po.enabled = !no_progress;
    po.interval_s = progress_every;
    po.rate_scale = double(micro_bs) * accum * comm->world_size();
    po.rate_unit = "samples/s";
    fsdp::Progress progress(po);
    std::optional<fsdp::StragglerMonitor> stragglers;
    if (straggler_factor > 0) {
      stragglers.emplace(comm, straggler_factor, straggler_window);
      stragglers->set_logging(false);  // printed below with the epoch lines
    }
    for (int epoch = start; epoch < epochs; ++epoch) {
      before = comm->counters();
      const auto t0 = std::chrono::steady_clock::now();
      const double waited0 = waits->seconds();
      fsdp::set_step(epoch);
      {
        // The data is one fixed batch; the phase still says where a stuck
        // loader would be (FSDP_INJECT_DATA_HANG=RANK:STEP, tests of the watchdog).
        fsdp::PhaseScope phase(fsdp::Phase::DATA);
        examples::inject_data_hang(rank, epoch);
      }
      examples::inject_step_delay(rank);  // fault injection: FSDP_INJECT_STEP_DELAY=RANK:MS (tests of the monitor)
      fsdp::trace::Span step_span("step", "step");
      if (step_span.active()) step_span.arg("step", epoch);
      opt.zero_grad();
      torch::Tensor loss;
      for (int step = 0; step < accum; ++step) {
        auto run = [&] {
          {
            fsdp::PhaseScope phase(fsdp::Phase::FORWARD);
            auto out = model.forward(data);
            loss = out.sum() / accum;
          }
          fsdp::PhaseScope phase(fsdp::Phase::BACKWARD);
          loss.backward();
        };
        if (no_sync && step < accum - 1) {
          auto guard = model->no_sync();
          run();
        } else {
          run();
        }
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
      if (!ckpt_dir.empty() && ckpt_every > 0 && (epoch + 1) % ckpt_every == 0) {
        fsdp::PhaseScope phase(fsdp::Phase::CHECKPOINT);
        fsdp::save_checkpoint(*model, &opt, ckpt_dir, epoch + 1, {{"step", epoch + 1}});
      }
      after = comm->counters();
      train_sent += after.total_bytes_sent() - before.total_bytes_sent();
      train_inter += after.total_bytes_inter_host() - before.total_bytes_inter_host();
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
    if (start >= epochs) after = before = comm->counters();
    auto ledger = model->ledger(&opt);
    if (rank == 0) {
      std::printf("\n%s", ledger.str().c_str());
      int64_t sent = after.total_bytes_sent() - before.total_bytes_sent();
      const double N = comm->world_size();
      const double P = static_cast<double>(ledger.P_full);
      // Passes of the whole model per optimizer step: all-gathers (forward,
      // and backward for FULL_SHARD) every micro-step; a reduction every
      // micro-step, or once with no_sync. NO_SHARD's all-reduce counts 2.
      const int reduces = no_sync ? 1 : accum;
      const bool hybrid = strategy == "hybrid" || strategy == "hybrid-zero2";
      const int passes = strategy == "full" || strategy == "hybrid" ? 2 * accum + reduces
                         : strategy == "grad-op" || strategy == "hybrid-zero2" ? accum + reduces
                                                                               : 2 * reduces;
      if (!hybrid) {
        std::printf("  traffic   %14s   sent by this rank in the last step | guide: %d passes x (N-1)/N x P = %s\n",
                    fsdp::memory::format_bytes(sent).c_str(), passes,
                    fsdp::memory::format_bytes(static_cast<int64_t>(passes * (N - 1) / N * P)).c_str());
      } else {
        // Inside the shard group of S: the passes over (S-1)/S; across the R
        // replicas: each reduction's shard all-reduced, 2 (R-1)/R x P/S.
        const double S = model->shard_group()->world_size(), R = N / S;
        const int64_t inter = after.total_bytes_inter_host() - before.total_bytes_inter_host();
        std::printf("  traffic   %14s   sent by this rank in the last step: intra-host %s, inter-host %s | guide: "
                    "%d passes x (S-1)/S x P = %s inside the group, %d x 2(R-1)/R x P/S = %s across (S=%g, R=%g)\n",
                    fsdp::memory::format_bytes(sent).c_str(), fsdp::memory::format_bytes(sent - inter).c_str(),
                    fsdp::memory::format_bytes(inter).c_str(), passes,
                    fsdp::memory::format_bytes(static_cast<int64_t>(passes * (S - 1) / S * P)).c_str(), reduces,
                    fsdp::memory::format_bytes(static_cast<int64_t>(reduces * 2 * (R - 1) / R * P / S)).c_str(), S, R);
      }
      // gpt's line: every training step's bytes by tier, exact totals.
      std::printf("%s", examples::traffic_by_tier_line(train_sent, train_inter, epochs - std::min(start, epochs)).c_str());
    }
    if (!save.empty()) {
      fsdp::save_full(*model, save);
      if (rank == 0) std::printf("saved full weights to %s\n", save.c_str());
    }
    if (!trace_dir.empty()) fsdp::trace::stop();
    comm->barrier()->wait();
    if (!trace_dir.empty() && rank == 0) std::printf("trace: %s (fsdp report %s -o report.html)\n", fsdp::trace::merge(trace_dir).c_str(), trace_dir.c_str());
    return 0;
  } catch (const c10::Error& e) {  // libtorch's message, without its C++ backtrace
    std::fprintf(stderr, "tiny: error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tiny: error: %s\n", e.what());
    return 1;
  }
}
