// fsdp-cpp: heartbeats — which rank is alive, and where — and what a launcher
// needs to read them.
//
// defines: watchdog::Heartbeat, watchdog::Entered, watchdog::Verdict,
//          watchdog::describe_place, watchdog::key_base
//
// Every rank of a job with two or more ranks publishes a heartbeat through the
// rendezvous store (key "<base>hb/<rank>") from a thread of its own, every
// `interval` seconds (the collective timeout / 5, at most 1 s, at least 50 ms;
// FSDP_HEARTBEAT_INTERVAL=S sets it): alive (the wall time it was written),
// the step and phase (fsdp/flight.h), and the collective it is in (sequence
// number, kind, unit, the peer it waits on, bytes arrived of expected, when
// bytes last moved). The thread is independent of the compute and
// communication threads, so a rank busy in its data loader or blocked in a
// collective still beats; a frozen, dead or cut-off one does not.
//
// On a failed collective every surviving rank reads them and classifies each
// other rank (the error message and the flight recorder's "verdict" note):
//   silent     no heartbeat for more than 3 x interval: frozen (SIGSTOP, a
//              debugger, swapping), dead, or cut off from the store
//   elsewhere  alive, but in another collective or in no collective (its
//              phase says where: data, checkpoint, ...); both places named
//   slow       alive, in the same collective, bytes still moving
//   stuck      alive, in the same collective, no bytes moving (it waits on
//              someone too: its peer is named)
// and names the cause: the silent ranks, else the ones elsewhere, else the
// slow ones. It also writes its verdict to "<base>verdict/<rank>", which
// `fsdp run` reads to name the cause of a stopped job.
//
// Launchers: `fsdp run` hosts the store itself (the ranks get
// FSDP_STORE_HOSTED=1 and connect to it as clients), so the heartbeats stay
// readable when rank 0 is the rank that froze; it reads these records
// there to name the cause of a stopped job.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// Heartbeats, and the verdict that names the rank to blame for a hang.
// Both go through the rendezvous store (watchdog.h).
namespace fsdp::watchdog {

// What a rank publishes every interval: that it is alive, and where it is.
struct Heartbeat {
  // The rank that wrote it.
  int rank = -1;
  // Its process id.
  int64_t pid = 0;
  // Its host name.
  std::string host;
  double time = 0;       // wall seconds when written
  int64_t beat = 0;      // 1, 2, ... per process
  double interval = 1;   // seconds between beats
  bool left = false;     // written once when the rank's last communicator closed cleanly
  bool dumps_on_signal = false;  // SIGUSR1 dumps the flight recorder (the handler is installed)
  // fsdp::current_step() when written.
  int64_t step = -1;
  std::string phase;     // fsdp::to_string(Phase)
  // The collective it is in (seq 0: none).
  int comm = 0;          // communicator (the n-th of the process)
  // Its sequence number on that communicator (0: none).
  uint64_t seq = 0;
  // Its kind and unit (the call's label).
  std::string kind, unit;
  int peer = -1;         // the rank it waits on (-1: none)
  std::string waiting;   // "", "receive", "send", "read"
  // Bytes arrived, of those expected.
  int64_t recv_done = 0, recv_total = 0;
  double started = 0, moved = 0;  // wall seconds the collective started / bytes last moved (0: none)

  // The JSON stored under "<base>hb/<rank>".
  nlohmann::json to_json() const;
  // The heartbeat in `text`; nullopt when it is not one.
  static std::optional<Heartbeat> parse(const std::string& text);
  // Seconds since it was written, by `now` (wall seconds).
  double age(double now) const { return now - time; }
};

// The last collective a rank entered (written by the communication thread
// as it enters each one: exact even for a rank that froze right after).
struct Entered {
  // The communicator (the n-th of the process).
  int comm = 0;
  int64_t seq = -1;      // -1: unknown; 0: none yet
  double time = 0;       // wall seconds
  // The rank's step then.
  int64_t step = -1;
  // The rank's phase then.
  std::string phase;
  std::string what;      // e.g. "all_gather 'blocks.1' (fp32, 1000 elements, 3.91 KiB)"
};

// One surviving rank's reading of a failed collective.
struct Verdict {
  int rank = -1;             // who judged
  // The failed collective's communicator (the n-th of the process).
  int comm = 0;
  // Its sequence number.
  uint64_t seq = 0;
  std::string what;          // the collective it failed in
  // Its kind and unit.
  std::string kind, unit;
  // The judging rank's step.
  int64_t step = -1;
  // The judging rank's phase.
  std::string phase;
  // Whether the collective ran out of time (not an error a peer reported).
  bool timed_out = false;
  // The other ranks by class (watchdog.h); waited_on: the peer the judge waited on.
  std::vector<int> silent, elsewhere, slow, stuck, waited_on;
  std::vector<int> dead;    // of the silent: their process is gone (this host's /proc, CMA)
  std::vector<int> desync;  // of the elsewhere: in another collective of the same communicator
  std::vector<int> culprits;  // silent, else elsewhere, else slow
  std::string summary;        // the "Cause: ..." line
  // The JSON stored under "<base>verdict/<rank>".
  nlohmann::json to_json() const;
  // The verdict in `text`; nullopt when it is not one.
  static std::optional<Verdict> parse(const std::string& text);
};

// "all_gather 'blocks.1' #86 (step 3, backward)" from a heartbeat's
// collective, or "no collective (step 3, phase data)".
std::string describe_place(const Heartbeat& h);
// "all_gather 'blocks.1' #86 (step 3, backward)" from an Entered.
std::string describe_place(const Entered& e);

// The prefix of every key of a job: "fsdp/<token>/" ("fsdp/" without one).
std::string key_base(const std::string& job_token);

}  // namespace fsdp::watchdog
