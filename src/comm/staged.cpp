// fsdp-cpp: tensors on a device the backend cannot move, staged (backends.h).
//
// Every communicator the factories make for more than one rank is wrapped
// here, with the device type its backend moves ("home"): Gloo moves host
// memory, NCCL a GPU's. A call whose tensors are all at home goes straight
// through (the CPU path runs exactly as before). Otherwise each tensor away
// from home is copied to a home buffer before the call (Gloo: pinned host
// memory, so the copies run at the link's full speed; NCCL: the rank's GPU),
// and each output is copied back when the caller waits.
//
// Lifetimes: the staging buffers belong to the call's Work and live until
// its wait() copied the results back. The copy to home is synchronous
// (the backend's queue reads the bytes on another thread); the copy back
// runs on the waiting thread's current stream.
#include <mutex>

#include "comm/backends.h"
#include "comm/forwarding.h"
#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr inner, std::vector<std::pair<torch::Tensor, torch::Tensor>> back,
             std::vector<torch::Tensor> keep)
      : inner_(std::move(inner)), back_(std::move(back)), keep_(std::move(keep)) {}
  void wait() override {
    inner_->wait();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [dst, staged] : back_) dst.copy_(staged);
    back_.clear();
    keep_.clear();
  }
  bool is_completed() const override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::mutex mu_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> back_;  // (caller's output, staged output); guarded by mu_
  std::vector<torch::Tensor> keep_;                            // staged inputs; guarded by mu_
};

class Staged final : public ForwardingCommunicator {
 public:
  Staged(CommPtr inner, c10::Device home) : ForwardingCommunicator(std::move(inner)), home_(home) {}

  WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output, const CollectiveInfo& info) override {
    if (at_home(input) && at_home(output)) return inner()->all_gather(input, output, info);
    Staging c;
    auto in = c.in(input, *this);
    auto out = c.out(output, *this);
    return c.done(inner()->all_gather(in, out, info));
  }
  WorkPtr reduce_scatter(const torch::Tensor& input, torch::Tensor output, ReduceOp op,
                         const CollectiveInfo& info) override {
    if (at_home(input) && at_home(output)) return inner()->reduce_scatter(input, output, op, info);
    Staging c;
    auto in = c.in(input, *this);
    auto out = c.out(output, *this);
    return c.done(inner()->reduce_scatter(in, out, op, info));
  }
  WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op, const CollectiveInfo& info) override {
    if (at_home(tensor)) return inner()->all_reduce(tensor, op, info);
    Staging c;
    return c.done(inner()->all_reduce(c.inout(tensor, *this), op, info));
  }
  WorkPtr broadcast(torch::Tensor tensor, int root, const CollectiveInfo& info) override {
    if (at_home(tensor)) return inner()->broadcast(tensor, root, info);
    Staging c;
    return c.done(inner()->broadcast(c.inout(tensor, *this), root, info));
  }
  WorkPtr gather(const torch::Tensor& input, torch::Tensor output, int root, const CollectiveInfo& info) override {
    if (at_home(input) && at_home(output)) return inner()->gather(input, output, root, info);
    Staging c;
    auto in = c.in(input, *this);
    auto out = output.defined() ? c.out(output, *this) : output;
    return c.done(inner()->gather(in, out, root, info));
  }
  // The barrier moves no tensor; everything else not here is forwarded.
  CommPtr split(int color, const SplitOptions& opts) override {
    return stage_away_from(inner()->split(color, opts), home_);
  }

 private:
  bool at_home(const torch::Tensor& t) const { return !t.defined() || t.device().type() == home_.type(); }

  torch::Tensor home_empty(const torch::Tensor& like) const {
    auto o = like.options().device(home_);
    // Pinned host memory: the device copies in and out run asynchronously
    // at full speed. Only where a device tensor is involved, so CUDA
    // support is loaded already.
    if (home_.is_cpu()) o = o.pinned_memory(true);
    return torch::empty(like.sizes(), o);
  }

  // The staging of one call.
  struct Staging {
    std::vector<std::pair<torch::Tensor, torch::Tensor>> back;
    std::vector<torch::Tensor> keep;
    torch::Tensor in(const torch::Tensor& t, const Staged& s) {
      if (s.at_home(t)) return t;
      auto h = s.home_empty(t);
      h.copy_(t);  // synchronous: the backend reads it on its own thread
      keep.push_back(h);
      return h;
    }
    torch::Tensor out(const torch::Tensor& t, const Staged& s) {
      if (s.at_home(t)) return t;
      auto h = s.home_empty(t);
      back.emplace_back(t, h);
      return h;
    }
    torch::Tensor inout(const torch::Tensor& t, const Staged& s) {
      auto h = in(t, s);
      back.emplace_back(t, h);
      return h;
    }
    WorkPtr done(WorkPtr w) { return std::make_shared<StagedWork>(std::move(w), std::move(back), std::move(keep)); }
  };

  const c10::Device home_;
};

}  // namespace

CommPtr stage_away_from(CommPtr inner, c10::Device home, bool alone_too) {
  // fsdp's own world of one moves any device's tensors; NCCL's does not.
  if (!inner || (inner->world_size() == 1 && !alone_too)) return inner;
  return std::make_shared<Staged>(std::move(inner), home);
}

}  // namespace fsdp::comm
