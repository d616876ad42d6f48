// fsdp-cpp: what a rank is doing (its phase and step) and the flight recorder
// of its last collectives.
//
// defines: Phase, to_string(Phase), set_phase, current_phase, set_step,
//          current_step, PhaseScope, flight::Record, flight::enabled,
//          flight::capacity, flight::snapshot, flight::in_flight, flight::note,
//          flight::set_identity, flight::set_default_dir, flight::dir,
//          flight::dump, flight::dump_on_signal, flight::read_dumps,
//          flight::analyze_dumps, flight::write_report, flight::ReportSummary
//
// Phases. A trainer says what the rank is doing, so a hang outside the
// collectives is named by its place ("rank 2 is elsewhere: phase data"):
//
//   fsdp::set_step(step);
//   { fsdp::PhaseScope p(fsdp::Phase::DATA);     auto b = next_batch(); }
//   { fsdp::PhaseScope p(fsdp::Phase::FORWARD);  loss = model.forward(b.x); }
//   { fsdp::PhaseScope p(fsdp::Phase::BACKWARD); loss.backward(); }
//   { fsdp::PhaseScope p(fsdp::Phase::OPTIMIZER); opt.step(); }
//
// Each is one relaxed atomic store; any thread may call them. The heartbeats
// (fsdp/watchdog.h) and every collective entered carry the current phase and
// step, so the others read where a rank was even after it froze.
//
// The flight recorder. Every collective of every communicator of the process
// is recorded in a ring buffer of the last capacity() (512, FSDP_FLIGHT_ENTRIES)
// calls: communicator, sequence number, kind, unit (label), dtype, elements,
// bytes, the wall-clock times it was enqueued, started and ended, the peer it
// waited on and how many bytes had arrived of how many. Always on
// (FSDP_FLIGHT_RECORDER=off turns it off, for the overhead benchmark
// bench/bench_flight.cpp); a call costs a lock and a few stores.
//
// Dumps: dump(reason) writes <dir>/flight-rank<R>.json (atomically; a later
// dump of the same rank replaces it). The communicator dumps on every failed
// collective; dump_on_signal() (fsdp::init does, InitOptions::
// dump_flight_on_sigusr1) makes SIGUSR1 dump (`fsdp run` forwards its own
// SIGUSR1 to every rank); a program may call dump() whenever it likes.
// The directory: dump()'s argument, else FSDP_FLIGHT_DIR (`fsdp run
// --flight-dir`), else set_default_dir() (the trainers: <ckpt-dir>/flight),
// else ./fsdp-flight. `fsdp report DIR` renders the dumps side by side.
//
// THE FILE FORMAT (schema "fsdp-flight/1"), one JSON object per rank:
//   {"schema": "fsdp-flight/1", "rank": int, "world": int, "pid": int,
//    "host": str, "reason": str, "written": wall s, "step": int,
//    "phase": str, "capacity": int, "recorded": int (calls since start),
//    "collectives": [ {"comm": int, "seq": int (0: not started), "kind": str,
//       "unit": str, "dtype": str, "numel": int, "bytes": int,
//       "state": "queued" | "running" | "done" | "failed",
//       "enqueued": wall s, "started": wall s | null, "ended": wall s | null,
//       "step": int, "phase": str (at enqueue),
//       "peer": int (-1: none), "waiting": "" | "receive" | "send" | "read",
//       "recv_done": int, "recv_total": int, "sent_done": int,
//       "send_total": int, "error": str} ... oldest first ],
//    "notes": {key: any}}   (the communicator adds "heartbeats" (the last
//                            ones it read) and "verdict" after a timeout)
// Times are wall-clock seconds (system_clock) so the dumps of ranks on
// different hosts share one axis. The communicators record through hooks
// of the library's own (src/observe/flight_hooks.h), not part of this API.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/config.h"

