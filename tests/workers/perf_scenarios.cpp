// fsdp-cpp tests: rank-side logic of the performance tests (tests/test_perf.cpp).
//
// perf_traffic: the same model wrapped FULL_SHARD in fp32 and in bf16
//   (mixed_precision.param_dtype); one measured step each after a warm-up;
//   prints per dtype
//     TRAFFIC dtype=fp32 ag=<bytes> rs=<bytes> ar=<bytes> ag_calls=<n> rs_calls=<n>
//
// perf_limit LIMIT SYNC|ASYNC [LAYERS]: a stack of MLP blocks with tiny
//   activations (so the peak is model state and unsharded units), FULL_SHARD
//   with backward + forward prefetch and limit_all_gathers=LIMIT; SYNC waits
//   for each reduce-scatter at once (async_reduce=false). Prints
//     LIMIT limit=.. layers=.. peak=.. rest=.. P_block=.. A=.. predicted=..
//   where rest = the model state at rest (shard, shard grad, Adam state).
//
// perf_env: prints the thread settings the launcher gave this rank.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../core_model.h"
#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/memory.h"
#include "scenario.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear up{nullptr}, down{nullptr};
  explicit MlpImpl(int64_t d) {
    up = register_module("up", torch::nn::Linear(d, 2 * d));
    down = register_module("down", torch::nn::Linear(2 * d, d));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + down(torch::gelu(up(x))); }
};
TORCH_MODULE(Mlp);

struct StackImpl : torch::nn::Module {
  std::vector<Mlp> blocks;
  torch::nn::Linear head{nullptr};
  StackImpl(int64_t d, int64_t layers) {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(Mlp(d));
      list->push_back(blocks.back());
    }
    head = register_module("head", torch::nn::Linear(d, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = fsdp::call(b, x);
    return head(x);
  }
};
TORCH_MODULE(Stack);

long long counter(const CommCounters& c, CollectiveKind k) { return (long long)c[k].bytes_sent; }

FSDP_SCENARIO(perf_traffic) {
  auto comm = make_communicator_from_env();
  for (const char* dtype : {"fp32", "bf16"}) {
    torch::manual_seed(1);
    Net net(7, 40, 5, 3);
    FsdpOptions o;
    o.strategy = ShardingStrategy::FULL_SHARD;
    o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
    if (std::string(dtype) == "bf16") o.mixed_precision.param_dtype = torch::kBFloat16;
    auto model = fully_shard(net, comm, o);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
    auto x = torch::randn({4, 7});
    for (int step = 0; step < 2; ++step) {
      comm->reset_counters();  // step 0 is the warm-up (records the forward order)
      opt.zero_grad();
      model.forward(x).to(torch::kFloat32).pow(2).mean().backward();
      opt.step();
    }
    auto c = comm->counters();
    std::printf("TRAFFIC dtype=%s ag=%lld rs=%lld ar=%lld ag_calls=%lld rs_calls=%lld\n", dtype,
                counter(c, CollectiveKind::ALL_GATHER), counter(c, CollectiveKind::REDUCE_SCATTER),
                counter(c, CollectiveKind::ALL_REDUCE), (long long)c[CollectiveKind::ALL_GATHER].calls,
                (long long)c[CollectiveKind::REDUCE_SCATTER].calls);
  }
  return 0;
}

// perf_env: what the launcher chose for this rank's threads.
//   THREADS omp=<OMP_NUM_THREADS> wait=<OMP_WAIT_POLICY or unset> torch=<torch::get_num_threads()>
FSDP_SCENARIO(perf_env) {
  auto get = [](const char* k) { return std::getenv(k) ? std::string(std::getenv(k)) : std::string("unset"); };
  std::printf("THREADS omp=%s wait=%s torch=%d\n", get("OMP_NUM_THREADS").c_str(), get("OMP_WAIT_POLICY").c_str(),
              torch::get_num_threads());
  std::fflush(stdout);
  return 0;
}

FSDP_SCENARIO(perf_limit) {
  const int limit = std::stoi(args.at(0));
  const bool async = args.at(1) == "ASYNC";
  const int64_t layers = args.size() > 2 ? std::stoll(args[2]) : 8, d = 128;
  auto comm = make_communicator_from_env();
  torch::manual_seed(1);
  Stack net(d, layers);
  FsdpOptions o;
  o.strategy = ShardingStrategy::FULL_SHARD;
  o.wrap = WrapPolicy::module_type<MlpImpl>("Mlp");
  o.backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  o.forward_prefetch = true;
  o.limit_all_gathers = limit;
  o.async_reduce = async;
  auto model = fully_shard(net, comm, o);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto x = torch::randn({8, d});
  auto step = [&] {
    opt.zero_grad();
    model.forward(x).pow(2).mean().backward();
    opt.step();
  };
  for (int i = 0; i < 2; ++i) step();  // the first forward records the order prefetch follows
  memory::reset_peak();
  step();
  const int64_t peak = memory::stats().peak;
  auto l = model->ledger(&opt);
  std::printf("LIMIT limit=%d async=%d layers=%lld peak=%lld rest=%lld P_block=%lld A=%lld predicted=%lld\n", limit,
              int(async), (long long)layers, (long long)peak, (long long)(l.P + l.G + l.O), (long long)l.P_block,
              (long long)l.A, (long long)l.predicted_peak);
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
