// fsdp-cpp: progress of long work (training steps, checkpoint saves) on rank 0.
// defines: ProgressOptions, Progress, progress::clear_line, progress::format_duration
//
//   fsdp::ProgressOptions po;
//   po.label = "train"; po.unit = "steps"; po.total = 500; po.rank = comm->rank();
//   po.rate_scale = tokens_per_step; po.rate_unit = "tok/s";
//   fsdp::Progress prog(po);
//   for (...) { step(); prog.update(step + 1, {{"loss", "2.3456"}}); }
//   prog.finish();
//
// What it prints (only when rank == 0, only after `delay_s`, at most once per
// `interval_s`; the last update, done == total, always prints once something
// was shown, so a log ends at 100%):
//   output not a terminal: one full line per update
//     progress: train 120/500 steps (24%) | elapsed 31s | ETA 1m38s | 12345 tok/s | loss 2.3456
//   output a terminal: the same text rewritten in place ("\r", clear to the
//   end of the line) every `tty_interval_s`, ended by a newline at finish().
// Byte counts (unit "bytes") print as "12.00 MiB/48.00 MiB" with a MiB/s rate.
//
// The rate, the ETA (remaining / rate) and the displayed rate come from a
// moving average: the progress made over the last `window_s` seconds of
// updates (from the start until that much time has passed).
//
// Turning it off: ProgressOptions::enabled = false, or the environment
//   FSDP_PROGRESS=off       (also 0, false, no): no progress anywhere
//   FSDP_PROGRESS=lines     full lines even on a terminal (tty: force rewriting)
//   FSDP_PROGRESS_EVERY=S   seconds between lines (and before the first) for
//                           every reporter whose caller left interval_s < 0
// Invalid values are an fsdp::Error naming the variable.
//
// Another writer to the same terminal calls progress::clear_line() before
// printing, so its line does not land on the end of a half-drawn one.
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

// What a Progress reports and how often (the defaults are the trainers').
struct ProgressOptions {
  std::string label = "work";   // "train", "checkpoint step-000010"
  std::string unit = "steps";   // what `done` counts; "bytes" formats as sizes
  int64_t total = 0;            // <= 0: unknown (no percentage, no ETA)
  int64_t initial = 0;          // `done` at construction (e.g. a resumed step)
  int rank = 0;                 // only rank 0 prints
  // false: print nothing (as FSDP_PROGRESS=off).
  bool enabled = true;
  // Non-terminal output: seconds between lines and before the first one.
  // < 0: FSDP_PROGRESS_EVERY when set, otherwise 5 s. 0: a line per update.
  double interval_s = -1;
  double tty_interval_s = 0.2;  // terminal: redraw period
  double tty_delay_s = 1.0;     // terminal: nothing before this
  double window_s = 20;         // moving-average window of the rate
  // Displayed rate = (units per second) x rate_scale in rate_unit, e.g. steps
  // x tokens per step in "tok/s". Empty rate_unit: "<unit>/s".
  double rate_scale = 1;
  // The displayed rate's unit; empty: "<unit>/s".
  std::string rate_unit;
  // Where lines go; it must outlive the reporter.
  FILE* out = stdout;
  int tty = -1;                 // -1: isatty(out) (FSDP_PROGRESS=lines|tty overrides); 0 / 1: forced
  std::function<double()> clock;  // seconds, monotonic; default steady_clock (tests inject one)
};

// A progress line for long work, printed on rank 0 only (as progress.h
// describes).
class Progress {
 public:
  // Extra "key value" pairs for the line, in order.
  using Fields = std::vector<std::pair<std::string, std::string>>;

  explicit Progress(ProgressOptions opts);  // throws fsdp::Error for bad env values
  ~Progress();                              // finish()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Records `done` (monotonic) and prints when due. `fields` are appended as
  // "key value". Returns true when something was printed.
  bool update(int64_t done, const Fields& fields = {});
  // Ends a terminal line with a newline (when one is drawn). Idempotent.
  void finish();

  // False when this reporter never prints (rank != 0, disabled, FSDP_PROGRESS=off).
  bool active() const { return active_; }
  // Whether it rewrites one line in place (a terminal) rather than print lines.
  bool tty() const { return tty_; }
  // Lines printed so far, a terminal's redraws included.
  int lines_printed() const { return printed_; }
  // Seconds since construction, by ProgressOptions::clock.
  double elapsed() const;
  // Units per second over the moving-average window; 0 before any progress.
  double rate() const;
  // Seconds to reach total at rate(); < 0 when unknown (no total, no rate).
  double eta() const;
  // The text of the line for the current state (what update() prints).
  std::string line() const;

 private:
  double now() const;
  void print();

  ProgressOptions o_;
  bool active_ = true, tty_ = false;
  double start_ = 0, last_print_ = -1;
  int64_t done_ = 0, last_printed_done_ = -1;
  int printed_ = 0;
  bool finished_ = false;
  Fields fields_;
  std::deque<std::pair<double, int64_t>> samples_;  // (time, done), oldest first
};

// Helpers that other writers to the terminal share with Progress.
namespace progress {
// Erases a progress line drawn on a terminal (no-op otherwise), so the next
// print starts at column 0. Reporters redraw at their next update.
void clear_line();
// 42s, 1m38s, 2h05m, 3d04h.
std::string format_duration(double seconds);
}  // namespace progress

}  // namespace fsdp
