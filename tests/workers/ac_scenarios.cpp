// fsdp-cpp tests: rank-side logic of the activation checkpointing tests
// (tests/test_activation_checkpointing.cpp).
//
// ac_parity STRATEGY MODE DTYPE PREFETCH: every rank trains the same model
// twice in one process, first without activation checkpointing, then with
// FsdpOptions::recompute on every block (units) and on a Sequential's child
// (inside the root unit), from the same seeds, and compares bit for bit:
// the loss of every micro-step, the gradient shards of every step (after
// backward, before clipping), the parameters at the end. It also compares
// the collectives of every step (calls and bytes per kind) and checks the
// all-gathers per step against the strategy's count (FULL_SHARD 2 per unit
// and micro-step: the recompute shares the backward's all-gather).
//   MODE: plain (1 micro-step) | nosync (3, no_sync on the first two)
//   DTYPE: fp32 | bf16          PREFETCH: none | fwd (backward pre + forward)
//   device=D (last, optional): cpu (default) or cuda:K: the model, the data
//   and the dropout masks there (a GPU's dropout draws from the device's
//   generator, which the recompute must restore as well as the CPU's)
// The model (AcNet) is a custom module calling its blocks through
// fsdp::call with a tensor and a non-tensor argument; its blocks use dropout
// and a weight tied between the root and every block; `stage` is a
// checkpointed module around two checkpointed units (nested recomputes).
// Prints per rank:
//   ACPARITY strategy=.. mode=.. dtype=.. prefetch=.. N=.. loss_equal=0|1 grads_equal=0|1 params_equal=0|1
//            comm_equal=0|1 ag_calls=<per step, AC> ag_expected=<formula> a_plain=<A> a_ac=<A> recomputes=<calls>
#include <cstdio>

#include "fsdp/comm.h"
#include "fsdp/device.h"
#include "fsdp/fully_shard.h"
#include "fsdp/memory.h"
#include "scenario.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

struct AcBlockImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, shared{nullptr};
  torch::nn::Dropout drop{nullptr};
  AcBlockImpl(int64_t d, torch::nn::Linear tied) {
    fc1 = register_module("fc1", torch::nn::Linear(d, 2 * d + 1));  // odd sizes: padding
    fc2 = register_module("fc2", torch::nn::Linear(2 * d + 1, d));
    drop = register_module("drop", torch::nn::Dropout(0.3));
    shared = register_module("shared", tied);  // the root's: tied weights
  }
  // mask: a tensor argument without grad; scale: a non-tensor argument.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask, double scale) {
    auto h = drop(torch::tanh(fc1(x)));
    return x + fc2(h) * mask * scale + 0.1 * shared(x);
  }
};
TORCH_MODULE(AcBlock);

// A checkpointed module around two units that are checkpointed themselves:
// units gathered inside a recompute, checkpoints inside a recompute.
struct StageImpl : torch::nn::Module {
  AcBlock a{nullptr}, b{nullptr};
  explicit StageImpl(int64_t d) {
    // Their own weights: a weight used twice inside one checkpointed call
    // and elsewhere too would sum its uses inside first (docs/DESIGN.md).
    a = register_module("a", AcBlock(d, torch::nn::Linear(d, d)));
    b = register_module("b", AcBlock(d, torch::nn::Linear(d, d)));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    return fsdp::call(b, fsdp::call(a, x, mask, 0.5), mask, 0.25);
  }
};
TORCH_MODULE(Stage);

