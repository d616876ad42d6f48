// fsdp-cpp bench: one GPT-mini training step under every FSDP configuration,
// beside the same step with no communication at all (the lower bound).
//
//   build/bin/fsdp run -n 2 -- build/bin/bench_train [--json FILE] [--steps 10] [--warmup 3]
//   build/bin/fsdp run -n 1 -- build/bin/bench_train --device cuda --dim 768 --layers 12 --heads 12 --seq 1024 ...
//
// Model and batch follow docs/GPT_MINI.md's benchmark size (V=256 T=128 d=256 L=6
// h=4, 4.90 M parameters), B=4 rows per rank, one compute thread per rank,
// one FSDP unit per transformer block (the root unit holds the embeddings,
// the final LayerNorm and the head), AdamW. --device cuda[:K] runs the model,
// the batch and the engine's buffers on a GPU (FsdpOptions::device; cuda =
// cuda:LOCAL_RANK) and adds the device's peak (tests/gpu/run.sh, docs/GPU.md).
//
// One process per rank runs every configuration in turn, each on a freshly
// built and wrapped model (so start-up and rendezvous are paid once):
//   compute fp32 / bf16        the unwrapped model, same per-rank batch, no
//                              communication: what the step costs at best
//   FULL_SHARD | SHARD_GRAD_OP | NO_SHARD
//     x prefetch off | on      on = backward_prefetch BACKWARD_PRE + forward_prefetch
//     x fp32 | bf16            bf16 = mixed_precision.param_dtype
//     x ac off | on            on = FsdpOptions::recompute on every block
//                              (--ac off,on: activation checkpointing's cost
//                              in step time and what it saves in peak)
//
// Measured per configuration, after --warmup steps:
//   step      each rank times each step (zero_grad .. optimizer step) with no
//             barrier in the loop; a step's time is the slowest rank's, the
//             figure is the median over --steps steps
//   peak      counting allocator peak (fsdp::memory, reset after warm-up),
//             the largest over ranks
//   RSS       VmHWM after resetting it (clear_refs) at the same point; the
//             process's ru_maxrss where that is not allowed
//   faults    page faults (minor + major) per measured step, largest rank
//   device    on a GPU: the CUDA caching allocator's peak of allocated bytes
//             (torch.cuda.max_memory_allocated's figure), reset after warm-up,
//             largest rank (fsdp::device_memory; -1 on the CPU)
//   cache     bytes the counting allocator caches for reuse after the
//             measured steps (not part of peak; part of RSS), largest rank
// --rounds R runs every configuration in turn R times (a fresh model each
// round) and takes the median over all rounds' steps, so a busy moment of the
// machine is spread over every configuration instead of landing on one.
//   traffic   comm->counters() deltas over the measured steps / steps (rank 0)
//   ledger    model->ledger(&opt): peak vs the bound
//             (P+G+O)/N + 2 P_block + A and vs the engine's own prediction
// Rank 0 prints a table and appends one JSON line per configuration to --json.
#include <CLI/CLI.hpp>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/init.h"
#include "fsdp/memory.h"
#include "fsdp/optim.h"
#include "gpt/model.h"
#include "fsdp/device.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Variant {
  std::string name;  // the table's first column
  bool wrapped = true;
  fsdp::ShardingStrategy strategy = fsdp::ShardingStrategy::FULL_SHARD;
  bool prefetch = false;
  bool bf16 = false;
  bool ac = false;  // activation checkpointing on every block
  bool fused = true;  // fsdp::FusedAdamW (one kernel per group) or torch::optim::AdamW
};

struct Settings {
  gpt::Config cfg;
  torch::Device device = torch::kCPU;  // where the model, the batch and the step run
  int64_t batch = 4;
  int warmup = 3, steps = 10;  // per round
  int rounds = 1;              // every configuration once per round, in turn
  int limit_all_gathers = 2;
};

// The optimizer of a configuration: AdamW's per-tensor ops or one fused kernel.
std::unique_ptr<torch::optim::AdamW> make_adamw(const Variant& v, std::vector<torch::optim::OptimizerParamGroup> groups) {
  if (v.fused) return std::make_unique<fsdp::FusedAdamW>(std::move(groups), torch::optim::AdamWOptions(3e-4));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(3e-4));
}

