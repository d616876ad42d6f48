// fsdp-cpp tests: rank-side logic of tests/test_state_dict.cpp — checkpoints
// of a wrapped model: exact resume, resharding, untouched on error.
//
// core_resume PHASE STEPS CKPT_DIR OUT [STRATEGY [SHARD_GROUP]]
//   straight:    train STEPS steps, save_full(OUT)
//   first:       train STEPS/2 steps, save_checkpoint(CKPT_DIR)
//   second:      load_checkpoint(CKPT_DIR), train to STEPS, save_full(OUT)
//   full_first:  train STEPS/2 steps, save_full + save_full_optim into CKPT_DIR
//   full_second: load_full + load_full_optim from CKPT_DIR, train to STEPS,
//                save_full(OUT)
// The global batch of step s is seeded by s and split over ranks, so any
// world size trains the same model (up to summation order).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "../core_model.h"
#include "fsdp/fsdp.h"
#include "scenario.h"

namespace fsdp::testing {
namespace {

void train_step(Sharded<Net>& model, torch::optim::Optimizer& opt, int step, int N, int r) {
  torch::manual_seed(500 + step);
  const int B = 12;  // divisible by 1, 2, 3, 4
  auto X = torch::randn({B, 7});
  auto Y = torch::randn({B, 5});
  const int b = B / N;
  auto x = X.narrow(0, r * b, b), y = Y.narrow(0, r * b, b);
  opt.zero_grad();
  auto loss = (model.forward(x) - y).pow(2).mean();
  loss.backward();
  model->clip_grad_norm(1.0);
  opt.step();
}

}  // namespace

FSDP_SCENARIO(core_resume) {
  const std::string phase = args.at(0);
  const int steps = std::stoi(args.at(1));
  const std::string dir = args.at(2), out = args.at(3);
  const std::string strategy = args.size() > 4 ? args[4] : "full";
  auto comm = make_communicator_from_env();
  const int N = comm->world_size(), r = comm->rank();
  torch::manual_seed(7);
  Net net;
  FsdpOptions o;
  o.strategy = parse_strategy(strategy);
  if (args.size() > 5) o.shard_group_size = std::stoi(args[5]);
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, comm, o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  int start = 0, end = steps;
  if (phase == "first" || phase == "full_first") end = steps / 2;
  if (phase == "full_second") {
    load_full(*model, dir + "/model.safetensors");
    load_full_optim(*model, opt, dir + "/optim.safetensors");
    start = steps / 2;
  }
  if (phase == "second") {
    auto res = load_checkpoint(*model, &opt, dir);
    FSDP_USER_CHECK(res.found, "no checkpoint in ", dir);
    start = res.train_state.at("step").get<int>();
    std::printf("RESUMED step=%d from world %d\n", start, res.saved_world_size);
  }
  for (int s = start; s < end; ++s) train_step(model, opt, s, N, r);
  if (phase == "first") {
    save_checkpoint(*model, &opt, dir, end, {{"step", end}});
  } else if (phase == "full_first") {
    if (r == 0) std::filesystem::create_directories(dir);
    save_full(*model, dir + "/model.safetensors");
    save_full_optim(*model, opt, dir + "/optim.safetensors");
  } else
    save_full(*model, out);
  std::printf("DONE phase=%s N=%d\n", phase.c_str(), N);
  return 0;
}

// core_full_memory DIR: what gathering the full state costs each rank. Prints
// per rank "MEM op=<op> rank=<r> extra=<peak above the resting bytes>
// block=<largest unit unsharded bytes> shard=<largest shard bytes>".
FSDP_SCENARIO(core_full_memory) {
  memory::install();
  auto comm = make_communicator_from_env();
  const int r = comm->rank();
  torch::manual_seed(7);
  Net net(7, 48, 5, 3);
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, comm, o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  train_step(model, opt, 0, comm->world_size(), r);
  int64_t block = 0, shard = 0;
  for (auto& u : model->units()) {
    block = std::max(block, u.unsharded_bytes);
    shard = std::max(shard, u.shard_bytes);
  }
  auto measure = [&](const char* op, const std::function<void()>& fn) {
    comm->barrier()->wait();
    const int64_t before = memory::stats().current;
    memory::reset_peak();
    fn();
    std::printf("MEM op=%s rank=%d extra=%lld block=%lld shard=%lld\n", op, r,
                static_cast<long long>(memory::stats().peak - before), static_cast<long long>(block),
                static_cast<long long>(shard));
  };
  const std::string dir = args.at(0);
  measure("save_full", [&] { save_full(*model, dir + "/m.safetensors"); });
  measure("save_full_optim", [&] { save_full_optim(*model, opt, dir + "/o.safetensors"); });
  int64_t full_bytes = 0;
  measure("full_state", [&] {
    auto st = model->full_state(0);
    for (auto& [k, t] : st) full_bytes += t.numel() * t.element_size();
  });
  std::printf("FULL rank=%d bytes=%lld\n", r, static_cast<long long>(full_bytes));
  return 0;
}

// core_load_bad PATH: a load that must fail leaves the model untouched:
// prints UNTOUCHED when the parameters after the failed load equal before.
FSDP_SCENARIO(core_load_bad) {
  auto comm = make_communicator_from_env();
  torch::manual_seed(7);
  Net net;
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, comm, o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  std::vector<torch::Tensor> before;
  for (auto& p : model->parameters()) before.push_back(p.detach().clone());
  try {
    load_checkpoint(*model, &opt, args.at(0));
    std::printf("LOADED (unexpected)\n");
    return 1;
  } catch (const fsdp::Error& e) {
    std::printf("ERROR %s\n", e.what());
  }
  auto now = model->parameters();
  for (size_t i = 0; i < now.size(); ++i)
    if (!torch::equal(now[i], before[i])) {
      std::printf("TOUCHED\n");
      return 1;
    }
  std::printf("UNTOUCHED opt_state=%zu\n", opt.state().size());
  return 0;
}

}  // namespace fsdp::testing
