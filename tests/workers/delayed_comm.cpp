// fsdp-cpp tests: the delaying communicator (see delayed_comm.h).
#include "delayed_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/forwarding.h"

namespace fsdp::testing {
namespace {

// Completion of one delayed call: done once inner's collective finished.
class DelayedWork : public Work {
 public:
  void finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> g(mu_);
    error_ = std::move(e);
    done_ = true;
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() const override {
    std::lock_guard<std::mutex> g(mu_);
    return done_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class DelayedCommunicator : public comm::ForwardingCommunicator {
 public:
  DelayedCommunicator(CommPtr inner, std::chrono::milliseconds delay)
      : ForwardingCommunicator(std::move(inner)), delay_(delay), thread_([this] { run(); }) {}
  // Drains what is queued: every Work handed out completes.
  ~DelayedCommunicator() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // The groups are delayed as much as their parent.
  CommPtr split(int color, const SplitOptions& opts) override {
    return with_comm_delay(inner()->split(color, opts), delay_);
  }

  // The lambdas hold the tensors (by value) until inner's collective is done.
  WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output, const CollectiveInfo& info) override {
    return submit([=, this] { inner()->all_gather(input, output, info)->wait(); });
  }
  WorkPtr reduce_scatter(const torch::Tensor& input, torch::Tensor output, ReduceOp op,
                         const CollectiveInfo& info) override {
    return submit([=, this] { inner()->reduce_scatter(input, output, op, info)->wait(); });
  }
  WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op, const CollectiveInfo& info) override {
    return submit([=, this] { inner()->all_reduce(tensor, op, info)->wait(); });
  }
  WorkPtr broadcast(torch::Tensor tensor, int root, const CollectiveInfo& info) override {
    return submit([=, this] { inner()->broadcast(tensor, root, info)->wait(); });
  }
  WorkPtr barrier(const CollectiveInfo& info) override {
    return submit([=, this] { inner()->barrier(info)->wait(); });
  }
  WorkPtr gather(const torch::Tensor& input, torch::Tensor output, int root, const CollectiveInfo& info) override {
    return submit([=, this] { inner()->gather(input, output, root, info)->wait(); });
  }

  // Error feedback's residuals in issue order too: after the delayed
  // collectives issued before, as the communicator's own promise says.
  Residuals residuals() override {
    Residuals out;
    submit([&out, this] { out = inner()->residuals(); })->wait();
    return out;
  }
  void load_residuals(const std::map<std::string, torch::Tensor>& by_buffer) override {
    submit([by_buffer, this] { inner()->load_residuals(by_buffer); })->wait();
  }

  // Counters, timeouts and the ranks are inner's (forwarded).
  std::string describe() const override {
    return inner()->describe() + " +" + std::to_string(delay_.count()) + " ms per collective";
  }

 private:
  struct Job {
    std::function<void()> call;
    std::shared_ptr<DelayedWork> work;
  };

  WorkPtr submit(std::function<void()> call) {
    auto work = std::make_shared<DelayedWork>();
    {
      std::lock_guard<std::mutex> g(mu_);
      jobs_.push_back({std::move(call), work});
    }
    cv_.notify_all();
    return work;
  }

  // One thread, issue order: inner sees the calls in the order the engine made them.
  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::this_thread::sleep_for(delay_);
      std::exception_ptr error;
      try {
        job.call();
      } catch (...) {
        error = std::current_exception();
      }
      job.call = nullptr;  // release the tensors before the caller may reuse them
      job.work->finish(error);
    }
  }

  const std::chrono::milliseconds delay_;
  std::mutex mu_;  // guards jobs_ and stop_
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace

CommPtr with_comm_delay(CommPtr inner, std::chrono::milliseconds delay) {
  return std::make_shared<DelayedCommunicator>(std::move(inner), delay);
}

CommPtr comm_from_env_with_test_delay() {
  CommPtr comm = make_communicator_from_env();
  const char* v = std::getenv("FSDP_TEST_COMM_DELAY_MS");
  const int ms = v ? std::max(0, std::atoi(v)) : 0;
  if (ms == 0) return comm;
  return with_comm_delay(comm, std::chrono::milliseconds(ms * (comm->rank() + 1)));
}

}  // namespace fsdp::testing