// The optimizer step alone, timed: on a GPU the device is synchronized
// before and after (only for this figure; the step time has no extra sync
// beyond its loss.item()).
double timed_step(torch::optim::Optimizer& opt, const torch::Device& d) {
  auto sync = [&] {
    if (d.is_cuda()) c10::impl::VirtualGuardImpl(d.type()).synchronizeDevice(d.index());
  };
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  opt.step();
  sync();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- process memory: peak RSS of one configuration -------------------------
void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (f) f << "5";  // resets VmHWM (Linux >= 4.0)
}
int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}
// ---- device memory: the CUDA caching allocator's peak -----------------------
// Its allocated bytes (not reserved): what torch.cuda.max_memory_allocated
// reports for FSDP2, so the two columns compare (fsdp/device.h). -1: a CPU run.
void reset_device_peak(const torch::Device& d) {
  if (d.is_cuda()) fsdp::reset_device_peak(d);
}
int64_t device_peak_bytes(const torch::Device& d) {
  if (d.is_cuda()) return fsdp::device_memory(d).peak_allocated;
  return -1;
}

// Minor + major page faults of this process so far.
int64_t page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_minflt) + int64_t(u.ru_majflt);
}

// ---- agreeing on numbers across ranks ----------------------------------------
// Every rank's values, rank-major. On a GPU the collective runs on device
// tensors (an NCCL communicator takes no host tensors), copied back after.
std::vector<double> gather(fsdp::Communicator& c, const std::vector<double>& v, const torch::Device& device) {
  auto in = torch::tensor(v, torch::kDouble).to(device);
  auto out = torch::empty({int64_t(v.size()) * c.world_size()}, in.options());
  c.all_gather(in, out, {"bench_train results"})->wait();
  out = out.cpu();
  return std::vector<double>(out.data_ptr<double>(), out.data_ptr<double>() + out.numel());
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// AdamW of docs/GPT_MINI.md: decay on 2-D weights only.
std::vector<torch::optim::OptimizerParamGroup> adamw_groups(const std::vector<torch::Tensor>& params,
                                                            const std::vector<size_t>& dims) {
  std::vector<torch::Tensor> decay, no_decay;
  for (size_t i = 0; i < params.size(); ++i) (dims[i] == 2 ? decay : no_decay).push_back(params[i]);
  std::vector<torch::optim::OptimizerParamGroup> g;
  for (double wd : {0.1, 0.0}) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(3e-4);
    o->betas({0.9, 0.95}).eps(1e-8).weight_decay(wd);
    g.emplace_back(wd > 0 ? decay : no_decay, std::move(o));
  }
  return g;
}

// A "Key: N kB" line of a /proc file, in bytes (0: absent).
int64_t proc_kb(const char* path, const char* key) {
  std::ifstream in(path);
  std::string line;
  const size_t k = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, k, key) == 0) return std::stoll(line.substr(k)) * 1024;
  return 0;
}

struct Measured {
  std::vector<double> step_s;  // slowest rank per step
  std::vector<double> opt_s;   // the optimizer step's part of each step, rank 0
  int64_t peak = 0;            // counting allocator, largest rank
  int64_t rss = 0;             // largest rank
  // The host: every rank's peak less its shared memory, plus the shared
  // memory once (host-shared units: every rank maps it, the host holds it
  // once; an upper bound, the ranks' peaks may fall at different moments),
  // and the sum of the ranks' proportional set sizes after the steps.
  int64_t host_rss = 0, host_pss = 0, shared = 0;
  double faults = 0;           // page faults per measured step, largest rank
  int64_t cached = 0;          // allocator cache after the measured steps, largest rank
  int64_t device_peak = -1;    // CUDA caching allocator's peak, largest rank (-1: not known)
  fsdp::CommCounters traffic;  // rank 0, per step (bytes and seconds divided by steps)
  fsdp::Ledger ledger;         // rank 0 (wrapped only)
  double loss_first = 0, loss_last = 0;
};