struct AcNetImpl : torch::nn::Module {
  torch::nn::Linear inp{nullptr}, out{nullptr}, shared{nullptr};
  torch::nn::ModuleList blocks;
  std::vector<AcBlock> block_list;
  Stage stage{nullptr};
  torch::nn::Sequential tail{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  AcNetImpl(int64_t in = 7, int64_t d = 64, int64_t outd = 5, int64_t layers = 3) {
    inp = register_module("inp", torch::nn::Linear(in, d));
    shared = register_module("shared", torch::nn::Linear(d, d));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) {
      block_list.push_back(AcBlock(d, shared));
      blocks->push_back(block_list.back());
    }
    stage = register_module("stage", Stage(d));
    tail = register_module("tail", torch::nn::Sequential(torch::nn::Linear(d, d), torch::nn::Tanh()));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    out = register_module("out", torch::nn::Linear(d, outd));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = inp(x);
    auto mask = (torch::arange(h.size(-1), h.options().dtype(torch::kLong)) % 3 != 0).to(h.scalar_type());  // [d], no grad
    for (auto& b : block_list) h = fsdp::call(b, h, mask, 0.5);
    h = fsdp::call(stage, h, mask);
    h = fsdp::call(tail, h);
    return out(ln(h) + shared(h));
  }
};
TORCH_MODULE(AcNet);

FsdpOptions options(const std::string& strategy, const std::string& dtype, const std::string& prefetch, bool ac,
                    const c10::Device& device) {
  FsdpOptions o;
  o.device = device;
  o.strategy = parse_strategy(strategy);
  o.wrap = WrapPolicy::module_type<AcBlockImpl>("AcBlock");
  // HYBRID: shard groups of 2 (2 replicas at N = 4) on this one host.
  if (strategy.rfind("hybrid", 0) == 0) o.shard_group_size = 2;
  if (dtype == "bf16") o.mixed_precision.param_dtype = torch::kBFloat16;
  if (prefetch == "fwd") {
    o.backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
    o.forward_prefetch = true;
  }
  if (ac)
    o.recompute = RecomputePolicy::predicate(
        [](const std::string& name, const torch::nn::Module& m) {
          return dynamic_cast<const AcBlockImpl*>(&m) != nullptr || name == "stage" || name == "tail.0";
        },
        "AcBlock, stage and tail.0");
  return o;
}

struct Run {
  std::vector<double> losses;             // every micro-step
  std::vector<torch::Tensor> grads;       // every step: the shard gradients, concatenated
  std::vector<std::pair<std::string, torch::Tensor>> params;  // the end
  std::vector<CommCounters> comm;         // every step
  int64_t A = 0, A_recompute = 0;
  std::vector<std::string> recomputed;
};

Run train(const CommPtr& comm, const FsdpOptions& o, int K, int steps) {
  const int N = comm->world_size(), r = comm->rank();
  const int B = 16;
  torch::manual_seed(1234);
  AcNet net;
  if (!o.device.is_cpu()) net->to(o.device);  // drawn on the host, the same values on any device
  auto model = fully_shard(net, comm, o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(2e-3).weight_decay(0.1));
  Run run;
  run.recomputed = model->recomputed();
  for (int step = 0; step < steps; ++step) {
    // The same stream in both runs: data, then every dropout mask.
    torch::manual_seed(100 + step);
    auto X = torch::randn({N * K * B, 7}).to(o.device);
    auto Y = torch::randn({N * K * B, 5}).to(o.device);
    comm->barrier()->wait();
    comm->reset_counters();
    for (int k = 0; k < K; ++k) {
      auto rows = torch::arange(int64_t(k * N + r) * B, int64_t(k * N + r + 1) * B, X.options().dtype(torch::kLong));
      auto x = X.index_select(0, rows), y = Y.index_select(0, rows);
      auto micro = [&] {
        auto loss = (model.forward(x).to(torch::kFloat32) - y).pow(2).mean() / K;
        loss.backward();
        run.losses.push_back(loss.item<double>());
      };
      if (k + 1 < K) {
        auto guard = model->no_sync();
        micro();
      } else {
        micro();
      }
    }
    model->wait_pending();
    run.comm.push_back(comm->counters());
    std::vector<torch::Tensor> g;
    for (auto& p : model->parameters())
      g.push_back(p.grad().defined() ? p.grad().detach().reshape(-1).clone() : torch::zeros({p.numel()}, p.options()));
    run.grads.push_back(torch::cat(g));
    model->clip_grad_norm(0.5);
    opt.step();
    opt.zero_grad();
  }
  const Ledger l = model->ledger(&opt);
  run.A = l.A;
  run.A_recompute = l.A_recompute;
  run.params = model->full_state(-1);
  return run;
}

