// fsdp-cpp checkpoint tests: N ranks as threads of one process.
// defines: ThreadComm, run_threads, fsdp_slices, make_param_set
//
// The file logic of save/load is the same whether ranks are processes or
// threads; only the collectives differ. ThreadComm implements the two the
// checkpoint layer uses (all_reduce SUM, barrier) over shared memory, so
// every world size runs in one gtest process (the multi-process tests run
// the same code through `fsdp run`).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"

namespace fsdp::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : n_(n), slots_(n) {}
  // Blocks until all n ranks arrived; the last one runs `combine` on every
  // rank's tensor while the others wait (so no copy races).
  void rendezvous(int rank, torch::Tensor t, const std::function<void(std::vector<torch::Tensor>&)>& combine) {
    std::unique_lock<std::mutex> lk(mu_);
    int64_t gen = gen_;
    slots_[rank] = t;
    if (++arrived_ == n_) {
      if (combine) combine(slots_);
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lk, std::chrono::seconds(60), [&] { return gen_ != gen; }))
      throw CollectiveError("ThreadGroup: a rank did not arrive within 60 s (a rank skipped a collective)");
  }
  int size() const { return n_; }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t gen_ = 0;
  std::vector<torch::Tensor> slots_;
};

class ThreadComm : public Communicator {
 public:
  ThreadComm(std::shared_ptr<ThreadGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return g_->size(); }
  int local_rank() const override { return rank_; }
  int local_world_size() const override { return g_->size(); }
  WorkPtr all_gather(const torch::Tensor&, torch::Tensor, const CollectiveInfo&) override { unsupported(); }
  WorkPtr reduce_scatter(const torch::Tensor&, torch::Tensor, ReduceOp, const CollectiveInfo&) override { unsupported(); }
  WorkPtr all_reduce(torch::Tensor t, ReduceOp op, const CollectiveInfo&) override {
    ++all_reduces;
    g_->rendezvous(rank_, t, [op](std::vector<torch::Tensor>& ts) {
      auto sum = torch::zeros_like(ts[0]);
      for (auto& x : ts) sum += x;
      if (op == ReduceOp::AVG) sum /= static_cast<double>(ts.size());
      for (auto& x : ts) x.copy_(sum);
    });
    return done();
  }
  WorkPtr broadcast(torch::Tensor, int, const CollectiveInfo&) override { unsupported(); }
  WorkPtr gather(const torch::Tensor&, torch::Tensor, int, const CollectiveInfo&) override { unsupported(); }
  WorkPtr barrier(const CollectiveInfo&) override {
    g_->rendezvous(rank_, torch::Tensor(), nullptr);
    return done();
  }
  CommCounters counters() const override { return {}; }
  void reset_counters() override {}
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(60); }
  std::string describe() const override { return "threads world=" + std::to_string(g_->size()); }
  int all_reduces = 0;

 private:
  struct Done : Work {
    void wait() override {}
    bool is_completed() const override { return true; }
  };
  static WorkPtr done() { return std::make_shared<Done>(); }
  [[noreturn]] static void unsupported() { throw CollectiveError("ThreadComm: collective not used by checkpoints"); }
  std::shared_ptr<ThreadGroup> g_;
  int rank_;
};

// Runs fn(comm) on n threads; returns each rank's error message ("" when it
// returned normally).
inline std::vector<std::string> run_threads(int n, const std::function<void(Communicator&)>& fn) {
  auto g = std::make_shared<ThreadGroup>(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      ThreadComm c(g, r);
      try {
        fn(c);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty message)";
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

// A model's parameters: name -> full tensor. Values encode name and index so
// every expected value is computable.
struct Param {
  std::string name;
  torch::Tensor full;
};

inline std::vector<Param> make_param_set(torch::ScalarType dtype = torch::kFloat32, int salt = 0) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"embed.weight", {13, 7}}, {"blocks.0.fc.weight", {7, 5}}, {"blocks.0.fc.bias", {5}},
      {"blocks.1.fc.weight", {5, 3}}, {"blocks.1.fc.bias", {3}}, {"head.scale", {}}, {"head.weight", {3, 11}}};
  std::vector<Param> out;
  int k = 0;
  for (auto& [n, s] : shapes) {
    int64_t numel = 1;
    for (auto d : s) numel *= d;
    auto t = torch::arange(numel, torch::kFloat64).mul(0.001).add(k++ + salt * 100).to(dtype).reshape(s);
    out.push_back({n, t});
  }
  return out;
}

// The model the process tests save at `step` (values encode the step); `big`
// adds 12 MiB so a save takes long enough to be killed in the middle of it.
inline std::vector<Param> model_at_step(int64_t step, bool big) {
  auto m = make_param_set(torch::kFloat32, static_cast<int>(step));
  if (big) m.push_back({"big", torch::arange(0, 3 << 20, torch::kFloat32).add(static_cast<double>(step))});
  return m;
}

// FSDP's FULL_SHARD layout: parameters flattened and concatenated, padded to
// a multiple of world, rank r owns [r*S, (r+1)*S), mapped back to each
// parameter's [lo, hi). `data` views the flat shard (as the engine's would);
// `zero` gives zero-filled destinations of the same layout for loading.
inline std::vector<ckpt::Slice> fsdp_slices(const std::vector<Param>& params, int rank, int world, bool zero = false,
                                            const std::string& suffix = "") {
  int64_t total = 0;
  for (auto& p : params) total += p.full.numel();
  int64_t padded = (total + world - 1) / world * world, S = padded / world;
  int64_t a = rank * S, b = a + S;
  std::vector<ckpt::Slice> out;
  int64_t off = 0;
  for (auto& p : params) {
    int64_t n = p.full.numel();
    int64_t lo = std::clamp(a - off, int64_t(0), n), hi = std::clamp(b - off, int64_t(0), n);
    if (hi < lo) hi = lo;
    ckpt::Slice s;
    s.name = p.name + suffix;
    s.full_shape = p.full.sizes().vec();
    s.dtype = p.full.scalar_type();
    s.lo = lo;
    s.hi = hi;
    auto flat = p.full.reshape(-1).slice(0, lo, hi);
    s.data = zero ? torch::zeros({hi - lo}, flat.options()) : flat.clone();
    out.push_back(std::move(s));
    off += n;
  }
  return out;
}

#if defined(EXPECT_TRUE)  // gtest included first (tests; the worker has no gtest)
// Each slice holds exactly its range of the matching parameter.
inline void expect_slices_equal(const std::vector<ckpt::Slice>& got, const std::vector<Param>& params,
                                const std::string& suffix = "") {
  ASSERT_EQ(got.size(), params.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, params[i].name + suffix);
    auto want = params[i].full.reshape(-1).slice(0, got[i].lo, got[i].hi);
    EXPECT_TRUE(torch::equal(got[i].data, want)) << got[i].name << " [" << got[i].lo << "," << got[i].hi << ")";
  }
}
#endif

}  // namespace fsdp::testing