// Warm-up, reset the peaks, time the steps, collect. `step` returns the loss
// and leaves its optimizer step's time in `opt_last`.
template <class StepFn>
Measured measure(fsdp::Communicator& c, const Settings& s, const double& opt_last, StepFn step) {
  Measured m;
  for (int i = 0; i < s.warmup; ++i) m.loss_first = step();
  c.barrier({"bench_train warm-up done"})->wait();
  fsdp::memory::reset_peak();
  reset_peak_rss();
  reset_device_peak(s.device);
  const auto before = c.counters();
  const int64_t faults0 = page_faults();
  std::vector<double> local;
  for (int i = 0; i < s.steps; ++i) {
    auto t0 = Clock::now();
    m.loss_last = step();
    local.push_back(since(t0));
    m.opt_s.push_back(opt_last);
  }
  const auto after = c.counters();
  const double faults = double(page_faults() - faults0) / s.steps;
  const auto ms = fsdp::memory::stats();
  const int64_t peak = ms.peak, rss = peak_rss_bytes();
  for (int k = 0; k < static_cast<int>(fsdp::CollectiveKind::kCount); ++k) {
    m.traffic.by_kind[k].calls = (after.by_kind[k].calls - before.by_kind[k].calls) / s.steps;
    m.traffic.by_kind[k].bytes_sent = (after.by_kind[k].bytes_sent - before.by_kind[k].bytes_sent) / s.steps;
    m.traffic.by_kind[k].seconds = (after.by_kind[k].seconds - before.by_kind[k].seconds) / s.steps;
  }
  local.push_back(double(peak));
  local.push_back(double(rss));
  local.push_back(faults);
  local.push_back(double(ms.cached));
  local.push_back(double(device_peak_bytes(s.device)));
  local.push_back(double(proc_kb("/proc/self/status", "RssShmem:")));
  local.push_back(double(proc_kb("/proc/self/smaps_rollup", "Pss:")));
  const size_t w = local.size();
  auto all = gather(c, local, s.device);
  m.step_s.assign(s.steps, 0.0);
  for (int r = 0; r < c.world_size(); ++r) {
    for (int i = 0; i < s.steps; ++i) m.step_s[i] = std::max(m.step_s[i], all[r * w + i]);
    m.peak = std::max<int64_t>(m.peak, int64_t(all[r * w + s.steps]));
    m.rss = std::max<int64_t>(m.rss, int64_t(all[r * w + s.steps + 1]));
    m.faults = std::max(m.faults, all[r * w + s.steps + 2]);
    m.cached = std::max<int64_t>(m.cached, int64_t(all[r * w + s.steps + 3]));
    m.device_peak = std::max<int64_t>(m.device_peak, int64_t(all[r * w + s.steps + 4]));
    const int64_t shmem = int64_t(all[r * w + s.steps + 5]);
    m.host_rss += int64_t(all[r * w + s.steps + 1]) - shmem;
    m.shared = std::max(m.shared, shmem);
    m.host_pss += int64_t(all[r * w + s.steps + 6]);
  }
  m.host_rss += m.shared;
  return m;
}

// One round's figures folded into the configuration's: steps appended (the
// median is taken over every round's steps), peaks as the largest, page
// faults as the mean over rounds, traffic and ledger from the last round
// (they are the same in every round).
void fold(Measured& total, const Measured& round, int rounds_before) {
  if (rounds_before == 0) {
    total = round;
    return;
  }
  total.step_s.insert(total.step_s.end(), round.step_s.begin(), round.step_s.end());
  total.opt_s.insert(total.opt_s.end(), round.opt_s.begin(), round.opt_s.end());
  total.peak = std::max(total.peak, round.peak);
  total.rss = std::max(total.rss, round.rss);
  total.host_rss = std::max(total.host_rss, round.host_rss);
  total.host_pss = std::max(total.host_pss, round.host_pss);
  total.shared = std::max(total.shared, round.shared);
  total.faults = (total.faults * rounds_before + round.faults) / (rounds_before + 1);
  total.cached = std::max(total.cached, round.cached);
  total.device_peak = std::max(total.device_peak, round.device_peak);
  total.traffic = round.traffic;
  total.ledger = round.ledger;
  total.loss_last = round.loss_last;
}

