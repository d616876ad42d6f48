// fsdp-cpp: the world of one (see backends.h).
//
// Runs each collective synchronously on the caller's thread: with one rank
// every collective is a copy (or nothing), so a queue would only add latency.
// Misuse still poisons it, like the Gloo communicator, so code that is wrong
// at N=1 fails the same way it would at N=4.
#include <cstring>
#include <mutex>

#include "comm/backends.h"
#include "comm/checks.h"
#include "comm/work_queue.h"
#include "fsdp/trace.h"

namespace fsdp::comm {
namespace {

class WorldOfOne final : public Communicator {
 public:
  WorldOfOne(const ResolvedOptions& opts, int global_rank, std::string group)
      : timeout_(opts.timeout), global_rank_(global_rank), group_(std::move(group)) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_world_size() const override { return 1; }

  WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output, const CollectiveInfo& info) override {
    return run([&] { return check_all_gather(input, output, 1, info, home(input)); },
               [&] { copy(output, input); });
  }
  WorkPtr reduce_scatter(const torch::Tensor& input, torch::Tensor output, ReduceOp op,
                         const CollectiveInfo& info) override {
    // The sum (and the mean) over one rank is the input itself.
    return run([&] { return check_reduce_scatter(input, output, op, 1, info, home(input)); },
               [&] { copy(output, input); });
  }
  WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op, const CollectiveInfo& info) override {
    return run([&] { return check_all_reduce(tensor, op, info, home(tensor)); }, [] {});
  }
  WorkPtr broadcast(torch::Tensor tensor, int root, const CollectiveInfo& info) override {
    return run([&] { return check_broadcast(tensor, root, 1, info, home(tensor)); }, [] {});
  }
  WorkPtr gather(const torch::Tensor& input, torch::Tensor output, int root, const CollectiveInfo& info) override {
    return run([&] { return check_gather(input, output, root, 0, 1, info, home(input)); }, [&] { copy(output, input); });
  }
  WorkPtr barrier(const CollectiveInfo& info) override {
    return run([&] {
      CallShape s;
      s.kind = CollectiveKind::BARRIER;
      s.label = info.label;
      return s;
    }, [] {});
  }

  CommCounters counters() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }
  void reset_counters() override {
    std::lock_guard<std::mutex> lock(mu_);
    counters_ = {};
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::string describe() const override {
    return group_.empty() ? "local world=1" : detail::cat("local group '", group_, "' of rank ", global_rank_);
  }
  std::vector<int> global_ranks() const override { return {global_rank_}; }

 private:
  // One rank moves nothing: its tensors may live on any one device (a
  // GPU job of one rank needs no staging).
  static c10::DeviceType home(const torch::Tensor& t) { return t.defined() ? t.device().type() : c10::kCPU; }
  static void copy(torch::Tensor& dst, const torch::Tensor& src) {
    if (dst.data_ptr() == src.data_ptr() || src.numel() == 0) return;
    if (src.is_cpu())
      std::memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size());
    else
      dst.view(-1).copy_(src.view(-1));  // same device (checked), stream-ordered
  }

  template <class Check, class Body>
  WorkPtr run(Check check, Body body) {
    auto work = std::make_shared<CompletionWork>();
    std::unique_lock<std::mutex> lock(mu_);
    if (failure_) {
      work->complete(failure_);
      return work;
    }
    CallShape shape;
    try {
      shape = check();
    } catch (...) {
      failure_ = std::current_exception();
      throw;
    }
    // Same span as the Gloo communicator, on the caller's thread (no bytes move).
    const uint64_t seq = ++seq_;
    trace::Span span(to_string(shape.kind), "comm");
    if (span.active()) span.arg("unit", shape.label).arg("seq", seq).arg("bytes", 0);
    auto t0 = std::chrono::steady_clock::now();
    body();
    auto& e = counters_[shape.kind];
    e.calls += 1;
    e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    work->complete(nullptr);
    return work;
  }

  const std::chrono::milliseconds timeout_;
  const int global_rank_;
  const std::string group_;
  mutable std::mutex mu_;
  CommCounters counters_;        // guarded by mu_
  std::exception_ptr failure_;   // guarded by mu_
  uint64_t seq_ = 0;             // guarded by mu_
};

}  // namespace

CommPtr make_world_of_one(const ResolvedOptions& opts, int global_rank, const std::string& group) {
  return std::make_shared<WorldOfOne>(opts, global_rank, group);
}

}  // namespace fsdp::comm
