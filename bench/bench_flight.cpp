// fsdp-cpp bench: what the flight recorder (fsdp/flight.h) costs, against a
// training step.
//
//   build/bin/bench_flight --record [--calls 200000]
//       in one process: one recorded collective (enqueue, start, 4 pieces
//       of progress, finish) in a loop, ns per collective, median of 7 runs
//   build/bin/fsdp run -n 2 -- build/bin/bench_flight --train [--steps 20] [--json FILE]
//       GPT-mini (docs/GPT_MINI.md's benchmark size: V=256 T=128 d=256 L=6
//       h=4, B=4 rows per rank, one thread per rank, FULL_SHARD, a unit per
//       block, AdamW): the median step time and the collectives per step,
//       with the recorder as the environment has it (FSDP_FLIGHT_RECORDER=off
//       turns it off). Rank 0 also measures the per-collective cost itself
//       and prints the estimated overhead: collectives per step x ns per
//       collective / step time.
// bench/run.sh runs --train with the recorder on and off in alternating
// rounds and prints both medians beside the estimate (the estimate is the
// figure to trust on a loaded machine; the A/B difference is within noise).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/flight.h"
#include "observe/flight_hooks.h"
#include "fsdp/fully_shard.h"
#include "fsdp/init.h"
#include "gpt/model.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// ns per recorded collective (the recorder's whole life cycle of one call).
double record_ns(int calls) {
  std::vector<double> runs;
  const std::string unit = "blocks.3";
  for (int run = 0; run < 7; ++run) {
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) {
      const uint64_t t = fsdp::flight::enqueue(0, "all_gather", unit, "fp32", 1 << 20, 4 << 20);
      auto p = fsdp::flight::start(t, uint64_t(i) + 1);
      for (int piece = 0; piece < 4; ++piece) {
        p->wait_on(1, fsdp::flight::Progress::RECEIVE);
        p->arrived(1 << 20);
        p->idle();
      }
      fsdp::flight::finish(t);
    }
    runs.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / calls);
  }
  return median(runs);
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::init();
  CLI::App app{"the flight recorder's cost per collective and against a GPT-mini step"};
  bool record = false, train = false;
  int calls = 200000, steps = 20, warmup = 3;
  std::string json;
  app.add_flag("--record", record, "ns per recorded collective, in this process");
  app.add_flag("--train", train, "GPT-mini steps under fsdp run (collectives per step, step time, overhead)");
  app.add_option("--calls", calls, "recorded collectives per timing run")->check(CLI::Range(1000, 100000000));
  app.add_option("--steps", steps, "measured steps")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "steps before measuring")->check(CLI::Range(0, 1000));
  app.add_option("--json", json, "append one JSON line of results to FILE");
  CLI11_PARSE(app, argc, argv);
  if (!record && !train) record = true;

  nlohmann::json out = {{"bench", "flight"}, {"recorder", fsdp::flight::enabled() ? "on" : "off"}};
  int rank = 0;
  if (train) {
    auto comm = fsdp::make_communicator_from_env();
    rank = comm->rank();
    torch::set_num_threads(1);
    gpt::Config cfg;
    cfg.vocab = 256;
    cfg.seq = 128;
    cfg.dim = 256;
    cfg.layers = 6;
    cfg.heads = 4;
    torch::manual_seed(0);
    gpt::GPT net(cfg);
    fsdp::FsdpOptions o;
    o.strategy = fsdp::ShardingStrategy::FULL_SHARD;
    o.wrap = fsdp::WrapPolicy::module_type<gpt::BlockImpl>("Block");
    auto model = fsdp::fully_shard(net.ptr(), comm, o);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4));
    torch::manual_seed(1 + rank);
    auto x = torch::randint(0, cfg.vocab, {4, cfg.seq}, torch::kLong);
    auto y = torch::randint(0, cfg.vocab, {4, cfg.seq}, torch::kLong);
    std::vector<double> times;
    int64_t calls_in_steps = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      const auto c0 = comm->counters();
      const auto t0 = Clock::now();
      opt.zero_grad();
      auto logits = model.forward(x);
      auto loss = gpt::loss(logits, y);
      loss.backward();
      opt.step();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      const auto c1 = comm->counters();
      if (s >= warmup) {
        times.push_back(dt);
        for (int k = 0; k < static_cast<int>(fsdp::CollectiveKind::kCount); ++k)
          calls_in_steps += c1.by_kind[k].calls - c0.by_kind[k].calls;
      }
    }
    // The slowest rank's median step.
    auto t = torch::tensor({median(times)}, torch::kDouble);
    comm->all_reduce(t, fsdp::ReduceOp::SUM, {"bench"})->wait();
    const double step_s = median(times);
    out["world"] = comm->world_size();
    out["step_ms"] = step_s * 1000;
    out["collectives_per_step"] = double(calls_in_steps) / steps;
  }
  if (rank == 0) {
    if (record || train) out["record_ns"] = record_ns(calls);
    if (train) {
      const double overhead = out["collectives_per_step"].get<double>() * out["record_ns"].get<double>() * 1e-9 /
                              (out["step_ms"].get<double>() / 1000);
      out["overhead_estimate"] = overhead;
      std::printf("flight recorder %s: GPT-mini FULL_SHARD at N=%d: %.1f ms/step (median of %d), %.0f collectives "
                  "per step; recording one costs %.0f ns: estimated overhead %.4f%% of a step\n",
                  fsdp::flight::enabled() ? "on" : "off", out["world"].get<int>(), out["step_ms"].get<double>(), steps,
                  out["collectives_per_step"].get<double>(), out["record_ns"].get<double>(), overhead * 100);
    } else {
      std::printf("flight recorder: %.0f ns per recorded collective (enqueue, start, 4 pieces, finish; median of 7 x "
                  "%d)\n",
                  out["record_ns"].get<double>(), calls);
    }
    if (!json.empty()) std::ofstream(json, std::ios::app) << out.dump() << "\n";
  }
  return 0;
}