Measured run_variant(const fsdp::CommPtr& comm, const Settings& s, const Variant& v, const torch::Tensor& idx,
                     const torch::Tensor& targets) {
  torch::manual_seed(1234);  // identical parameters on every rank
  gpt::GPT net(s.cfg);
  if (!s.device.is_cpu()) net->to(s.device);  // built on the host from the seed, then moved: the same weights
  if (!v.wrapped) {
    if (v.bf16) net->to(torch::kBFloat16);
    std::vector<torch::Tensor> params;
    std::vector<size_t> dims;
    for (auto& p : net->parameters()) {
      params.push_back(p);
      dims.push_back(p.dim());
    }
    auto opt = make_adamw(v, adamw_groups(params, dims));
    double opt_last = 0;
    return measure(*comm, s, opt_last, [&] {
      opt->zero_grad();
      auto loss = gpt::loss(net->forward(idx), targets);
      loss.backward();
      opt_last = timed_step(*opt, s.device);
      return loss.item<double>();
    });
  }
  fsdp::FsdpOptions o;
  o.device = s.device;
  o.strategy = v.strategy;
  o.wrap = fsdp::WrapPolicy::module_type<gpt::BlockImpl>("Block");
  o.limit_all_gathers = s.limit_all_gathers;
  if (v.prefetch) {
    o.backward_prefetch = fsdp::BackwardPrefetch::BACKWARD_PRE;
    o.forward_prefetch = true;
  }
  if (v.bf16) o.mixed_precision.param_dtype = torch::kBFloat16;
  if (v.ac) o.recompute = fsdp::RecomputePolicy::module_type<gpt::BlockImpl>("Block");
  auto model = fsdp::fully_shard(net, comm, o);
  std::vector<size_t> dims;
  for (auto& sh : model->named_shards()) dims.push_back(sh.full_shape.size());
  auto opt = make_adamw(v, adamw_groups(model->parameters(), dims));
  fsdp::verify_optimizer(*model, *opt);
  double opt_last = 0;
  Measured m = measure(*comm, s, opt_last, [&] {
    opt->zero_grad();
    auto loss = gpt::loss(model.forward(idx), targets);
    loss.backward();
    opt_last = timed_step(*opt, s.device);
    return loss.item<double>();
  });
  m.ledger = model->ledger(opt.get());
  return m;
}

