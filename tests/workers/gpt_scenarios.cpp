// GPT-mini rank-side scenarios (started by tests/test_gpt_parity.cpp).
//
//   fsdp run -n N -- fsdp_test_worker gpt_parity STRATEGY OUT.safetensors [BATCH [SHARD_GROUP]] [device=D] [steps=S]
//   fsdp_test_worker gpt_reference OUT.safetensors [BATCH] [device=D] [steps=S]  (plain libtorch, no FSDP)
// BATCH: the global batch (default 6; 4 for the 2 x 2 hybrid runs).
// device=cpu|cuda|cuda:K (default cpu; cuda = cuda:LOCAL_RANK): where the
// model, the batches and the step run (gpt_parity: FsdpOptions::device).
// steps=S: optimizer steps (default 3). tests/gpu/run.sh runs both on a GPU
// for 20 steps (docs/GPU.md).
//
// Both train the same small GPT (2 layers, d=64) for a few steps on the same
// global batch (6 rows per micro-step, 2 micro-steps, the deterministic order
// of docs/GPT_MINI.md: rank r of N takes rows r*6/N ..), with the cross-check
// optimizer of docs/GPT_MINI.md, print "loss <step> <value>" (rank 0) and write the
// final full parameters to OUT (rank 0). The test compares the files.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fsdp/checkpoint.h"
#include "usage.h"
#include "fsdp/comm.h"
#include "fsdp/device.h"
#include "fsdp/fully_shard.h"
#include "gpt/data.h"
#include "gpt/model.h"
#include "scenario.h"

namespace FSDP_TEST_ID {

struct Setup {
  gpt::Config cfg{256, 32, 64, 2, 4};  // V, T, d, L, h
  int64_t global_batch = 6;            // divisible by N = 1, 2, 3
  int64_t accum = 2;
  int64_t steps = 3;
  double lr = 1e-3, weight_decay = 0.1, clip = 1.0;
  uint64_t seed = 0;
  torch::Device device = torch::kCPU;
};

// Takes the trailing key=value options (device=, steps=) out of args into s;
// what is left are the positional arguments.
std::vector<std::string> take_options(std::vector<std::string> args, Setup& s) {
  while (!args.empty() && args.back().find('=') != std::string::npos) {
    const std::string a = args.back();
    args.pop_back();
    const std::string key = a.substr(0, a.find('=')), value = a.substr(a.find('=') + 1);
    if (key == "device") {
      // As the examples do: the device first, which loads CUDA support
      // before anything (the seed, the communicator) asks libtorch about it.
      s.device = fsdp::parse_device(value, "device");
    } else if (key == "steps") {
      s.steps = std::stoll(value);
      FSDP_USER_CHECK(s.steps >= 1, "steps=", value, ": expected at least 1");
    } else {
      throw fsdp::UsageError("unknown option '" + a + "' (expected device=D or steps=S)");
    }
  }
  return args;
}

// A fixed byte stream with some structure (a few repeated words, LCG-chosen).
gpt::data::Tokens corpus() {
  const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "FSDP ", "shards\n"};
  std::string s;
  uint32_t x = 12345;
  while (s.size() < 20000) {
    x = x * 1664525u + 1013904223u;
    s += words[(x >> 16) % 8];
  }
  return gpt::data::encode(s);
}

// AdamW of docs/GPT_MINI.md: betas (0.9, 0.95), eps 1e-8, decay on 2-D weights only.
std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<std::pair<torch::Tensor, bool>>& params,
                                                const Setup& s) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& [t, is_2d] : params) (is_2d ? decay : no_decay).push_back(t);
  auto opts = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(s.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(s.weight_decay));
  groups.emplace_back(no_decay, opts(0.0));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), *opts(s.weight_decay));
}

void save(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& full) {
  std::vector<fsdp::ckpt::TensorSpec> specs;
  for (auto& [n, t] : full) specs.push_back({n, t.sizes().vec(), t.scalar_type()});
  size_t next = 0;
  fsdp::ckpt::write_full_safetensors(path, specs,
                                     [&](const fsdp::ckpt::TensorSpec&) { return full[next++].second.cpu(); });
}

