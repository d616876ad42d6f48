// fsdp-cpp: reading a failed collective — which other rank is to blame, and
// the words that say so (see include/fsdp/watchdog.h for the classes).
// defines: FailedCall, Naming, Evidence, collect_evidence, RankReading,
//          Decision, decide, Explained, explain, Classified, classify,
//          render_failure, publish_verdict, local_process_states
//
// Steps, each apart:
//   collect_evidence  the only one that waits or asks anyone: the heartbeats
//                     and entered collectives read from the store (within a
//                     budget), where every rank runs, what /proc and the
//                     transport say of this host's ranks;
//   decide            the Evidence as a Decision (one reading per rank, the
//                     verdict's classes and culprits), with no text;
//   explain           the decision in words (the "Ranks:" and "Cause:" lines
//                     and the verdict's summary); classify = decide + explain;
//   render_failure    the whole error message, from the call, the evidence
//                     and the classification, with no I/O;
//   publish_verdict   the verdict where the launcher and the flight recorder
//                     read it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/watchdog.h"
#include "common/proc_state.h"
#include "fsdp/watchdog.h"

namespace fsdp::flight {
struct Progress;
}

namespace fsdp::comm {

class Algorithms;
class Rendezvous;

// What the failing rank knows of its own call, without asking anyone.
struct FailedCall {
  uint64_t seq = 0;
  std::string what;        // describe_call(shape)
  std::string kind, unit;  // the collective's kind and label
  std::string error;       // the transport's own error
  double seconds = 0;      // how long it ran before it failed
  double timeout_s = 0;    // the communicator's timeout
  // Where its transfer stood (flight::Progress at the failure): the peer
  // waited on (-1: none) and for what, the bytes arrived and sent of the
  // totals.
  int peer = -1;
  int waiting = 0;  // flight::Progress::Waiting
  int64_t recv_done = 0, recv_total = 0, sent_done = 0, send_total = 0;

  // Whether it ran out of time (rather than failing on an error a peer caused).
  bool timed_out() const { return seconds >= 0.9 * timeout_s; }
  // The progress part, read from the transfer's counters now.
  void record(const flight::Progress& p);
};

// How messages name a communicator and its ranks: a world's rank q is
// "rank q"; a group's is its global rank with the group rank beside it.
struct Naming {
  std::string group;        // a group's name; "" for a world
  std::vector<int> global;  // the global rank of each rank
  std::string describe;     // Communicator::describe()
  std::string name_of(int q) const;
  std::string ranks_text() const;  // "2, 3"
};

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
  // The store: its address, and how long it had not answered this rank's
  // heartbeats when the reading began (store_silent: longer than a rank
  // takes to be silent, so the reading got the short budget).
  std::string store;
  double store_quiet_s = 0;
  bool store_silent = false;
  // The most the reading could take.
  std::chrono::milliseconds store_budget{0};
  // The peers of this rank's path whose process is gone ("rank 1 (pid 42)").
  std::string gone_peers;
};

// Where collect_evidence reads from, and on which clocks: a communicator
// fills it from its watchdog, rendezvous and path (evidence_from); a test
// from its own fakes.
struct EvidenceSource {
  // Values of `keys` (nullopt: absent), or nullopt when the store did not
  // answer within `budget` (Watchdog::read: the watchdog's own connection).
  std::function<std::optional<std::vector<std::optional<std::string>>>(const std::vector<std::string>& keys,
                                                                        std::chrono::milliseconds budget)>
      read;
  // Where the keys are: this communicator's ("<base>c<generation>/": the
  // ranks' progress), the job's (heartbeats), the communicator's
  // generation, and the store's address (messages).
  std::string prefix, base;
  int generation = 0;
  std::string store;
  // The heartbeats' interval and the age that makes a rank silent; how
  // long the store had not answered this rank's heartbeats (seconds).
  double interval = 1, silent_after = 3, store_silent_for = 0;
  // Where every rank runs, and this process's host identity.
  std::vector<std::optional<Watchdog::Where>> where;
  std::string identity;
  // This host's processes: the pid of rank q when the path reads its memory
  // (-1: not known to it), the path's peers that are gone ("rank 1 (pid
  // 42)"), and whether a pid's process is gone (cma.h, process_gone).
  std::function<pid_t(int q)> pid_of;
  std::function<std::string()> gone_peers;
  std::function<bool(pid_t)> gone;
  WatchClock clock;
};

// A communicator's source: its watchdog (store reads, heartbeat settings,
// clock), its rendezvous (keys) and its path (this host's peers). All three
// must outlive the source.
EvidenceSource evidence_from(Watchdog& dog, const Rendezvous& rdv, const Algorithms& path);

// Reads every rank's last entered collective and heartbeat, within the
// budget (1.5 s; 0.2 s when the store has not answered this rank's
// heartbeats for longer than a rank takes to be silent); when a heartbeat
// is neither fresh nor yet overdue, sleeps until it is one or the other
// (within the budget) and reads again. Then asks this host about the ranks'
// processes (the path's CMA peers, else what the watchdog knows of where
// they run). `global`: the global rank of each rank; `self`: this rank.
Evidence collect_evidence(const EvidenceSource& src, const std::vector<int>& global, int self,
                          const FailedCall& call);

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
Classified classify(const Evidence& ev);

// The CollectiveError's message: the call, where its transfer stood, the
// ranks that never arrived or entered something else, the classification,
// what to do, and the transport's own error (after `error_source`, e.g.
// "gloo"). No I/O.
std::string render_failure(const FailedCall& call, const Evidence& ev, const Classified& c, const Naming& names,
                           const char* error_source);

// The verdict for the flight recorder's notes (with the heartbeats read)
// and under "<key_base>verdict/<global rank>" for the launcher (bounded:
// 0.3 s).
void publish_verdict(Watchdog& dog, const std::string& key_base, int global_rank, const watchdog::Verdict& v,
                     const Evidence& ev);

}  // namespace fsdp::comm