namespace fsdp {

// What a rank is doing, so that a hang outside the collectives is named by
// its place (flight.h).
enum class Phase : int { NONE = 0, DATA, FORWARD, BACKWARD, OPTIMIZER, CHECKPOINT, EVALUATION };
// "none", "data", "forward", "backward", "optimizer", "checkpoint", "evaluation"
const char* to_string(Phase p);

// Sets the process's phase (any thread; one relaxed atomic store).
void set_phase(Phase p);
// The phase set last, by any thread (NONE until one is set).
Phase current_phase();
// The training step (the trainer's count; -1 until set).
void set_step(int64_t step);
// The step set last (-1 until set).
int64_t current_step();

// Sets a phase for a scope and puts the previous one back at its end.
class PhaseScope {
 public:
  // Remembers the current phase and sets `p` until the scope ends.
  explicit PhaseScope(Phase p) : prev_(current_phase()) { set_phase(p); }
  ~PhaseScope() { set_phase(prev_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase prev_;
};

// The flight recorder: the process's last collectives, dumped when one fails.
// Also on SIGUSR1; the file format is in flight.h.
namespace flight {

// One collective as the recorder holds it.
struct Record {
  // The communicator: the n-th of the process.
  int comm = 0;
  // Its sequence number on that communicator (0: not started).
  uint64_t seq = 0;
  // The kind, the unit (the call's label) and the dtype, as the dump spells them.
  std::string kind, unit, dtype;
  // Elements and bytes of the call.
  int64_t numel = 0, bytes = 0;
  std::string state;  // queued, running, done, failed
  double enqueued = 0, started = 0, ended = 0;  // wall seconds; 0: not yet
  // The step when it was enqueued.
  int64_t step = -1;
  // The phase when it was enqueued.
  std::string phase;
  // The rank it waited on last (-1: none).
  int peer = -1;
  // What for: "", "receive", "send", "read".
  std::string waiting;
  // Bytes received and sent, of the totals.
  int64_t recv_done = 0, recv_total = 0, sent_done = 0, send_total = 0;
  double moved = 0;  // wall seconds of the last bytes moved; 0: none
  // Why it failed; "" unless state is failed.
  std::string error;
  // One entry of a dump's "collectives" (the file format of flight.h).
  nlohmann::json to_json() const;
};

// What the recorder keeps (fsdp::init sets it from InitOptions; the
// environment's FSDP_FLIGHT_RECORDER and FSDP_FLIGHT_ENTRIES override).
struct RecorderOptions {
  // false: nothing is recorded.
  bool enabled = true;
  // Collectives the ring keeps, in [8, 2^20].
  int entries = 512;
};
// Sets the recorder. `entries` applies while nothing has been recorded yet
// (the ring is fixed from the first record on); `enabled` at once. Throws
// fsdp::Error for entries out of range.
void configure(const RecorderOptions& options);
// FSDP_FLIGHT_RECORDER, FSDP_FLIGHT_ENTRIES and FSDP_FLIGHT_DIR of `env`,
// those that are set, override what configure() and set_default_dir()
// chose. fsdp::init and make_communicator_from_env call it with the
// environment they read.
void apply_env(const config::EnvConfig& env);
// False when recording is off: nothing is recorded.
bool enabled();
// Collectives the ring keeps (512 unless configured).
int capacity();

// The recorded collectives, oldest first.
std::vector<Record> snapshot();
// The oldest started, unfinished collective (its Record), if any.
bool in_flight(Record* out);

// Extra JSON under "notes" in every later dump (replaces the key's value).
void note(const std::string& key, nlohmann::json value);
// Who this process is (the first communicator sets it).
void set_identity(int rank, int world);
// The dump directory when neither dump()'s argument nor FSDP_FLIGHT_DIR says.
void set_default_dir(const std::string& dir);
// Where dump() writes without an argument (the order in flight.h).
std::string dir();
// Writes <dir>/flight-rank<R>.json; returns its path ("" when it could not:
// the reason is written to stderr, never thrown).
std::string dump(const std::string& reason, const std::string& dir = "");
// SIGUSR1 -> dump("SIGUSR1") from a thread of its own (idempotent), when
// SIGUSR1 is still SIG_DFL (a program's own handler is kept). Only a program
// that called it (fsdp::init does by default) has this handler; SIGUSR1
// otherwise does what the program set, by default end the process.
void dump_on_signal();
// Whether dump_on_signal installed its handler (the heartbeat says so).
bool dumps_on_signal();

// The flight-rank*.json files of a directory, by rank (for fsdp report).
std::vector<nlohmann::json> read_dumps(const std::string& dir);

// The dumps side by side: {"culprit": rank (-1: none named), "headline": the
// page's first line, "ranks": [{rank, host, pid, reason, step, phase,
// written, unfinished: [collectives], last, verdict?}]}. The culprit is the
// rank the survivors' verdicts name most.
nlohmann::json analyze_dumps(const std::vector<nlohmann::json>& dumps);

// What write_report drew, for the caller's message.
struct ReportSummary {
  // Dumps drawn (one per rank).
  int ranks = 0;
  // The rank named as the cause (-1: none).
  int culprit = -1;
  int unfinished = 0;   // bars drawn as unfinished
  // The page's first line.
  std::string headline;
  // Size of the page written.
  int64_t bytes = 0;
};
// One self-contained HTML page (inline SVG, no script): the culprit and its
// phase at the top, every rank's last collectives on one time axis, the
// unfinished ones in red. Throws fsdp::Error when `dumps` is empty or the
// file cannot be written.
ReportSummary write_report(const std::vector<nlohmann::json>& dumps, const std::string& out_html,
                           const std::string& title);

}  // namespace flight
}  // namespace fsdp
