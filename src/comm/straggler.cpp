// fsdp-cpp: straggler detection (see fsdp/straggler.h).
#include "fsdp/straggler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "fsdp/errors.h"
#include "fsdp/trace.h"

namespace fsdp {

StragglerMonitor::StragglerMonitor(CommPtr comm, double factor, int window)
    : comm_(std::move(comm)), factor_(factor), window_(window) {
  if (!comm_) throw Error("StragglerMonitor: expected a communicator, found null");
  if (!(factor > 1.0) || !std::isfinite(factor))
    throw Error(detail::cat("StragglerMonitor: factor must be a finite number > 1 (e.g. 1.5), found ", factor));
  if (window < 1) throw Error(detail::cat("StragglerMonitor: window must be >= 1 step, found ", window));
  streak_.assign(comm_->world_size(), 0);
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
  std::vector<double> sorted = rep.seconds;
  std::sort(sorted.begin(), sorted.end());
  rep.median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);

  std::string names;
  for (int q = 0; q < n; ++q) {
    // A rank only counts as slow against a positive median: idle steps of 0 s
    // (or clocks that did not tick) name nobody.
    bool slow = rep.median > 0 && rep.seconds[q] > factor_ * rep.median;
    streak_[q] = slow ? streak_[q] + 1 : 0;
    if (streak_[q] >= window_) rep.stragglers.push_back(q);
    // Log when the streak reaches the window, then once per further window.
    if (streak_[q] >= window_ && streak_[q] % window_ == 0)
      names += detail::cat(names.empty() ? "" : ", ", "rank ", q, " (", rep.seconds[q], " s)");
  }
  if (!names.empty()) {
    char med[32];
    std::snprintf(med, sizeof med, "%.4g", rep.median);
    rep.message = detail::cat("fsdp: straggler at step ", rep.step, ": ", names, " slower than ", factor_,
                              " x the median step time ", med, " s for the last ", window_,
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

}  // namespace fsdp
