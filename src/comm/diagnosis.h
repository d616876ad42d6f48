// fsdp-cpp: reading a failed collective — which other rank is to blame, and
// the words that say so (see include/fsdp/watchdog.h for the classes).
// defines: Evidence, RankReading, Decision, decide, Explained, explain,
//          Classified, diagnose, local_process_states
//
// Three steps, each apart: the communicator gathers the Evidence (the
// heartbeats and entered collectives it read from the store, where every
// rank runs, what /proc says of this host's ranks); decide() turns it into
// a Decision (one reading per rank, the verdict's classes and culprits),
// with no text; explain() words the decision for the error message and the
// verdict's summary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/watchdog.h"
#include "common/proc_state.h"
#include "fsdp/watchdog.h"

namespace fsdp::comm {

// What a rank knows when one of its collectives failed.
struct Evidence {
  // The judging rank, the world's size, the communicator, and the failed collective.
  int self = 0, world = 0, comm = 0;
  // The failed collective's sequence number.
  uint64_t seq = 0;
  // The failed collective: its description, kind and unit.
  std::string what, kind, unit;
  // The judging rank's step and phase.
  int64_t step = -1;
  // The judging rank's phase.
  std::string phase;
  // Wall seconds now, and the heartbeat age that makes a rank silent.
  double now = 0, silent_after = 3;
  // Whether the store answered (else `beats` and `entered` are empty).
  bool store_reachable = true;
  // Every rank's last heartbeat and last entered collective (store_reachable).
  std::vector<std::optional<watchdog::Heartbeat>> beats;
  // Every rank's last entered collective.
  std::vector<std::optional<watchdog::Entered>> entered;
  // Ranks whose process is known to be gone (this host's /proc, CMA).
  std::vector<bool> gone;
  // Where each rank runs (Watchdog::where()), and this process's host identity.
  std::vector<std::optional<Watchdog::Where>> where;
  // This process's host identity.
  std::string my_identity;
  // /proc's state of each rank that runs on this host (nullopt: elsewhere or unknown).
  std::vector<std::optional<proc::State>> local_state;
};

// /proc's state of every rank `where` places on the host `my_identity` names.
std::vector<std::optional<proc::State>> local_process_states(const std::vector<std::optional<Watchdog::Where>>& where,
                                                             const std::string& my_identity);

// One other rank, as the evidence shows it.
struct RankReading {
  enum class Is {
    // The store answered:
    Dead,       // its process is gone
    NoBeat,     // never published a heartbeat
    Finished,   // closed its communicators cleanly (elsewhere)
    Quiet,      // no heartbeat for more than silent_after (silent)
    FailedToo,  // its own collective failed too
    Slow,       // in this collective, bytes still moving
    Stuck,      // in this collective, no bytes moving
    Elsewhere,  // alive, in another place
    // The store did not answer:
    Unknown,    // where it runs was never read
    HereGone,   // on this host, its process is gone (silent)
    HereStopped,  // on this host, its process is stopped (silent)
    HereAlive,  // on this host, alive
    Far,        // on another host, cut off like the store (silent)
  };
  // Why an Elsewhere rank is elsewhere.
  enum class Place {
    None,
    DifferentCollective,  // it entered this sequence number as another collective (desync)
    Ahead,                // it entered a later collective
    Outside,              // in no collective (data, a checkpoint, ...)
    OtherCollective,      // in another collective
  };
  int rank = -1;
  Is is = Is::Unknown;
  Place place = Place::None;
  // Stuck: seconds no bytes moved (above 1e8: none ever did); Quiet: the heartbeat's age.
  double quiet_s = 0;
  // Slow/Stuck: whether the heartbeat is in this very collective (bytes and peer known).
  bool beat_here = false;
  // Elsewhere: the entered collective is newer than the heartbeat.
  bool entry_newer = false;
  // Elsewhere/Outside: it has not entered this collective yet (an older one).
  bool behind = false;
};

// The reading of a failed collective: every other rank's, and the verdict's classes.
struct Decision {
  // One per other rank, in rank order.
  std::vector<RankReading> ranks;
  // silent/elsewhere/slow/stuck/dead/desync/culprits filled; summary empty.
  watchdog::Verdict verdict;
};
// The decision the evidence supports.
Decision decide(const Evidence& ev);

// The decision in words.
struct Explained {
  std::string lines;    // "\nRanks: ...\nCause: ..." for the error message
  std::string summary;  // the first cause, for the verdict
};
// Words `d` (read from `ev`).
Explained explain(const Evidence& ev, const Decision& d);

// A failed collective read against every rank's heartbeat and last entered
// collective: decide() and explain() together.
struct Classified {
  std::string lines;          // "\nRanks: ...\nCause: ..." for the error message
  watchdog::Verdict verdict;  // also written to the store and the flight recorder
};
// decide() then explain(); the verdict carries the summary.
Classified diagnose(const Evidence& ev);

}  // namespace fsdp::comm
