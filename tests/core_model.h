// fsdp-cpp tests: a small model with several units, an odd-sized parameter
// and one smaller than the world size — shared by the core tests and workers.
#pragma once

#include <torch/torch.h>

#include "fsdp/fully_shard.h"

namespace fsdp::testing {

struct BlockImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  explicit BlockImpl(int64_t d) {
    fc1 = register_module("fc1", torch::nn::Linear(d, 2 * d + 1));  // odd sizes
    fc2 = register_module("fc2", torch::nn::Linear(2 * d + 1, d));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::tanh(fc1(x))); }
};
TORCH_MODULE(Block);

// A unit holding a single parameter with fewer elements than ranks.
struct GateImpl : torch::nn::Module {
  torch::Tensor g;
  GateImpl() { g = register_parameter("g", torch::tensor({0.9f, 1.1f})); }
  torch::Tensor forward(const torch::Tensor& x) {
    auto half = x.size(-1) / 2;
    return torch::cat({x.narrow(-1, 0, half) * g[0], x.narrow(-1, half, x.size(-1) - half) * g[1]}, -1);
  }
};
TORCH_MODULE(Gate);

struct NetImpl : torch::nn::Module {
  torch::nn::Linear inp{nullptr}, out{nullptr};
  torch::nn::ModuleList blocks;
  std::vector<Block> block_list;
  Gate gate;
  torch::nn::LayerNorm ln{nullptr};
  NetImpl(int64_t in = 7, int64_t d = 12, int64_t outd = 5, int64_t layers = 3) {
    inp = register_module("inp", torch::nn::Linear(in, d));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) {
      block_list.push_back(Block(d));
      blocks->push_back(block_list.back());
    }
    gate = register_module("gate", Gate());
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    out = register_module("out", torch::nn::Linear(d, outd));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = inp(x);
    for (auto& b : block_list) h = fsdp::call(b, h);
    h = fsdp::call(gate, h);
    return out(ln(h));
  }
};
TORCH_MODULE(Net);

}  // namespace fsdp::testing
