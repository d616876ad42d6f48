// fsdp-cpp: how `fsdp run` names the rank that stopped a job — the evidence
// it gathers, the decision, and the words, each apart (see launcher.h for
// the order of the questions).
// defines: diagnosis::RankFacts, diagnosis::Evidence, diagnosis::Finding,
//          diagnosis::decide, diagnosis::cause_text, diagnosis::finding_json, diagnosis::signal_name,
//          diagnosis::rank_list, diagnosis::clock_time, diagnosis::seconds_text
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/proc_state.h"
#include "fsdp/watchdog.h"

namespace fsdp::tools::diagnosis {

// One of this node's ranks when the job failed.
struct RankFacts {
  int local = 0, global = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;             // its wait status once it exited
  int stop_signal = 0;        // stopped by this signal (waitpid), 0: not stopped
  double stopped_at = 0;      // wall seconds
  double exited_at = 0;       // wall seconds
  bool signaled_by_us = false;
  proc::State state = proc::State::Unreadable;  // /proc now (running ranks)
};

// What the store holds of one rank (both absent without a store).
struct Records {
  std::optional<watchdog::Heartbeat> beat;
  std::optional<watchdog::Entered> entered;
};

// Everything the launcher knows when a rank failed.
struct Evidence {
  double now = 0;  // wall seconds
  int world = 0;
  std::vector<RankFacts> local;  // this node's ranks, by local rank
  int first = -1;                // the first local rank that failed (index into `local`)
  std::map<int, watchdog::Verdict> verdicts;  // by the rank that judged (any node)
  std::map<int, Records> records;  // by global rank: this node's ranks and the verdicts' culprits
};

// The ranks worth reading from the store: this node's and every verdict's culprits.
std::vector<int> ranks_to_read(const Evidence& ev);

// Who caused the failure, and what to do about it before stopping the job.
struct Finding {
  enum class Kind {
    None,     // nothing more is known than the first failure's exit
    Killed,   // the first failed rank was killed by a signal the launcher did not send
    Stopped,  // a local rank is stopped (SIGSTOP, a debugger)
    Named,    // the rank the verdicts name
  };
  // What the verdicts say of a Named culprit.
  enum class Named { Desync, Dead, AliveElsewhere, Unresponsive };
  Kind kind = Kind::None;
  Named named = Named::Unresponsive;
  int culprit = -1;  // global rank
  int local = -1;    // index into Evidence::local, -1: on another node
  // The ranks that waited for the culprit, and whether any of them timed out.
  std::vector<int> waiting;
  // Whether any waiting rank timed out (rather than failed).
  bool waiting_timed_out = false;
  int judge = -1;    // Desync: the rank whose verdict is quoted
  // Signals for the culprit before the job stops: SIGUSR1 to dump its
  // flight recorder (its heartbeat says the handler is installed), and
  // SIGCONT first when it is stopped.
  bool ask_dump = false, continue_first = false;
  // Whether the cause is printed at once (else it ends the final message).
  bool print_now = false;
};

// The finding the evidence supports.
Finding decide(const Evidence& ev);
// The cause in words ("" for Kind::None).
std::string cause_text(const Evidence& ev, const Finding& f);
// The same finding as data, what the words are rendered from: kind
// ("none", "killed", "stopped", "named"), named ("desync", "dead",
// "elsewhere", "unresponsive"), culprit and its pid, host, signal, exit code
// or process state, its last heartbeat (age_s, step, phase), the collective
// it was in (seq and what, or kind and unit; in none: last_entered), the
// ranks that waited and whether they timed out, the first rank that failed
// (and its exit code or signal), and the words ("cause"). The launcher
// writes it beside the flight dumps (launcher-node<k>.json).
nlohmann::json finding_json(const Evidence& ev, const Finding& f);

// "SIGKILL (9)", or "signal N" for one without a name.
std::string signal_name(int sig);
// "rank 3" or "ranks 1, 2".
std::string rank_list(const std::vector<int>& v);
// "13:05:42", local time.
std::string clock_time(double wall);
// "2.5 s".
std::string seconds_text(double s);

}  // namespace fsdp::tools::diagnosis
