// GPT-mini's training run (see train.h): the stages of train() in the order
// they happen, the helpers they share above them.
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "step_hooks.h"
#include "traffic_line.h"
#include "usage.h"
#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/config.h"
#include "fsdp/deferred.h"
#include "fsdp/device.h"
#include "fsdp/errors.h"
#include "fsdp/flight.h"
#include "fsdp/fully_shard.h"
#include "fsdp/replicas.h"
#include "fsdp/memory.h"
#include "fsdp/optim.h"
#include "fsdp/param_init.h"
#include "fsdp/plan.h"
#include "fsdp/progress.h"
#include "fsdp/state_dict.h"
#include "fsdp/straggler.h"
#include "fsdp/trace.h"
#include "gpt/data.h"
#include "gpt/model.h"
#include "gpt/plan_gpt.h"
#include "gpt/train.h"

namespace gpt {
namespace {

[[noreturn]] void usage_error(const std::string& msg) { throw fsdp::UsageError(msg); }

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
// linear weights) only, the default of fsdp::decay_groups. Its step is one
// fused kernel per group (fsdp::FusedAdamW).
std::unique_ptr<torch::optim::AdamW> make_optimizer(const fsdp::FullyShardedModel& m, const Args& a) {
  const auto base = torch::optim::AdamWOptions(a.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(a.weight_decay);
  return std::make_unique<fsdp::FusedAdamW>(fsdp::decay_groups(m, base, a.weight_decay), base);
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
}

// "r0 12.3 MiB (peak 20.1 MiB, cached 4.0 MiB)  r1 ...": held bytes, the allocator cache beside them.
std::string memory_line(fsdp::Communicator& comm) {
  const auto st = fsdp::memory::stats();
  auto mine = torch::tensor({double(st.current), double(st.peak), double(st.cached)}, torch::kDouble);
  auto all = torch::empty({comm.world_size() * 3}, torch::kDouble);
  comm.all_gather(mine, all, {"memory stats"})->wait();
  auto b = [&](int i) { return fsdp::memory::format_bytes(int64_t(all[i].item<double>())); };
  std::string s;
  for (int r = 0; r < comm.world_size(); r++)
    s += (r ? "  r" : "r") + std::to_string(r) + " " + b(3 * r) + " (peak " + b(3 * r + 1) + ", cached " +
         b(3 * r + 2) + ")";
  return s;
}

// Wrapped through the shared_ptr: call() on it reaches the non-const forward().
using Model = fsdp::Sharded<std::shared_ptr<gpt::GPTImpl>>;

// --device: "cuda" is cuda:LOCAL_RANK (main parsed it first, loading CUDA
// support before anything asked libtorch about CUDA).
torch::Device parse_device(const std::string& s) { return fsdp::parse_device(s); }

// --backend auto: NCCL when the ranks compute on GPUs and each rank of this
// host has one of its own (NCCL refuses two ranks on one GPU); Gloo
// otherwise, which stages GPU tensors through host memory.
fsdp::CommBackend choose_backend(const Args& a) {
  if (a.backend == "nccl") return fsdp::CommBackend::NCCL;
  if (a.backend == "gloo" || parse_device(a.device).is_cpu()) return fsdp::CommBackend::GLOO;
  const fsdp::config::EnvConfig env = fsdp::config::read_env();
  const int local = env.local_world_size > 0 ? int(env.local_world_size) : 1;
  return fsdp::cuda_device_count() >= local ? fsdp::CommBackend::NCCL : fsdp::CommBackend::GLOO;
}

// A batch where the model computes.
gpt::data::Batch on_device(gpt::data::Batch b, Model& model) {
  const torch::Device d = model->options().device;
  if (d.is_cpu()) return b;
  return {b.x.to(d, /*non_blocking=*/false), b.y.to(d, /*non_blocking=*/false)};
}

// Mean validation loss over eval_batches micro-batches per rank, then over ranks.
double evaluate(Model& model, fsdp::Communicator& comm, const gpt::data::Tokens& val,
                const gpt::data::Order& order, int64_t batches) {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t e = 0; e < batches; e++) {
    auto b = on_device(gpt::data::eval_batch(val, order, e, comm.rank()), model);
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
    auto logits = model.forward(idx.to(model->options().device))[0][int64_t(t) - 1].to(torch::kFloat).cpu();  // [V]
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
// The stages of train(), in order.

// This rank's place in the run.
// Where this run's trace goes: --trace DIR; with --replicas, each group's
// ranks into DIR/group<g> (fsdp report DIR reads them all).
std::string trace_dir(const Args& a) {
  if (a.replicas <= 0) return a.trace;
  const auto g = fsdp::config::read_env().replica_group;
  return g ? a.trace + "/group" + std::to_string(*g) : a.trace;  // no group: ReplicaGroups says so
}

struct Run {
  fsdp::CommPtr comm;
  std::shared_ptr<fsdp::WaitClock> waits;  // time blocked in collectives
  int rank = 0, N = 1;
  bool lead = false;
  // CPU ranks whose communicator maps each other's memory: units then keep
  // one copy per host (host-shared), and the plans count them so.
  bool shares_host = false;
};

Run start_run(const Args& a) {
  try {  // a bad FSDP_PROGRESS / FSDP_PROGRESS_EVERY is the user's flag error (exit 2), found before step 1
    fsdp::ProgressOptions check;
    check.enabled = false;
    fsdp::Progress probe(check);
  } catch (const fsdp::Error& e) {
    throw fsdp::UsageError(e.what());
  }
  fsdp::CommOptions copts;
  if (a.timeout > 0) copts.timeout = std::chrono::milliseconds(int64_t(a.timeout * 1000));
  copts.backend = choose_backend(a);
  Run run;
  run.comm = fsdp::make_communicator_from_env(copts);
  // Time blocked in collectives, so a step's busy time (wall - blocked) shows
  // which rank the others wait for (fsdp/straggler.h).
  run.waits = std::make_shared<fsdp::WaitClock>();
  run.comm = fsdp::with_wait_clock(run.comm, run.waits);
  run.rank = run.comm->rank(), run.N = run.comm->world_size();
  run.lead = run.rank == 0;
  run.shares_host = a.device == "cpu" && run.comm->shares_host_memory();
  if (int th = a.threads ? a.threads : default_threads(*run.comm)) torch::set_num_threads(th);
  if (a.resume && a.ckpt_dir.empty()) throw fsdp::UsageError("--resume needs --ckpt-dir DIR (where to look)");
  if (a.save_async && a.ckpt_dir.empty())
    throw fsdp::UsageError("--save-async needs --ckpt-dir DIR (where the checkpoints go)");
  if (!a.trace.empty()) fsdp::trace::start(trace_dir(a), run.rank, run.N);
  // Flight recorder dumps (a failed collective, SIGUSR1) go next to the
  // checkpoints unless FSDP_FLIGHT_DIR / fsdp run --flight-dir says.
  if (!a.ckpt_dir.empty()) fsdp::flight::set_default_dir(a.ckpt_dir + "/flight");
  return run;
}

struct Data {
  gpt::data::Tokens train, val;
  gpt::data::Order order;
  bool eval_on = false;
};

// Every rank reads the same stream and picks its rows by the order.
Data load_data(const Args& a, const Run& run) {
  Data d;
  if (!a.text.empty()) {
    auto s = gpt::data::split(gpt::data::encode(gpt::data::read_texts(a.text)));
    d.train = std::move(s.train);
    d.val = std::move(s.val);
  } else {
    d.train = gpt::data::read_tokens(a.data, a.cfg.vocab);
  }
  if (!a.val.empty()) d.val = gpt::data::read_tokens(a.val, a.cfg.vocab);
  // Replica groups: group g's rank r reads the rows of rank g x N + r of
  // an order over every group's ranks (a group that sits a step out skips
  // its rows: that step's batch shrinks).
  const int64_t ranks = run.N * std::max<int64_t>(1, a.replicas);
  d.order = gpt::data::Order{a.cfg.seq, a.batch, a.accum, ranks, a.shuffle == "on", a.seed};
  gpt::data::row_offset(d.order, int64_t(d.train.size()), 0);  // throws: data shorter than --seq
  d.eval_on = a.eval_every > 0 && !d.val.empty();
  if (d.eval_on) {
    try {
      gpt::data::row_offset(d.order, int64_t(d.val.size()), 0);
    } catch (const fsdp::Error& e) {
      throw fsdp::Error(std::string("validation data: ") + e.what());
    }
  }
  if (run.lead && a.eval_every > 0 && !d.eval_on)
    std::printf("note: no validation data (give --val FILE.bin or use --text); validation off\n");
  return d;
}

fsdp::FsdpOptions fsdp_options(const Args& a) {
  fsdp::FsdpOptions fopts;
  fopts.device = parse_device(a.device);
  fopts.strategy = fsdp::parse_strategy(a.strategy);
  fopts.wrap = wrap_policy(a.wrap);
  if (a.dtype == "bf16") fopts.mixed_precision.param_dtype = torch::kBFloat16;
  fopts.shard_group_size = a.shard_group;
  // --ac: blocks recompute their forward in backward (each is called through fsdp::call).
  if (const int every = gpt::recompute_every(a.ac))
    fopts.recompute = fsdp::RecomputePolicy::every_kth<gpt::BlockImpl>(every, "Block");
  if (a.prefetch) {
    fopts.backward_prefetch = fsdp::BackwardPrefetch::BACKWARD_PRE;
    fopts.forward_prefetch = true;
  }
  return fopts;
}

// Initial weights depend on --seed and each parameter's name only
// (docs/GPT_MINI.md), so they are the same at any world size and with either
// construction. Sharded: the module tree is built without memory and each
// unit gets its values while it is sharded; --init then reads each rank's
// slices only. Eager: the whole model on every rank first.
Model build_model(const Args& a, const Run& run, const fsdp::FsdpOptions& fopts) {
  const fsdp::ParamInit init = fsdp::default_param_init(a.seed);
  if (a.construct == "sharded") {
    gpt::GPT net{nullptr};
    {
      fsdp::DeferredInit deferred;
      net = gpt::GPT(a.cfg);
    }
    fsdp::FsdpOptions o = fopts;
    // With --init the file overwrites every value: zeros are the cheapest start.
    o.param_init = a.init.empty() ? init : [](const fsdp::InitTarget&, torch::Tensor& v) { v.zero_(); };
    Model model = fsdp::fully_shard(net.ptr(), run.comm, o);
    if (!a.init.empty()) {
      fsdp::ckpt::LoadOptions lo;
      lo.allow_dtype_cast = true;  // e.g. weights saved in bf16
      const int64_t bytes = fsdp::load_full(*model, a.init, lo);
      std::printf("init: rank %d read %s of %s (its shards' slices) bytes_read=%lld\n", run.rank,
                  fsdp::memory::format_bytes(bytes).c_str(), a.init.c_str(), (long long)bytes);
      std::fflush(stdout);
    }
    return model;
  }
  gpt::GPT net(a.cfg);
  fsdp::initialize(*net, init);
  if (!a.init.empty()) load_init(*run.comm, net, a.init);  // every rank reads; checked names and shapes
  return fsdp::fully_shard(net.ptr(), run.comm, fopts);
}

// The planner on GPT-mini: `units` from the wrapped model (--plan) or from
// the flags alone (the budget check before anything is built).
fsdp::plan::Plan gpt_plan(const Args& a, const Run& run, int N, fsdp::ShardingStrategy strategy,
                          const std::vector<fsdp::plan::UnitSpec>& units) {
  // train_step drops the logits once the loss is computed.
  gpt::GptShape shape{a.cfg.layers, a.cfg.dim, a.cfg.heads, a.cfg.vocab, a.cfg.seq, a.batch};
  shape.sdpa = a.cfg.sdpa;
  shape.caller_holds_logits = false;
  fsdp::plan::PlanOptions po;
  po.world = N;
  po.strategy = strategy;
  po.param_bytes = a.dtype == "bf16" ? 2 : 4;
  po.optimizer = fsdp::plan::parse_optimizer("adamw");  // gpt's optimizer: fsdp::FusedAdamW
  po.micro_steps = static_cast<int>(a.accum);
  po.no_sync = a.accum > 1;  // train_step: micro-steps 0..K-2 under no_sync
  po.prefetch = a.prefetch ? 1 : 0;
  po.async_checkpoint = a.save_async;
  // What this run's communicator does (the planner asks the same rule the
  // layout does whether each unit is host-shared then).
  po.share_host = run.shares_host;
  const int act_bytes = po.param_bytes;
  return fsdp::plan::make_plan(units, gpt::gpt_activations(shape, act_bytes, a.ac).total, po,
                               gpt::gpt_released(shape, a.wrap, act_bytes, a.ac),
                               gpt::gpt_recompute(shape, a.wrap, act_bytes, a.ac));
}

std::vector<fsdp::plan::UnitSpec> flag_units(const Args& a) {
  // train_step drops the logits once the loss is computed.
  gpt::GptShape shape{a.cfg.layers, a.cfg.dim, a.cfg.heads, a.cfg.vocab, a.cfg.seq, a.batch};
  shape.sdpa = a.cfg.sdpa;
  shape.caller_holds_logits = false;
  return gpt::gpt_units(shape, a.wrap);
}

// --max-memory: a run the planner can tell will not fit is refused before
// anything is built, naming the term and what would fit.
void check_budget(const Args& a, const Run& run, const fsdp::FsdpOptions& fopts) {
  if (a.max_memory.empty() || a.no_budget_check) return;
  using fsdp::memory::format_bytes;
  const int64_t limit = fsdp::cli::parse_bytes(a.max_memory);
  const auto units = flag_units(a);
  const fsdp::plan::Plan p = gpt_plan(a, run, run.N, fopts.strategy, units);
  const std::string budget = "--max-memory " + a.max_memory + " (" + format_bytes(limit) + ")";
  const bool eager_too_big = a.construct == "eager" && p.P_full > limit;
  if (eager_too_big && p.peak <= limit)
    throw fsdp::Error("this run cannot fit " + budget + ": eager construction builds the whole model on every "
                      "rank before sharding, and its parameters alone are P = " + format_bytes(p.P_full) +
                      " (fp32). Fix: --construct sharded (each rank then holds its shards and one parameter "
                      "at a time; the plan's peak is " + format_bytes(p.peak) + " at N=" + std::to_string(run.N) +
                      ").");
  if (p.peak <= limit) return;
  const int64_t rest = p.rest, working = p.working + p.staging, act = p.A;
  const int64_t biggest = std::max({rest, working, act});
  const bool replicated = fopts.strategy == fsdp::ShardingStrategy::NO_SHARD;
  const std::string rest_name = replicated ? "P+G+O" : "(P+G+O)/N";
  const std::string term = biggest == rest      ? rest_name + (replicated ? ", the model state NO_SHARD replicates on every rank"
                                                                          : ", the sharded model state")
                           : biggest == working ? "the unsharded units (P_block and what is gathered with it)"
                                                : "A, the activations";
  std::string fix;
  const auto full = fsdp::ShardingStrategy::FULL_SHARD;
  int fit_n = 0;
  for (int n = run.N; n <= 65536 && !fit_n; n = n < 64 ? n + 1 : n * 2)
    if (gpt_plan(a, run, n, full, units).peak <= limit) fit_n = n;
  if (fopts.strategy != full && gpt_plan(a, run, run.N, full, units).peak <= limit)
    fix = "--strategy full at this N (its peak: " + format_bytes(gpt_plan(a, run, run.N, full, units).peak) + ")";
  else if (fit_n)
    fix = "N = " + std::to_string(fit_n) + " ranks or more with --strategy full (peak " +
          format_bytes(gpt_plan(a, run, fit_n, full, units).peak) + ")";
  else
    fix = "no N fits with FULL_SHARD: lower A (a smaller --batch or --seq) or P_block (a finer --wrap)";
  if (biggest == act && fix.rfind("no N", 0) != 0) fix += ", or lower A with a smaller --batch";
  // Activations the largest term and no recomputation asked for: --ac block
  // first, when it fits at this N.
  if (biggest == act && a.ac == "none") {
    Args with_ac = a;
    with_ac.ac = "block";
    const int64_t peak_ac = gpt_plan(with_ac, run, run.N, fopts.strategy, units).peak;
    if (peak_ac <= limit)
      fix = "--ac block (each block keeps only its input and recomputes its activations in backward: peak " +
            format_bytes(peak_ac) + " at this N), or " + fix;
  }
  throw fsdp::Error("this run cannot fit " + budget + ": the planner's peak per rank at N=" + std::to_string(run.N) +
                    " with " + fsdp::to_string(fopts.strategy) + " is " + format_bytes(p.peak) + " = " + rest_name + " " +
                    format_bytes(rest) + " + unsharded units " + format_bytes(working) + " + activations " +
                    format_bytes(act) + "; the largest term is " + term + ". Fix: " + fix +
                    (eager_too_big ? "; and --construct sharded: eager construction holds the whole model's "
                                     "parameters (P = " + format_bytes(p.P_full) + ") on every rank first"
                                   : std::string()) +
                    " (--no-budget-check runs it anyway, to see where it runs out).");
}

void print_run(const Args& a, const Run& run, const Data& d, const fsdp::FsdpOptions& fopts, Model& model,
               int64_t tokens_per_step) {
  const int N = run.N;
  std::printf("gpt: %s\n", a.cfg.str().c_str());
  std::printf("data: %zu train tokens, %zu val tokens, order %s\n", d.train.size(), d.val.size(),
              d.order.shuffle ? "shuffled" : "deterministic");
  std::printf("fsdp: %s, world %d, wrap %s, dtype %s, %d thread(s)/rank\n", fsdp::to_string(fopts.strategy), N,
              fopts.wrap.description.c_str(), a.dtype.c_str(), torch::get_num_threads());
  std::printf("train: %lld steps x (%d ranks x %lld rows x %lld accum x %lld tokens) = %lld tokens/step, "
              "lr %.2e -> %.2e, warmup %lld\n",
              (long long)a.steps, N, (long long)a.batch, (long long)a.accum, (long long)a.cfg.seq,
              (long long)tokens_per_step, a.lr, a.min_lr, (long long)a.warmup);
  if (model->replica_group())
    std::printf("hybrid: shard groups of %d ranks, %d replicas (gradients all-reduced across them)\n",
                model->shard_group()->world_size(), model->replica_group()->world_size());
  const auto recomputed = model->recomputed();
  if (!recomputed.empty())
    std::printf("activation checkpointing (--ac %s): %zu of %lld blocks recompute their forward in backward\n",
                a.ac.c_str(), recomputed.size(), (long long)a.cfg.layers);
  std::printf("%s\n", model->describe_units().c_str());
  std::fflush(stdout);
}

// The planner on this run: the real units, GPT-mini's activation estimate.
fsdp::plan::Plan plan_run(const Args& a, const Run& run, const fsdp::FsdpOptions& fopts, Model& model) {
  auto plan = gpt_plan(a, run, run.N, fopts.strategy, fsdp::plan::units_from(model->units()));
  if (run.lead) std::printf("%s\n", plan.str().c_str()), std::fflush(stdout);
  return plan;
}

// --resume: model shards, optimizer state and the step; the data position
// is a function of the step (docs/GPT_MINI.md's order), so nothing else is
// needed. Returns the first step to run.
//
// At another world size the shards are loaded resharded, and the data
// position still follows from the step: row j = s x (N x B x K) + ..., so
// with the same rows per step (--global-batch) step s starts at the same
// global row at any N. The checkpoint records its rows per step; a run
// with other rows per step is told where it continues.
int64_t resume(const Args& a, const Run& run, Model& model, torch::optim::Optimizer& opt) {
  if (!a.resume) return 0;
  int64_t first_step = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = fsdp::load_checkpoint(*model, &opt, a.ckpt_dir);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.found) {
    first_step = r.train_state.value("step", int64_t(0));
    const int64_t rows = run.N * a.batch * a.accum;
    const int64_t saved_rows = r.train_state.value("global_batch", int64_t(0));
    if (run.lead) {
      std::printf("resumed from %s: step %lld (saved at world size %d, %s)%s\n", r.path.c_str(),
                  (long long)first_step, r.saved_world_size, r.saved_strategy.c_str(),
                  r.note.empty() ? "" : ("; " + r.note).c_str());
      std::printf("loaded the checkpoint: %.1f MB in %.3f s (rank 0)\n", r.bytes_read / 1e6, load_s);
      std::printf("resumed step %lld at world size %d (was %d); accumulation %lld (global batch %lld rows = %d ranks "
                  "x %lld rows x %lld)\n",
                  (long long)first_step, run.N, r.saved_world_size, (long long)a.accum, (long long)rows, run.N,
                  (long long)a.batch, (long long)a.accum);
      if (saved_rows > 0 && saved_rows != rows)
        std::printf("note: the checkpoint trained %lld rows per step, this run %lld: the data continues at row "
                    "%lld x %lld of the order, not where the checkpoint's run would have (--global-batch %lld keeps "
                    "it)\n",
                    (long long)saved_rows, (long long)rows, (long long)first_step, (long long)rows,
                    (long long)saved_rows);
    }
  } else if (run.lead) {
    std::printf("no checkpoint in %s yet: starting at step 0\n", a.ckpt_dir.c_str());
  }
  return first_step;
}

using Clock = std::chrono::steady_clock;

struct StepResult {
  double loss = 0;         // this rank's mean over the micro-steps
  double norm = 0, lr = 0;
  int64_t sent = 0;        // bytes sent inside the step's span
  int64_t sent_inter = 0;  // of which to ranks on another host
  int64_t sent_inter_logical = 0;  // what sent_inter would have been uncompressed (FSDP_COMPRESS)
  Clock::time_point t0;    // the step's start (its time runs to after the checkpoint)
  double waited0 = 0;      // the wait clock at t0
  bool applied = true;     // false: the replica groups dropped the step
};

// Bytes this rank sent in the training steps (the ledger's traffic lines).
struct Sent {
  int64_t total = 0, inter_host = 0;  // of which to ranks on another host
  int64_t inter_logical = 0;          // what inter_host would have been uncompressed
  void add(const StepResult& r) { total += r.sent, inter_host += r.sent_inter, inter_logical += r.sent_inter_logical; }
};

// One optimizer step inside its trace span: K micro-steps, clip, AdamW.
StepResult train_step(const Args& a, const Run& run, Model& model, torch::optim::Optimizer& opt, const Data& d,
                      int64_t step, const examples::StepHooks& hooks, fsdp::ReplicaGroups* replicas,
                      int64_t data_rank) {
  // The step span covers training only: evaluation traffic stays outside
  // the report's per-step traffic (compared with 3P / 2P).
  fsdp::trace::Span step_span("step", "step");
  if (step_span.active()) step_span.arg("step", step);
  StepResult r;
  const int64_t sent0 = run.comm->counters().total_bytes_sent();
  const int64_t inter0 = run.comm->counters().total_bytes_inter_host();
  const int64_t logical0 = run.comm->counters().total_bytes_inter_host_logical();
  r.t0 = Clock::now();
  r.waited0 = run.waits->seconds();
  if (hooks.step) hooks.step(run.rank, step);
  r.lr = lr_at(a, step);
  set_lr(opt, r.lr);

  // K micro-steps; gradients of the first K-1 stay local (no_sync), the
  // last backward reduce-scatters their sum. Dividing each loss by K makes
  // the step's gradient the mean over all N*B*K rows.
  double loss_sum = 0;
  for (int64_t k = 0; k < a.accum; k++) {
    gpt::data::Batch b;
    {
      fsdp::PhaseScope phase(fsdp::Phase::DATA);
      if (hooks.data) hooks.data(run.rank, step);
      b = on_device(gpt::data::batch(d.train, d.order, step, k, data_rank), model);  // x, y [B,T]
    }
    auto micro = [&] {
      torch::Tensor loss;
      {
        fsdp::PhaseScope phase(fsdp::Phase::FORWARD);
        auto logits = model.forward(b.x);  // [B,T,V]
        loss = gpt::loss(logits, b.y);
      }
      fsdp::PhaseScope phase(fsdp::Phase::BACKWARD);
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
  // Replica groups: the mean over the step's quorum, and the vote.
  if (replicas) r.applied = replicas->commit();
  fsdp::PhaseScope optimizer_phase(fsdp::Phase::OPTIMIZER);
  r.norm = a.clip > 0 && r.applied ? model->clip_grad_norm(a.clip) : 0.0;
  {
    FSDP_TRACE_SPAN("optimizer_step", "optim");
    if (r.applied) opt.step();
    opt.zero_grad();
  }
  r.loss = loss_sum / double(a.accum);
  if (step_span.active()) step_span.arg("loss", r.loss);
  step_span.end();
  r.sent = run.comm->counters().total_bytes_sent() - sent0;
  r.sent_inter = run.comm->counters().total_bytes_inter_host() - inter0;
  r.sent_inter_logical = run.comm->counters().total_bytes_inter_host_logical() - logical0;
  return r;
}

// Mean validation loss, printed by rank 0 as "step N | val loss X". Collective.
void validate(const Args& a, const Run& run, Model& model, const Data& d, int64_t step) {
  fsdp::PhaseScope phase(fsdp::Phase::EVALUATION);
  const double vl = evaluate(model, *run.comm, d.val, d.order, a.eval_batches);
  if (run.lead) fsdp::progress::clear_line(), std::printf("step %5lld | val loss %.4f\n", (long long)step, vl), std::fflush(stdout);
}

// How rank 0 shows progress (fsdp/progress.h): --no-progress, --progress-every.
// The checkpoint saves and the final --save show theirs the same way.
fsdp::ProgressOptions progress_options(const Args& a, const Run& run) {
  fsdp::ProgressOptions po;
  po.rank = run.rank;
  po.enabled = !a.no_progress;
  po.interval_s = a.progress_every;
  return po;
}

// The training steps' progress: steps, ETA, loss, tokens/s.
fsdp::ProgressOptions train_progress(const Args& a, fsdp::ProgressOptions po, int64_t first_step,
                                     int64_t tokens_per_step) {
  po.label = "train";
  po.unit = "steps";
  po.total = a.steps;
  po.initial = std::min(first_step, a.steps);
  po.rate_scale = double(tokens_per_step);
  po.rate_unit = "tok/s";
  return po;
}

// --ckpt-dir: sharded checkpoints of the model and AdamW (--save-async: in
// the background), each reported by rank 0.
class Checkpoints {
 public:
  Checkpoints(const Args& a, const Run& run, Model& model, torch::optim::Optimizer& opt,
              const fsdp::ProgressOptions& progress)
      : a_(a), run_(run), model_(model), opt_(opt) {
    opts_.async = a.save_async;
    opts_.progress = progress;
    if (a.save_async) fsdp::prepare_background_saves(*model, &opt);  // not inside the first save
  }

  // Collective: the checkpoint of `done` steps, after the previous one is committed.
  void save(int64_t done) {
    fsdp::PhaseScope phase(fsdp::Phase::CHECKPOINT);
    committed();
    auto r = fsdp::save_checkpoint(*model_, &opt_, a_.ckpt_dir, done,
                                   {{"step", done}, {"seed", a_.seed}, {"shuffle", a_.shuffle}, {"world", run_.N},
                                    {"global_batch", run_.N * a_.batch * a_.accum}},
                                   opts_);
    if (!run_.lead) return;
    fsdp::progress::clear_line();
    if (r.in_background)
      std::printf("checkpoint %s in the background (training blocked %.3f s; snapshot %s)\n", r.path.c_str(),
                  r.seconds, fsdp::memory::format_bytes(r.snapshot_bytes).c_str());
    else
      std::printf("checkpoint %s (%.2f s)\n", r.path.c_str(), r.seconds);
    std::fflush(stdout);
  }

  // The previous background save (--save-async), once committed: reported once.
  void committed() {
    const std::optional<fsdp::ckpt::SaveResult> w = fsdp::wait_for_checkpoint(*model_);
    if (!w || !run_.lead) return;
    fsdp::progress::clear_line();
    std::printf("checkpoint %s committed (%.2f s in the background; training waited %.3f s for the snapshot)\n",
                w->path.c_str(), w->seconds, w->snapshot_wait_seconds);
    std::fflush(stdout);
  }

 private:
  const Args& a_;
  const Run& run_;
  Model& model_;
  torch::optim::Optimizer& opt_;
  fsdp::CheckpointOptions opts_;
};

// Per-rank busy time (wall - blocked in collectives) every step; a rank
// slower than --straggler-factor x the median for --straggler-window steps
// in a row is named. Quiet when healthy: nothing per step, one summary line
// at the end. None with --straggler-factor 0.
std::optional<fsdp::StragglerMonitor> straggler_monitor(const Args& a, const Run& run) {
  std::optional<fsdp::StragglerMonitor> m;
  if (a.straggler_factor <= 0) return m;
  m.emplace(run.comm, a.straggler_factor, int(a.straggler_window));
  m->set_logging(false);  // report_straggler prints, between the step lines
  return m;
}

// Collective: this step's busy seconds to the monitor; rank 0 prints a rank it names.
void report_straggler(const Run& run, fsdp::StragglerMonitor& m, double busy_seconds) {
  const fsdp::StragglerReport rep = m.observe(busy_seconds);
  if (!run.lead || rep.message.empty()) return;
  fsdp::progress::clear_line();
  std::printf("%s\n", rep.message.c_str());
  std::fflush(stdout);
}

// The step line every --log-every steps. Collective: every rank takes this
// branch at the same steps.
void log_step(const Args& a, const Run& run, int64_t step, const StepResult& r, double ms, int64_t tokens_per_step) {
  if (!(step % a.log_every == 0 || step + 1 == a.steps)) return;
  const double loss = fsdp::all_reduce_mean(*run.comm, r.loss, {"train loss"});
  const std::string mem = memory_line(*run.comm);
  if (!run.lead) return;
  fsdp::progress::clear_line();
  std::printf("step %5lld | loss %.4f | lr %.2e | norm %6.3f | %7.1f ms/step | %7.0f tok/s | %s\n",
              (long long)step, loss, r.lr, r.norm, ms, double(tokens_per_step) / (ms / 1000.0), mem.c_str());
  std::fflush(stdout);
}

// The ledger: measured memory terms against the FSDP guide's formulas (and the
// plan's peak and traffic against the measured ones with --plan). Every
// rank's ledger is returned (--rank-memory prints each).
fsdp::Ledger print_ledger(const Run& run, Model& model, torch::optim::Optimizer& opt,
                          const std::optional<fsdp::plan::Plan>& plan, int64_t steps_run, double seconds,
                          const Sent& sent, int64_t tokens_per_step) {
  const fsdp::Ledger ledger = model->ledger(&opt);
  if (!run.lead) return ledger;
  std::printf("trained %lld steps in %.1f s (%.0f tokens/s)\n", (long long)steps_run, seconds,
              double(tokens_per_step * steps_run) / std::max(seconds, 1e-9));
  std::printf("%s\n", ledger.str().c_str());
  // The ledger measures on the device's allocator (on a GPU, the caching
  // allocator); its reserved bytes beside it.
  const torch::Device dev = model->options().device;
  if (!dev.is_cpu()) {
    const fsdp::DeviceMemory m = fsdp::device_memory(dev);
    std::printf("device memory (rank 0, %s): peak allocated %s, allocated %s, reserved %s peak_allocated=%lld\n",
                dev.str().c_str(), fsdp::memory::format_bytes(m.peak_allocated).c_str(),
                fsdp::memory::format_bytes(m.allocated).c_str(), fsdp::memory::format_bytes(m.reserved).c_str(),
                (long long)m.peak_allocated);
  }
  // Exact integers for the tests (tests/test_hybrid.cpp): bytes rank 0 sent
  // in the training steps, by tier (hosts as the same-host transport sees them).
  std::printf("%s", examples::traffic_by_tier_line(sent.total, sent.inter_host, sent.inter_logical, steps_run).c_str());
  if (plan) {
    std::printf("plan vs measured (rank 0): peak %s predicted, %s measured (%.3f); traffic %s/step predicted, "
                "%s/step measured in the training steps (%.3f)\n",
                fsdp::memory::format_bytes(plan->peak).c_str(), fsdp::memory::format_bytes(ledger.peak).c_str(),
                double(plan->peak) / std::max<double>(1, ledger.peak),
                fsdp::memory::format_bytes(plan->traffic.total()).c_str(),
                fsdp::memory::format_bytes(steps_run > 0 ? sent.total / steps_run : 0).c_str(),
                steps_run > 0 && sent.total > 0 ? double(plan->traffic.total()) * steps_run / double(sent.total) : 0.0);
  }
  std::fflush(stdout);
  return ledger;
}

// --rank-memory: one line per rank, the tensors against the plan, then the
// process's peak resident memory (VmHWM) in its parts (fsdp/memory.h,
// ProcessMemory), as text and as bytes for scripts (make scale's table).
void print_rank_memory(const Args& a, const Run& run, const fsdp::FsdpOptions& fopts, Model& model,
                       const std::optional<fsdp::plan::Plan>& plan, int64_t construction_peak,
                       const fsdp::Ledger& ledger) {
  using fsdp::memory::format_bytes;
  const auto ms = fsdp::memory::stats();
  const int64_t planned =
      plan ? plan->peak : gpt_plan(a, run, run.N, fopts.strategy, fsdp::plan::units_from(model->units())).peak;
  const fsdp::memory::ProcessMemory pm = fsdp::memory::process_memory();
  std::printf("rank %d memory: plan peak %s | construction %s | training peak %s | from start %s | VmHWM %s = "
              "%s at start + %s code since + %s tensors + %s comm + %s cache + %s malloc used + %s malloc free + "
              "%s unexplained + %s elsewhere (comm buffers at most %s; host-shared %s, PSS now %s) "
              "| bytes: plan_peak=%lld construction=%lld training_peak=%lld from_start=%lld vmhwm=%lld "
              "at_start=%lld code_since=%lld tensors=%lld comm=%lld cache=%lld malloc_used=%lld malloc_free=%lld "
              "unexplained=%lld elsewhere=%lld comm_high=%lld fixed=%lld shared=%lld pss=%lld "
              "ledger_A=%lld ledger_C=%lld ledger_peak=%lld ledger_predicted_peak=%lld ledger_notes=%zu\n",
              run.rank, format_bytes(planned).c_str(), format_bytes(construction_peak).c_str(),
              format_bytes(ms.peak).c_str(), format_bytes(ms.high_water).c_str(), format_bytes(pm.vmhwm).c_str(),
              format_bytes(pm.at_start).c_str(), format_bytes(pm.code_since).c_str(),
              format_bytes(pm.tensors).c_str(), format_bytes(pm.comm).c_str(), format_bytes(pm.cache).c_str(),
              format_bytes(pm.malloc_other).c_str(), format_bytes(pm.malloc_free).c_str(),
              format_bytes(pm.unexplained).c_str(), format_bytes(pm.elsewhere).c_str(),
              format_bytes(pm.comm_high).c_str(), format_bytes(pm.shared).c_str(),
              pm.pss >= 0 ? format_bytes(pm.pss).c_str() : "unknown", (long long)planned,
              (long long)construction_peak, (long long)ms.peak, (long long)ms.high_water, (long long)pm.vmhwm,
              (long long)pm.at_start, (long long)pm.code_since, (long long)pm.tensors, (long long)pm.comm,
              (long long)pm.cache, (long long)pm.malloc_other, (long long)pm.malloc_free,
              (long long)pm.unexplained, (long long)pm.elsewhere, (long long)pm.comm_high, (long long)pm.fixed(),
              (long long)pm.shared, (long long)pm.pss, (long long)ledger.A, (long long)ledger.C,
              (long long)ledger.peak, (long long)ledger.predicted_peak, ledger.notes.size());
  std::fflush(stdout);
}

// After training: --sample, --save, --trace (each collective).
void finish(const Args& a, const Run& run, Model& model, const fsdp::ProgressOptions& popts) {
  if (a.sample > 0) {
    const std::string text = sample(model, *run.comm, a);
    if (run.lead) {
      std::printf("sample (%lld bytes, %s):\n----\n%s%s\n----\n", (long long)a.sample,
                  a.top_k ? ("top-k " + std::to_string(a.top_k) + ", seed " + std::to_string(a.sample_seed)).c_str()
                          : "greedy",
                  a.prompt.c_str(), text.c_str());
      std::fflush(stdout);
    }
  }
  if (!a.save.empty()) {
    auto full = model->full_state(0);  // collective: (name, tensor) on rank 0 only
    if (run.lead) {
      const int64_t bytes = save_full(a.save, full, a.cfg, popts);
      std::printf("saved %zu tensors (%s) to %s\n", full.size(), fsdp::memory::format_bytes(bytes).c_str(),
                  a.save.c_str());
    }
  }
  if (!a.trace.empty()) {
    fsdp::trace::stop();
    run.comm->barrier()->wait();  // every rank's file is written
    if (run.lead) std::printf("trace: %s\n", fsdp::trace::merge(trace_dir(a)).c_str());
  }
}

// --global-batch: the accumulation that keeps ROWS per step at this world
// size; refused when it does not divide.
int64_t choose_accum(const Args& a, int N) {
  if (a.global_batch <= 0) return a.accum;
  const int64_t per_micro = a.batch * N;  // rows of one micro-step over all ranks
  if (a.global_batch % per_micro == 0) return a.global_batch / per_micro;
  const int64_t lower = a.global_batch / per_micro * per_micro;
  std::string fix = "--global-batch " + std::to_string(lower + per_micro);
  if (lower > 0) fix = "--global-batch " + std::to_string(lower) + " or " + fix;
  usage_error("--global-batch " + std::to_string(a.global_batch) + " cannot be kept at world size " +
              std::to_string(N) + ": it must be a multiple of --batch " + std::to_string(a.batch) + " x " +
              std::to_string(N) + " ranks = " + std::to_string(per_micro) + " rows (the accumulation would be " +
              std::to_string(a.global_batch) + "/" + std::to_string(per_micro) + "). Use " + fix +
              ", or a --batch that divides " + std::to_string(a.global_batch) + "/" + std::to_string(N) +
              " (every world size the job may run at must divide the global batch by --batch)");
}

}  // namespace

int train(const Args& args, const examples::StepHooks& hooks) {
  const Run run = start_run(args);
  Args a = args;
  a.accum = choose_accum(args, run.N);
  const Data data = load_data(a, run);
  const fsdp::FsdpOptions fopts = fsdp_options(a);
  check_budget(a, run, fopts);
  Model model = build_model(a, run, fopts);
  const int64_t construction_peak = fsdp::memory::stats().high_water;  // from process start
  auto opt = make_optimizer(*model, a);
  fsdp::verify_optimizer(*model, *opt);
  const int64_t tokens_per_step = run.N * a.batch * a.accum * a.cfg.seq;
  if (run.lead) print_run(a, run, data, fopts, model, tokens_per_step);
  std::optional<fsdp::plan::Plan> plan;
  if (a.plan) plan = plan_run(a, run, fopts, model);
  const int64_t first_step = resume(a, run, model, *opt);
  const fsdp::ProgressOptions popts = progress_options(a, run);
  Checkpoints checkpoints(a, run, model, *opt, popts);
  fsdp::Progress progress(train_progress(a, popts, first_step, tokens_per_step));
  std::optional<fsdp::StragglerMonitor> stragglers = straggler_monitor(a, run);

  // --replicas: this run is one replica group (fsdp/replicas.h).
  std::unique_ptr<fsdp::ReplicaGroups> replicas;
  int64_t data_rank = run.rank;
  if (a.replicas > 0) {
    fsdp::ReplicaOptions ro;
    ro.start_step = first_step;
    replicas = std::make_unique<fsdp::ReplicaGroups>(*model, *opt, ro);
    if (replicas->group() >= a.replicas)
      usage_error("replica group " + std::to_string(replicas->group()) + " (FSDP_REPLICA_GROUP) is not below --replicas " +
                  std::to_string(a.replicas) + ": number the groups 0 to " + std::to_string(a.replicas - 1));
    data_rank = replicas->group() * run.N + run.rank;
  }

  // The training loop.
  const auto run_start = Clock::now();
  Sent sent;  // inside the steps' spans (what the plan predicts)
  int64_t applied = 0;  // steps this run trained and applied (a group that healed part-way skipped the others)
  std::string last_groups;  // the last quorum's groups, printed when they change
  int64_t coordinator_lives = 0;  // coordinator restarts seen, printed when they change
  for (int64_t step = first_step; step < a.steps; step = replicas ? replicas->step() : step + 1) {
    if (replicas) {
      const fsdp::StepQuorum& q = replicas->start_step();
      step = q.step;
      if (step >= a.steps) break;  // healed past the end: the others finished
      if (q.healed && run.lead)
        std::printf("replica group %d healed from group %d at step %lld: %.1f MB in %.3f s (rank 0; before it %.3f s "
                    "waiting for the source to reach the step)\n",
                    replicas->group(), q.heal_source, (long long)step, q.heal_bytes / 1e6, q.heal_seconds,
                    q.heal_wait_seconds),
            std::fflush(stdout);
    }
    fsdp::set_step(step);
    if (data.eval_on && step % a.eval_every == 0) validate(a, run, model, data, step);
    const StepResult r = train_step(a, run, model, *opt, data, step, hooks, replicas.get(), data_rank);
    if (replicas && run.lead) {
      // The quorum when it changes, a step is dropped, or the step is logged.
      const fsdp::StepQuorum& q = replicas->quorum();
      std::string groups;
      for (int g : q.groups) groups += (groups.empty() ? "" : ",") + std::to_string(g);
      const bool changed = groups != last_groups;
      last_groups = groups;
      const bool restarted = replicas->coordinator_restarts() != coordinator_lives;
      coordinator_lives = replicas->coordinator_restarts();
      if (changed || restarted || !q.committed || step % a.log_every == 0)
        std::printf("step %5lld | quorum %lld: groups %s %s%s%s\n", (long long)step, (long long)q.id, groups.c_str(),
                    q.committed ? "committed" : "dropped: ", q.committed ? "" : q.dropped.c_str(),
                    restarted ? " (the coordinator restarted meanwhile: this rank went on with the new one)" : "");
      std::fflush(stdout);
    }
    if (!r.applied) continue;
    ++applied;
    sent.add(r);
    if (!a.ckpt_dir.empty() && a.ckpt_every > 0 && (step + 1) % a.ckpt_every == 0 && step + 1 < a.steps)
      checkpoints.save(step + 1);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - r.t0).count();
    if (stragglers) report_straggler(run, *stragglers, ms / 1000.0 - (run.waits->seconds() - r.waited0));
    log_step(a, run, step, r, ms, tokens_per_step);
    char loss_text[32];
    std::snprintf(loss_text, sizeof loss_text, "%.4f", r.loss);
    progress.update(step + 1, {{"loss", loss_text}});
  }
  progress.finish();
  if (stragglers && run.lead && !stragglers->summary().empty())
    std::printf("%s\n", stragglers->summary().c_str()), std::fflush(stdout);
  if (data.eval_on) validate(a, run, model, data, a.steps);
  if (!a.ckpt_dir.empty() && first_step < a.steps) checkpoints.save(a.steps);
  checkpoints.committed();  // the last one is on disk before the run reports
  const double seconds = std::chrono::duration<double>(Clock::now() - run_start).count();

  if (replicas && run.lead)
    std::printf("replica group %d: %lld bytes sent to other groups; the coordinator restarted %lld time(s) under it\n",
                replicas->group(), (long long)replicas->bytes_sent(), (long long)replicas->coordinator_restarts());
  const fsdp::Ledger ledger = print_ledger(run, model, *opt, plan, applied, seconds, sent, tokens_per_step);
  if (a.rank_memory) print_rank_memory(a, run, fopts, model, plan, construction_peak, ledger);
  finish(a, run, model, popts);
  return 0;
}
}  // namespace gpt
