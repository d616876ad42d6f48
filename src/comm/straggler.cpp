// fsdp-cpp: straggler detection (see fsdp/straggler.h).
#include "fsdp/straggler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "comm/forwarding.h"
#include "fsdp/errors.h"
#include "fsdp/trace.h"

namespace fsdp {

StragglerMonitor::StragglerMonitor(CommPtr comm, double factor, int window, double min_gap_seconds)
    : comm_(std::move(comm)), factor_(factor), window_(window), min_gap_(min_gap_seconds) {
  if (!comm_) throw Error("StragglerMonitor: expected a communicator, found null");
  if (!(factor > 1.0) || !std::isfinite(factor))
    throw Error(detail::cat("StragglerMonitor: factor must be a finite number > 1 (e.g. 1.5), found ", factor));
  if (window < 1) throw Error(detail::cat("StragglerMonitor: window must be >= 1 step, found ", window));
  if (!(min_gap_seconds >= 0) || !std::isfinite(min_gap_seconds))
    throw Error(detail::cat("StragglerMonitor: min_gap_seconds must be a finite number >= 0, found ", min_gap_seconds));
  streak_.assign(comm_->world_size(), 0);
  busy_sum_.assign(comm_->world_size(), 0.0);
  named_at_.assign(comm_->world_size(), {});
}

StragglerReport StragglerMonitor::observe(double step_seconds) {
  const int n = comm_->world_size();
  auto mine = torch::full({1}, step_seconds, torch::kDouble);
  auto all = torch::empty({n}, torch::kDouble);
  comm_->all_gather(mine, all, {"straggler_step_time"})->wait();

  StragglerReport rep;
  rep.step = ++steps_;
  const double* t = all.data_ptr<double>();
  rep.seconds.assign(t, t + n);
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t m = v.size();
    return m == 0 ? 0.0 : m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
  };
  rep.median = median_of(rep.seconds);
  for (int q = 0; q < n; ++q) busy_sum_[q] += rep.seconds[q];

  std::string names;
  for (int q = 0; q < n; ++q) {
    // Against the median of the OTHER ranks: with 2 ranks that is the other
    // one (the median of both could never be exceeded 2x). A rank only counts
    // as slow against a positive reference: idle steps of 0 s (or clocks that
    // did not tick) name nobody; nor does a gap below min_gap_.
    std::vector<double> others;
    for (int o = 0; o < n; ++o)
      if (o != q) others.push_back(rep.seconds[o]);
    const double ref = median_of(others);
    const bool slow = n > 1 && ref > 0 && rep.seconds[q] > factor_ * ref && rep.seconds[q] > ref + min_gap_;
    streak_[q] = slow ? streak_[q] + 1 : 0;
    if (streak_[q] >= window_) rep.stragglers.push_back(q);
    // Log when the streak reaches the window, then once per further window.
    if (streak_[q] >= window_ && streak_[q] % window_ == 0) {
      char b[96];
      std::snprintf(b, sizeof b, "rank %d (%.4g s against %.4g s)", q, rep.seconds[q], ref);
      names += detail::cat(names.empty() ? "" : ", ", b);
      named_at_[q].push_back(rep.step);
    }
  }
  if (!names.empty()) {
    rep.message = detail::cat("fsdp: straggler at step ", rep.step, ": ", names, " slower than ", factor_,
                              " x the median step time of the other ranks for the last ", window_,
                              " steps. Check that rank's host (CPU contention, thermal throttling, "
                              "data loading, a slow disk).");
    if (trace::enabled()) trace::instant("straggler", "step", {{"ranks", rep.stragglers}, {"median", rep.median}});
    if (log_ && comm_->rank() == 0) {
      std::fprintf(stderr, "%s\n", rep.message.c_str());
      std::fflush(stderr);
    }
  }
  return rep;
}

