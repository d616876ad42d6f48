// fsdp-cpp tests: the batch rank r of replica group g trains on at step s
// (tests/workers/replica_scenarios.cpp), and the reference that replays a
// participation schedule in one process (tests/test_replicas.cpp).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace fsdp::testing {

inline std::pair<torch::Tensor, torch::Tensor> batch_of(int64_t step, int group, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(100000 + 1000 * step + 10 * group + rank));
  auto x = torch::randn({4, 7}, gen);
  auto y = torch::randn({4, 5}, gen);
  return {x, y};
}

}  // namespace fsdp::testing
