// A user's training program: its own model, FULL_SHARD on every rank, a few
// AdamW steps on a fixed regression problem, next to the same training
// without FSDP on all ranks' rows at once (what FSDP must reproduce).
// Prints per rank
//   consumer rank=R world=N units=U first=L0 last=L reference=R ok
// and exits 1 if the loss did not fall or differs from the reference.
#include <cmath>
#include <cstdio>
#include <vector>

#include "fsdp/fsdp.h"

struct RegressorImpl : torch::nn::Module {
  torch::nn::Linear in{nullptr}, hidden{nullptr}, out{nullptr};
  RegressorImpl() {
    in = register_module("in", torch::nn::Linear(16, 64));
    hidden = register_module("hidden", torch::nn::Linear(64, 64));
    out = register_module("out", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::tanh(fsdp::call(in, x));
    x = torch::tanh(fsdp::call(hidden, x));
    return fsdp::call(out, x);
  }
};
TORCH_MODULE(Regressor);

int main() {
  try {
    auto comm = fsdp::make_communicator_from_env();
    const int rank = comm->rank(), world = comm->world_size();
    // Rank r's rows of y = sum(sin(x)); every rank can make every rank's.
    auto rows = [](int r) {
      torch::manual_seed(100 + r);
      auto x = torch::randn({32, 16});
      return std::make_pair(x, torch::sin(x).sum(1, true));
    };
    const int steps = 20;

    torch::manual_seed(0);
    Regressor ref;
    std::vector<torch::Tensor> xs, ys;
    for (int r = 0; r < world; r++) {
      auto [x, y] = rows(r);
      xs.push_back(x);
      ys.push_back(y);
    }
    auto all_x = torch::cat(xs), all_y = torch::cat(ys);
    torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-2));
    double reference = 0;
    for (int step = 0; step < steps; step++) {
      ref_opt.zero_grad();
      auto loss = torch::mse_loss(ref->forward(all_x), all_y);
      loss.backward();
      ref_opt.step();
      reference = loss.item<double>();
    }

    torch::manual_seed(0);
    Regressor net;
    fsdp::FsdpOptions opts;
    opts.strategy = fsdp::ShardingStrategy::FULL_SHARD;
    opts.wrap = fsdp::WrapPolicy::size_based(1000);  // in, hidden: a unit each; out: the root's
    auto model = fsdp::fully_shard(net, comm, opts);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    auto [x, y] = rows(rank);
    double first = 0, last = 0;
    for (int step = 0; step < steps; step++) {
      opt.zero_grad();
      auto loss = torch::mse_loss(model.forward(x), y);
      loss.backward();
      opt.step();
      auto mean = loss.detach().clone();
      comm->all_reduce(mean, fsdp::ReduceOp::AVG)->wait();
      last = mean.item<double>();
      if (step == 0) first = last;
    }
    const bool ok = last < 0.5 * first && std::abs(last - reference) <= 1e-4 * (1 + reference);
    std::printf("consumer rank=%d world=%d units=%zu first=%.6f last=%.6f reference=%.6f %s\n", rank, world,
                model->units().size(), first, last, reference, ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: error: %s\n", e.what());
    return 1;
  }
}
