// fsdp-cpp: naming the rank that holds everyone back.
// defines: StragglerMonitor, StragglerReport, WaitClock, with_wait_clock
//
// Every rank calls observe(step_seconds) once per optimizer step, at the same
// step (it is a collective: one all_gather of one fp64 per rank). A rank is a
// straggler when its step time exceeded `factor` x the median step time of
// the other ranks in each of the last `window` steps; rank 0 then logs one
// line naming it (on stderr, when the streak reaches the window and once per
// further window). Every rank gets the same report. A healthy run prints
// nothing per step; summary() is the one line for the end of training.
//
//   fsdp::StragglerMonitor mon(comm);          // factor 1.5, window 5
//   for (...) { auto t0 = now(); step(); mon.observe(seconds_since(t0)); }
//
// Synchronous collectives make every rank wait for the slowest, so the wall
// time of a step is (nearly) the same on every rank. The time to pass is the
// rank's own work: the step's wall time minus the time it was blocked waiting
// for collectives. with_wait_clock() measures the latter:
//
//   auto waits = std::make_shared<fsdp::WaitClock>();
//   comm = fsdp::with_wait_clock(comm, waits);     // before fully_shard(net, comm)
//   fsdp::StragglerMonitor mon(comm, 1.5, 5);
//   for (...) {
//     const double w0 = waits->seconds(); auto t0 = now();
//     step();
//     mon.observe(seconds_since(t0) - (waits->seconds() - w0));   // busy seconds
//   }
//
// A rank that sleeps or computes slowly is then busy longer than the others,
// and the others' extra time is spent blocked in the collectives.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm.h"

namespace fsdp {

// One step as StragglerMonitor::observe judged it; the same on every rank.
struct StragglerReport {
  int64_t step = 0;                // observations so far (1 for the first)
  std::vector<double> seconds;     // this step, per rank
  double median = 0;                // of all ranks (each rank is judged against the others')
  std::vector<int> stragglers;     // ranks slow for `window` steps in a row (ascending)
  std::string message;             // the logged line, "" when none
};

// Names the rank that holds the others back, step after step. The rule is in
// straggler.h; the monitor keeps the communicator it is given.
class StragglerMonitor {
 public:
  // factor > 1, window >= 1, min_gap_seconds >= 0; throws fsdp::Error
  // otherwise. A rank counts as slow in a step when its time exceeds both
  // factor x the other ranks' median and that median + min_gap_seconds (so
  // millisecond jitter on tiny steps names nobody).
  explicit StragglerMonitor(CommPtr comm, double factor = 1.5, int window = 5, double min_gap_seconds = 0.002);

  // Collective. Returns this step's report (the same on every rank).
  StragglerReport observe(double step_seconds);

  // Rank 0 writes the message to stderr unless turned off (tests read reports).
  void set_logging(bool on) { log_ = on; }

  // One line over every step observed so far (the same on every rank; local,
  // no collective), e.g.
  //   fsdp: straggler monitor: 8 steps, mean busy ms per rank r0 9.1  r1 160.1;
  //   rank 1 named at steps 3, 6 (slower than 4 x the other ranks' median for 3 steps in a row)
  // or "...; no rank was slower than 4 x ..." when nobody was named. Ranks
  // beyond 8 are summarised as min / median / max. "" before any step and
  // in a world of one (nobody to compare with).
  std::string summary() const;

 private:
  // Constant after construction.
  CommPtr comm_;
  const double factor_;
  const int window_;
  const double min_gap_;

  bool log_ = true;
  int64_t steps_ = 0;
  std::vector<int> streak_;   // consecutive slow steps per rank
  std::vector<double> busy_sum_;               // seconds per rank over all steps
  std::vector<std::vector<int64_t>> named_at_; // steps at which each rank was named
};

// Seconds threads spent blocked in Work::wait() (thread-safe).
class WaitClock {
 public:
  // `clock`: seconds, monotonic, read before and after each blocking wait
  // (thread-safe); empty: steady_clock. Tests inject one, as
  // ProgressOptions::clock.
  explicit WaitClock(std::function<double()> clock = {}) : clock_(std::move(clock)) {}
  // The clock's reading now, in seconds.
  double now() const;
  // The total so far.
  double seconds() const { return double(ns_.load(std::memory_order_relaxed)) * 1e-9; }
  // Adds `s` seconds blocked (with_wait_clock's communicator calls it).
  void add(double s) { ns_.fetch_add(int64_t(s * 1e9), std::memory_order_relaxed); }

 private:
  std::function<double()> clock_;  // constant after construction
  std::atomic<int64_t> ns_{0};
};

// A communicator that forwards every call to `inner` and adds the time each
// wait() blocks (a collective not yet complete) to `clock`. Everything else
// (counters, timeouts, errors) is inner's.
CommPtr with_wait_clock(CommPtr inner, std::shared_ptr<WaitClock> clock);

}  // namespace fsdp
