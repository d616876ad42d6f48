// fsdp-cpp: a communicator that forwards every call to another, so a
// decorator overrides only what it changes (as LevelDB's EnvWrapper does
// for its Env).
// defines: ForwardingCommunicator
//
// The decorators: staged.cpp (tensors away from the backend's device),
// straggler.cpp (time blocked in wait()), and the tests' delaying
// communicator (tests/workers/delayed_comm.cpp). Each also overrides
// split(), so the groups split from a decorated communicator are decorated
// the same way; the forwarding default hands out inner's plain groups.
#pragma once

#include <utility>

#include "fsdp/comm.h"

namespace fsdp::comm {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(CommPtr inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  int local_rank() const override { return inner_->local_rank(); }
  int local_world_size() const override { return inner_->local_world_size(); }

  WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output, const CollectiveInfo& info) override {
    return inner_->all_gather(input, std::move(output), info);
  }
  WorkPtr reduce_scatter(const torch::Tensor& input, torch::Tensor output, ReduceOp op,
                         const CollectiveInfo& info) override {
    return inner_->reduce_scatter(input, std::move(output), op, info);
  }
  WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op, const CollectiveInfo& info) override {
    return inner_->all_reduce(std::move(tensor), op, info);
  }
  WorkPtr broadcast(torch::Tensor tensor, int root, const CollectiveInfo& info) override {
    return inner_->broadcast(std::move(tensor), root, info);
  }
  WorkPtr barrier(const CollectiveInfo& info) override { return inner_->barrier(info); }
  WorkPtr gather(const torch::Tensor& input, torch::Tensor output, int root, const CollectiveInfo& info) override {
    return inner_->gather(input, std::move(output), root, info);
  }

  CommCounters counters() const override { return inner_->counters(); }
  void reset_counters() override { inner_->reset_counters(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  std::string describe() const override { return inner_->describe(); }
  std::vector<int> global_ranks() const override { return inner_->global_ranks(); }
  std::vector<int> hosts() const override { return inner_->hosts(); }
  CommPtr split(int color, const SplitOptions& opts) override { return inner_->split(color, opts); }
  bool shares_host_memory() const override { return inner_->shares_host_memory(); }
  torch::Tensor shared_tensor(int64_t numel, torch::ScalarType dtype, const CollectiveInfo& info) override {
    return inner_->shared_tensor(numel, dtype, info);
  }
  torch::Tensor peer_tensor(int64_t numel, torch::ScalarType dtype) override {
    return inner_->peer_tensor(numel, dtype);
  }
  int64_t peer_memory_bytes() const override { return inner_->peer_memory_bytes(); }
  Residuals residuals() override { return inner_->residuals(); }
  void load_residuals(const std::map<std::string, torch::Tensor>& by_buffer) override {
    inner_->load_residuals(by_buffer);
  }

 protected:
  // The communicator every call goes to; constant after construction.
  const CommPtr& inner() const { return inner_; }

 private:
  const CommPtr inner_;
};

}  // namespace fsdp::comm