FSDP_SCENARIO(gpt_parity) {
  Setup s;
  const auto pos = take_options(args, s);  // the positional arguments
  if (pos.size() < 2 || pos.size() > 4)
    throw fsdp::UsageError("gpt_parity STRATEGY OUT.safetensors [BATCH [SHARD_GROUP]] [device=D] [steps=S]");
  if (pos.size() > 2) s.global_batch = std::stoll(pos[2]);
  auto comm = fsdp::make_communicator_from_env();
  const int N = comm->world_size(), rank = comm->rank();
  FSDP_USER_CHECK(s.global_batch % N == 0, "gpt_parity: world size ", N, " must divide ", s.global_batch);
  // Which engine carries the collectives (tests/gpu/run.sh: NCCL even at N = 1).
  if (rank == 0) std::printf("comm %s\n", comm->describe().c_str());
  const gpt::data::Tokens tokens = corpus();
  const gpt::data::Order order{s.cfg.seq, s.global_batch / N, s.accum, N};

  torch::manual_seed(s.seed);
  gpt::GPT net(s.cfg);
  if (!s.device.is_cpu()) net->to(s.device);  // drawn on the host, as the reference's
  fsdp::FsdpOptions opts;
  opts.device = s.device;
  opts.strategy = fsdp::parse_strategy(pos[0]);
  if (pos.size() > 3) opts.shard_group_size = std::stoi(pos[3]);
  opts.wrap = fsdp::WrapPolicy::module_type<gpt::BlockImpl>("Block");
  auto model = fsdp::fully_shard(net.ptr(), comm, opts);
  std::vector<std::pair<torch::Tensor, bool>> params;
  for (auto& sh : model->named_shards()) params.push_back({sh.tensor, sh.full_shape.size() == 2});
  auto opt = make_adamw(params, s);

  for (int64_t step = 0; step < s.steps; step++) {
    double loss_sum = 0;
    for (int64_t k = 0; k < s.accum; k++) {
      auto b = gpt::data::batch(tokens, order, step, k, rank);  // [B,T]
      auto micro = [&] {
        auto loss = gpt::loss(model.forward(b.x.to(s.device)), b.y.to(s.device));
        (loss / double(s.accum)).backward();
        loss_sum += loss.item<double>();
      };
      if (k + 1 < s.accum) {
        auto guard = model->no_sync();
        micro();
      } else {
        micro();
      }
    }
    model->clip_grad_norm(s.clip);
    opt->step();
    opt->zero_grad();
    auto l = torch::tensor({float(loss_sum / s.accum)}).to(s.device);  // NCCL takes device tensors only
    comm->all_reduce(l, fsdp::ReduceOp::AVG)->wait();
    if (rank == 0) std::printf("loss %lld %.8f\n", (long long)step, l.item<double>());
  }
  auto full = model->full_state(0);
  if (rank == 0) save(pos[1], full);
  std::fflush(stdout);
  return 0;
}

// The unsharded reference: one process, batch 6, plain libtorch.
FSDP_SCENARIO(gpt_reference) {
  Setup s;
  const auto pos = take_options(args, s);  // the positional arguments
  if (pos.size() < 1 || pos.size() > 2)
    throw fsdp::UsageError("gpt_reference OUT.safetensors [BATCH] [device=D] [steps=S]");
  if (pos.size() > 1) s.global_batch = std::stoll(pos[1]);
  const gpt::data::Tokens tokens = corpus();
  const gpt::data::Order order{s.cfg.seq, s.global_batch, s.accum, 1};
  torch::manual_seed(s.seed);
  gpt::GPT net(s.cfg);
  if (!s.device.is_cpu()) net->to(s.device);
  std::vector<std::pair<torch::Tensor, bool>> params;
  for (auto& p : net->named_parameters()) params.push_back({p.value(), p.value().dim() == 2});
  auto opt = make_adamw(params, s);
  for (int64_t step = 0; step < s.steps; step++) {
    double loss_sum = 0;
    for (int64_t k = 0; k < s.accum; k++) {
      auto b = gpt::data::batch(tokens, order, step, k, 0);
      auto loss = gpt::loss(net->forward(b.x.to(s.device)), b.y.to(s.device));
      (loss / double(s.accum)).backward();
      loss_sum += loss.item<double>();
    }
    torch::nn::utils::clip_grad_norm_(net->parameters(), s.clip);
    opt->step();
    opt->zero_grad();
    std::printf("loss %lld %.8f\n", (long long)step, loss_sum / s.accum);
  }
  std::vector<std::pair<std::string, torch::Tensor>> full;
  for (auto& p : net->named_parameters()) full.push_back({p.key(), p.value().detach()});
  save(pos[0], full);
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID
