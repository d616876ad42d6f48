// fsdp-cpp: naming the rank that holds everyone back.
// defines: StragglerMonitor, StragglerReport
//
// Every rank calls observe(step_seconds) once per optimizer step, at the same
// step (it is a collective: one all_gather of one fp64 per rank). A rank is a
// straggler when its step time exceeded `factor` x the median step time of
// all ranks in each of the last `window` steps; rank 0 then logs one line
// naming it (on stderr, once per streak). Every rank gets the same report.
//
//   fsdp::StragglerMonitor mon(comm);          // factor 1.5, window 5
//   for (...) { auto t0 = now(); step(); mon.observe(seconds_since(t0)); }
//
// Synchronous collective ranks wait for the slowest, so the time to measure
// is the rank's own work (data loading, forward, backward up to the first
// collective that waits), not the wall time of the whole step: the latter is
// equal on every rank. Passing the wall time still names a rank whose
// slowness falls outside the collectives (e.g. input pipeline, checkpoint).
#pragma once

#include <string>
#include <vector>

#include "fsdp/comm.h"

namespace fsdp {

struct StragglerReport {
  int64_t step = 0;                // observations so far (1 for the first)
  std::vector<double> seconds;     // this step, per rank
  double median = 0;
  std::vector<int> stragglers;     // ranks slow for `window` steps in a row (ascending)
  std::string message;             // the logged line, "" when none
};

class StragglerMonitor {
 public:
  // factor > 1, window >= 1; throws fsdp::Error otherwise.
  explicit StragglerMonitor(CommPtr comm, double factor = 1.5, int window = 5);

  // Collective. Returns this step's report (the same on every rank).
  StragglerReport observe(double step_seconds);

  // Rank 0 writes the message to stderr unless turned off (tests read reports).
  void set_logging(bool on) { log_ = on; }

 private:
  // Constant after construction.
  CommPtr comm_;
  const double factor_;
  const int window_;

  bool log_ = true;
  int64_t steps_ = 0;
  std::vector<int> streak_;   // consecutive slow steps per rank
};

}  // namespace fsdp