double mib(double bytes) { return bytes / double(1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  fsdp::init();  // the counting allocator: the peaks it reports
  CLI::App app("GPT-mini training step under every FSDP configuration, beside compute only", "bench_train");
  Settings s;
  std::string json_path, strategies = "full,grad-op,none", dtypes = "fp32,bf16", prefetch = "off,on", ac = "off",
                                     optimizers = "fused";
  bool no_compute = false;
  app.add_option("--json", json_path, "append one JSON line per configuration to this file");
  app.add_option("--steps", s.steps, "measured steps per configuration and round (median over all)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", s.warmup, "steps before measuring, per configuration and round")
      ->check(CLI::Range(0, 100000));
  app.add_option("--rounds", s.rounds,
                 "rounds; each runs every configuration in turn on a freshly built model, so a slow "
                 "moment of the machine spreads over all of them instead of landing on one")
      ->check(CLI::Range(1, 1000));
  app.add_option("--batch", s.batch, "rows per rank (B)")->check(CLI::Range(1, 4096));
  app.add_option("--layers", s.cfg.layers, "transformer blocks (L)");
  app.add_option("--dim", s.cfg.dim, "width (d)");
  app.add_option("--heads", s.cfg.heads, "attention heads (h; divides d)");
  std::string attention = "matmul";
  app.add_option("--attention", attention, "matmul | sdpa (at::scaled_dot_product_attention): GPT-mini's attention")
      ->check(CLI::IsMember({"matmul", "sdpa"}));
  app.add_option("--seq", s.cfg.seq, "context length (T)");
  std::string device = "cpu";
  app.add_option("--device", device,
                 "cpu | cuda | cuda:K (cuda: cuda:LOCAL_RANK): where the model, the batch and the step run");
  app.add_option("--limit-all-gathers", s.limit_all_gathers, "FsdpOptions::limit_all_gathers");
  app.add_option("--strategies", strategies, "comma-separated subset of full,grad-op,none");
  app.add_option("--dtypes", dtypes, "comma-separated subset of fp32,bf16");
  app.add_option("--prefetch", prefetch, "comma-separated subset of off,on");
  app.add_option("--ac", ac, "activation checkpointing of every block: comma-separated subset of off,on");
  app.add_flag("--no-compute", no_compute, "skip the compute-only lower bound");
  app.add_option("--optimizers", optimizers,
                 "comma-separated subset of fused,adamw: fsdp::FusedAdamW (one kernel per group) or "
                 "torch::optim::AdamW (per-tensor ops); the 'opt ms' column is the optimizer step alone")
      ->check([](const std::string& v) {
        std::stringstream ss(v);
        for (std::string x; std::getline(ss, x, ',');)
          if (x != "fused" && x != "adamw") return "expected fused and/or adamw, found '" + x + "'";
        return std::string();
      });
  int threads = 1;
  app.add_option("--threads", threads, "compute threads per rank (torch::set_num_threads; default 1)")
      ->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  s.cfg.sdpa = attention == "sdpa";
  s.cfg.validate();
  // The device first: a GPU's CUDA support is loaded before anything asks
  // libtorch about CUDA (fsdp/device.h); "cuda" is cuda:LOCAL_RANK.
  try {
    s.device = fsdp::parse_device(device);
  } catch (const fsdp::Error& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 2;
  }

  // One compute thread per rank by default (the setting): N ranks
  // share the cores, a rank's communication threads run beside it.
  torch::set_num_threads(threads);
  auto comm = fsdp::make_communicator_from_env();
  const int N = comm->world_size(), rank = comm->rank();
  const bool lead = rank == 0;

  auto split = [](const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    for (std::string x; std::getline(ss, x, ',');)
      if (!x.empty()) out.push_back(x);
    return out;
  };
  std::vector<Variant> variants;
  const auto acs = split(ac), opts = split(optimizers);
  // " adamw" marks the unfused optimizer where both are measured.
  auto opt_tag = [&](const std::string& o) { return opts.size() > 1 || o == "adamw" ? " " + o : std::string(); };
  for (auto& o : opts)
    for (auto& d : split(dtypes))
      if (!no_compute)
        variants.push_back({"compute " + d + opt_tag(o), false, fsdp::ShardingStrategy::NO_SHARD, false, d == "bf16",
                            false, o == "fused"});
  for (auto& o : opts)
    for (auto& st : split(strategies))
      for (auto& pf : split(prefetch))
        for (auto& d : split(dtypes))
          for (auto& a : acs) {
            auto strategy = fsdp::parse_strategy(st);
            char name[64];
            std::snprintf(name, sizeof name, "%-13s pf=%-3s %s%s%s", fsdp::to_string(strategy), pf.c_str(), d.c_str(),
                          acs.size() > 1 || a == "on" ? (a == "on" ? " ac" : " -") : "", opt_tag(o).c_str());
            variants.push_back({name, true, strategy, pf == "on", d == "bf16", a == "on", o == "fused"});
          }

  // The same rows every step: timing does not depend on the data.
  torch::manual_seed(1000 + rank);
  auto idx = torch::randint(0, s.cfg.vocab, {s.batch, s.cfg.seq}, torch::kLong).to(s.device);
  auto targets = torch::randint(0, s.cfg.vocab, {s.batch, s.cfg.seq}, torch::kLong).to(s.device);

  if (lead) {
    std::printf("bench_train: GPT-mini %s, N=%d, B=%lld/rank, T=%lld, %d thread/rank, median of %d rounds x %d steps "
                "after %d, %s, device %s; faults = page faults per step, cache = allocator cache\n",
                s.cfg.str().c_str(), N, (long long)s.batch, (long long)s.cfg.seq, torch::get_num_threads(), s.rounds,
                s.steps, s.warmup, comm->describe().c_str(), s.device.str().c_str());
    std::printf("%-34s %9s %7s %7s %9s %8s %8s %8s %8s %8s %8s %9s %9s %8s\n", "config", "step ms", "x comp", "opt ms",
                "peak MiB", "RSS MiB", "cache MiB", "faults", "AG MiB", "RS MiB", "AR MiB", "comm ms", "peak/bnd", "loss");
    std::fflush(stdout);
  }
  std::vector<Measured> results(variants.size());
  for (int round = 0; round < s.rounds; ++round)
    for (size_t i = 0; i < variants.size(); ++i) fold(results[i], run_variant(comm, s, variants[i], idx, targets), round);
  double compute_s[2][2] = {{0, 0}, {0, 0}};  // [fused][bf16]
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const Variant& v = variants[vi];
    const Measured& m = results[vi];
    const double step = median(m.step_s);
    if (!v.wrapped) compute_s[v.fused][v.bf16] = step;
    const double base = compute_s[v.fused][v.bf16];
    const double opt_step = median(m.opt_s);
    const auto& t = m.traffic;
    const auto& l = m.ledger;
    // The bound: model state at rest (P+G+O)/N, two unsharded units,
    // the activations. NO_SHARD keeps replicas; its rest is P+G+O. With
    // activation checkpointing A is what forward kept plus one recompute.
    const int64_t bound = v.wrapped ? l.predicted_rest + 2 * l.P_block + l.A + l.A_recompute : 0;
    double comm_s = 0;
    for (auto& e : t.by_kind) comm_s += e.seconds;
    if (!lead) continue;
    std::printf("%-34s %9.1f %7.3f %7.2f %9.2f %8.1f %8.1f %8.0f %8.2f %8.2f %8.2f %8.1f %9s %8.4f\n",
                v.name.c_str(), step * 1e3, base > 0 ? step / base : 0.0, opt_step * 1e3, mib(m.peak), mib(m.rss),
                mib(m.cached), m.faults,
                mib(t[fsdp::CollectiveKind::ALL_GATHER].bytes_sent),
                mib(t[fsdp::CollectiveKind::REDUCE_SCATTER].bytes_sent),
                mib(t[fsdp::CollectiveKind::ALL_REDUCE].bytes_sent), comm_s * 1e3,
                bound > 0 ? std::to_string(double(m.peak) / bound).substr(0, 5).c_str() : "-", m.loss_last);
    if (m.device_peak >= 0)
      std::printf("%-34s device peak %.1f MiB (CUDA caching allocator, allocated)%s\n", "", mib(m.device_peak),
                  v.wrapped ? (", planned " + std::to_string(int64_t(mib(l.predicted_peak))) + " MiB").c_str() : "");
    std::fflush(stdout);
    if (json_path.empty()) continue;
    nlohmann::json j = {{"bench", "train"},
                        {"impl", "fsdp-cpp"},
                        {"world", N},
                        {"config", v.name},
                        {"wrapped", v.wrapped},
                        {"strategy", v.wrapped ? fsdp::to_string(v.strategy) : "compute-only"},
                        {"prefetch", v.prefetch},
                        {"dtype", v.bf16 ? "bf16" : "fp32"},
                        {"ac", v.ac},
                        {"optimizer", v.fused ? "fused_adamw" : "adamw"},
                        {"opt_step_s_median", opt_step},
                        {"batch", s.batch},
                        {"seq", s.cfg.seq},
                        {"dim", s.cfg.dim},
                        {"layers", s.cfg.layers},
                        {"heads", s.cfg.heads},
                        {"attention", s.cfg.sdpa ? "sdpa" : "matmul"},
                        {"vocab", s.cfg.vocab},
                        {"device", s.device.str()},
                        {"params", s.cfg.num_params()},
                        {"threads", torch::get_num_threads()},
                        {"step_s_median", step},
                        {"step_s", m.step_s},
                        {"step_vs_compute", base > 0 ? step / base : 0.0},
                        {"peak_bytes", m.peak},
                        {"peak_rss_bytes", m.rss},
                        {"host_peak_rss_bytes", m.host_rss},
                        {"host_pss_bytes", m.host_pss},
                        {"shared_bytes", m.shared},
                        {"host_shared", comm->shares_host_memory()},
                        {"cached_bytes", m.cached},
                        {"device_peak_bytes", m.device_peak},
                        {"page_faults_per_step", m.faults},
                        {"rounds", s.rounds},
                        {"loss_first", m.loss_first},
                        {"loss_last", m.loss_last}};
    nlohmann::json traffic = nlohmann::json::object();
    for (int k = 0; k < static_cast<int>(fsdp::CollectiveKind::kCount); ++k) {
      const auto& e = t.by_kind[k];
      if (e.calls == 0 && e.bytes_sent == 0) continue;
      traffic[fsdp::to_string(static_cast<fsdp::CollectiveKind>(k))] = {
          {"calls", e.calls}, {"bytes_sent", e.bytes_sent}, {"seconds", e.seconds}};
    }
    j["traffic_per_step"] = traffic;
    j["bytes_sent_per_step"] = t.total_bytes_sent();
    if (v.wrapped)
      j["ledger"] = {{"P", l.P},
                     {"G", l.G},
                     {"O", l.O},
                     {"P_block", l.P_block},
                     {"A", l.A},
                     {"A_recompute", l.A_recompute},
                     {"predicted_rest", l.predicted_rest},
                     {"predicted_peak", l.predicted_peak},
                     {"bound_rest_2pblock_a", bound},
                     {"peak_over_bound", double(m.peak) / double(bound)},
                     {"peak_over_predicted", double(m.peak) / double(l.predicted_peak)},
                     {"limit_all_gathers", s.limit_all_gathers}};
    std::ofstream(json_path, std::ios::app) << j.dump() << "\n";
  }
  return 0;
}