std::string StragglerMonitor::summary() const {
  const int n = static_cast<int>(busy_sum_.size());
  if (steps_ == 0 || n < 2) return "";
  auto ms = [&](int q) { return busy_sum_[q] * 1000.0 / double(steps_); };
  char b[96];
  std::string busy;
  if (n <= 8) {
    for (int q = 0; q < n; ++q) {
      std::snprintf(b, sizeof b, "%sr%d %.1f", q ? "  " : "", q, ms(q));
      busy += b;
    }
  } else {
    std::vector<int> order(n);
    for (int q = 0; q < n; ++q) order[q] = q;
    std::sort(order.begin(), order.end(), [&](int x, int y) { return busy_sum_[x] < busy_sum_[y]; });
    std::snprintf(b, sizeof b, "min r%d %.1f, median %.1f, max r%d %.1f", order.front(), ms(order.front()),
                  ms(order[n / 2]), order.back(), ms(order.back()));
    busy = b;
  }
  std::string named;
  int named_ranks = 0;
  for (int q = 0; q < n; ++q) {
    if (named_at_[q].empty()) continue;
    if (++named_ranks > 8) continue;
    std::string steps;
    for (size_t i = 0; i < named_at_[q].size() && i < 6; ++i)
      steps += detail::cat(i ? ", " : "", i == 5 ? std::string("...") : std::to_string(named_at_[q][i]));
    named += detail::cat(named.empty() ? "" : "; ", "rank ", q, " named at step", named_at_[q].size() > 1 ? "s " : " ",
                         steps);
  }
  if (named_ranks > 8) named += detail::cat("; ", named_ranks - 8, " more ranks");
  const std::string rule = detail::cat("slower than ", factor_, " x the other ranks' median for ", window_,
                                       " step", window_ == 1 ? "" : "s", " in a row");
  return detail::cat("fsdp: straggler monitor: ", steps_, " step", steps_ == 1 ? "" : "s",
                     ", mean busy ms per rank ", busy, "; ",
                     named.empty() ? "no rank was " + rule : named + " (" + rule + ")");
}

// ---------------------------------------------------------------------------
// Wait time: a forwarding communicator whose Work times blocking waits.

double WaitClock::now() const {
  if (clock_) return clock_();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

class TimedWork final : public Work {
 public:
  TimedWork(WorkPtr inner, std::shared_ptr<WaitClock> clock) : inner_(std::move(inner)), clock_(std::move(clock)) {}
  void wait() override {
    if (inner_->is_completed()) return inner_->wait();  // rethrows an error, costs nothing
    const double t0 = clock_->now();
    try {
      inner_->wait();
    } catch (...) {
      clock_->add(clock_->now() - t0);
      throw;
    }
    clock_->add(clock_->now() - t0);
  }
  bool is_completed() const override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::shared_ptr<WaitClock> clock_;
};

class WaitClockCommunicator final : public comm::ForwardingCommunicator {
 public:
  WaitClockCommunicator(CommPtr inner, std::shared_ptr<WaitClock> clock)
      : ForwardingCommunicator(std::move(inner)), clock_(std::move(clock)) {}

  WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output, const CollectiveInfo& info) override {
    return timed(ForwardingCommunicator::all_gather(input, std::move(output), info));
  }
  WorkPtr reduce_scatter(const torch::Tensor& input, torch::Tensor output, ReduceOp op,
                         const CollectiveInfo& info) override {
    return timed(ForwardingCommunicator::reduce_scatter(input, std::move(output), op, info));
  }
  WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op, const CollectiveInfo& info) override {
    return timed(ForwardingCommunicator::all_reduce(std::move(tensor), op, info));
  }
  WorkPtr broadcast(torch::Tensor tensor, int root, const CollectiveInfo& info) override {
    return timed(ForwardingCommunicator::broadcast(std::move(tensor), root, info));
  }
  WorkPtr barrier(const CollectiveInfo& info) override { return timed(ForwardingCommunicator::barrier(info)); }
  WorkPtr gather(const torch::Tensor& input, torch::Tensor output, int root, const CollectiveInfo& info) override {
    return timed(ForwardingCommunicator::gather(input, std::move(output), root, info));
  }
  // A group's waits count on the same clock (HYBRID's shard and replica groups).
  CommPtr split(int color, const SplitOptions& opts) override {
    return std::make_shared<WaitClockCommunicator>(inner()->split(color, opts), clock_);
  }

 private:
  WorkPtr timed(WorkPtr w) { return std::make_shared<TimedWork>(std::move(w), clock_); }
  const std::shared_ptr<WaitClock> clock_;
};

}  // namespace

CommPtr with_wait_clock(CommPtr inner, std::shared_ptr<WaitClock> clock) {
  if (!inner) throw Error("with_wait_clock: expected a communicator, found null");
  if (!clock) throw Error("with_wait_clock: expected a WaitClock, found null (std::make_shared<fsdp::WaitClock>())");
  return std::make_shared<WaitClockCommunicator>(std::move(inner), std::move(clock));
}

}  // namespace fsdp
