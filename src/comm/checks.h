// fsdp-cpp: argument checks and byte accounting shared by every communicator.
// defines: CallShape, check_all_gather, check_reduce_scatter, check_all_reduce,
//          check_broadcast, check_gather, dtype_name, describe_call, ring_chunks
//
// Every backend validates a call the same way before queueing it, so a misuse
// reads the same whatever backend runs it; the message says what was expected,
// what was found and what to do.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/comm.h"

namespace fsdp::comm {

// What a queued call moves, for errors and counters.
struct CallShape {
  CollectiveKind kind = CollectiveKind::BARRIER;
  std::string label;
  c10::ScalarType dtype = c10::kFloat;
  int64_t numel = 0;  // the input's element count (all_reduce/broadcast: the tensor's)
  int64_t elem_size = 0;
  int root = -1;      // broadcast and gather
  int reduce_op = -1; // ReduceOp of reduce_scatter / all_reduce, -1 otherwise
  bool compressible = false;  // CollectiveInfo::compressible (a lossy path may take it)
};

// Throw CollectiveError on misuse; return the call's shape.
CallShape check_all_gather(const torch::Tensor& input, const torch::Tensor& output, int world,
                           const CollectiveInfo& info, c10::DeviceType home = c10::kCPU);
CallShape check_reduce_scatter(const torch::Tensor& input, const torch::Tensor& output,
                               ReduceOp op, int world, const CollectiveInfo& info,
                               c10::DeviceType home = c10::kCPU);
CallShape check_all_reduce(const torch::Tensor& tensor, ReduceOp op, const CollectiveInfo& info,
                           c10::DeviceType home = c10::kCPU);
CallShape check_broadcast(const torch::Tensor& tensor, int root, int world,
                          const CollectiveInfo& info, c10::DeviceType home = c10::kCPU);
// `rank` is the caller's: only root's output is checked.
CallShape check_gather(const torch::Tensor& input, const torch::Tensor& output, int root, int rank,
                       int world, const CollectiveInfo& info, c10::DeviceType home = c10::kCPU);

const char* dtype_name(c10::ScalarType t);
// e.g. "all_gather 'blocks.3' (bf16, 1000 elements, 1.95 KiB)"
std::string describe_call(const CallShape& s);

// Split `numel` elements into `world` contiguous chunks, the first
// numel % world of them one element longer (the all_reduce ring's chunks).
struct Chunks {
  std::vector<int64_t> offset, count;
};
Chunks ring_chunks(int64_t numel, int world);

}  // namespace fsdp::comm