FSDP_SCENARIO(ac_parity) {
  // The device first (it loads CUDA support before the seeds ask about it).
  c10::Device device(c10::kCPU);
  std::vector<std::string> pos = args;
  if (!pos.empty() && pos.back().rfind("device=", 0) == 0) {
    device = parse_device(pos.back().substr(7), "device");
    pos.pop_back();
  }
  const std::string strategy = pos.at(0), mode = pos.at(1);
  const std::string dtype = pos.size() > 2 ? pos[2] : "fp32";
  const std::string prefetch = pos.size() > 3 ? pos[3] : "none";
  auto comm = make_communicator_from_env();
  torch::set_num_threads(1);
  const int N = comm->world_size();
  const int K = mode == "plain" ? 1 : 3, steps = 3;
  const Run plain = train(comm, options(strategy, dtype, prefetch, false, device), K, steps);
  const Run ac = train(comm, options(strategy, dtype, prefetch, true, device), K, steps);

  bool loss_equal = plain.losses == ac.losses;
  bool grads_equal = plain.grads.size() == ac.grads.size();
  for (size_t i = 0; grads_equal && i < plain.grads.size(); ++i)
    grads_equal = torch::equal(plain.grads[i], ac.grads[i]);
  bool params_equal = plain.params.size() == ac.params.size();
  for (size_t i = 0; params_equal && i < plain.params.size(); ++i)
    params_equal = plain.params[i].first == ac.params[i].first && torch::equal(plain.params[i].second, ac.params[i].second);
  bool comm_equal = plain.comm.size() == ac.comm.size();
  for (size_t s = 0; comm_equal && s < plain.comm.size(); ++s)
    for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k)
      comm_equal = comm_equal && plain.comm[s].by_kind[k].calls == ac.comm[s].by_kind[k].calls &&
                   plain.comm[s].by_kind[k].bytes_sent == ac.comm[s].by_kind[k].bytes_sent;
  // All-gathers per step: FULL_SHARD (and HYBRID_SHARD, in its group)
  // gathers every unit for forward and for backward (the recompute runs on
  // the backward's), SHARD_GRAD_OP (HYBRID_SHARD_ZERO2) once, NO_SHARD never.
  // The world's counters include its groups'. AcNet's units: the root, 3
  // blocks and the stage's 2, none empty.
  const int units = 6;
  const int per_micro = strategy == "full" || strategy == "hybrid"            ? 2 * units
                        : strategy == "grad-op" || strategy == "hybrid-zero2" ? units
                                                                              : 0;
  const int64_t ag_expected = int64_t(K) * per_micro;  // counted also at N = 1
  const int64_t ag_calls = ac.comm.back()[CollectiveKind::ALL_GATHER].calls;
  std::string names;
  for (auto& n : ac.recomputed) names += (names.empty() ? "" : ",") + n;
  std::printf("ACPARITY strategy=%s mode=%s dtype=%s prefetch=%s N=%d loss_equal=%d grads_equal=%d params_equal=%d "
              "comm_equal=%d ag_calls=%lld ag_expected=%lld a_plain=%lld a_ac=%lld a_recompute=%lld checkpointed=%s\n",
              strategy.c_str(), mode.c_str(), dtype.c_str(), prefetch.c_str(), N, loss_equal, grads_equal, params_equal,
              comm_equal, (long long)ag_calls, (long long)ag_expected, (long long)plain.A, (long long)ac.A,
              (long long)ac.A_recompute, names.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
