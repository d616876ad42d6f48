// fsdp-cpp: the heartbeat thread of a process, and the reading of a failed
// collective (see include/fsdp/watchdog.h for what is published and how
// ranks are classified).
// defines: Watchdog, classify, Classified
//
// One Watchdog per process, shared by its communicators (acquire()); it
// owns a thread and a store connection of its own. That thread writes the
// heartbeat every interval and serves reads and writes for the others
// (read(), write()), each bounded by the caller's budget: a store that is
// frozen or cut off blocks the thread, never the caller. So the
// communication thread's diagnosis of a timeout reads the store through it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/world_env.h"
#include "fsdp/watchdog.h"

namespace fsdp::comm {

class Watchdog {
 public:
  // The process's watchdog: the running one, or a new one for this world
  // (keys under `base`, e.g. "fsdp/<token>/"; the interval and host
  // identity from the first caller's options).
  static std::shared_ptr<Watchdog> acquire(const WorldEnv& world, const std::string& base,
                                           const ResolvedOptions& opts);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  double interval() const;      // seconds between heartbeats
  double silent_after() const;  // seconds without one that make a rank silent
  // Seconds since the store last answered this process's heartbeat thread
  // (each heartbeat is a round trip); 0 before its first answer. Longer
  // than silent_after(): the store is as good as unreachable (cut off,
  // frozen) and a diagnosis does not wait for it.
  double store_silent_for() const;
  const std::string& base() const;

  // Values of `keys` ("" for an absent key), or nullopt when the store did
  // not answer within `budget`.
  std::optional<std::vector<std::optional<std::string>>> read(const std::vector<std::string>& keys,
                                                              std::chrono::milliseconds budget);
  // Sets `key`; true once sent within `budget`.
  bool write(const std::string& key, const std::string& value, std::chrono::milliseconds budget);
  // From now on every heartbeat says the rank failed (it exits after its
  // error): the others do not take it for the cause.
  void mark_failed();

  // Where every rank runs (read once in the background after start; empty
  // entries until then), and this process's host identity: what a rank
  // knows of the others when the store stops answering.
  struct Where {
    std::string host;      // host name
    std::string identity;  // host name, boot id, pid and net namespaces (or FSDP_HOST_ID)
    int64_t pid = 0;
  };
  std::vector<std::optional<Where>> where() const;
  const std::string& identity() const;

  struct State;  // shared with the thread (outlives *this if the thread is stuck)

 private:
  explicit Watchdog(std::shared_ptr<State> s);
  std::shared_ptr<State> s_;
  std::thread thread_;  // the heartbeat thread; stopped and joined (bounded) by ~Watchdog
};

// A failed collective read against every rank's heartbeat and last entered
// collective.
struct Classified {
  std::string lines;          // "\nRanks: ...\nCause: ..." for the error message
  watchdog::Verdict verdict;  // also written to the store and the flight recorder
};
// `gone`: ranks whose process is known to be gone (this host's /proc).
// When the store did not answer, `where` (Watchdog::where()) tells the
// ranks of this host (their /proc says alive, stopped or gone) from those
// of other hosts (cut off: silent).
Classified classify(int self, int world, int comm, uint64_t seq, const std::string& what, const std::string& kind,
                    const std::string& unit, const std::vector<std::optional<watchdog::Heartbeat>>& beats,
                    const std::vector<std::optional<watchdog::Entered>>& entered, bool store_reachable, double now,
                    double silent_after, const std::vector<std::optional<Watchdog::Where>>& where = {},
                    const std::string& my_identity = "", const std::vector<bool>& gone = {});

// "seq|wall|step|phase|what", the value of a seq/<r> key, and back.
std::string format_entered(uint64_t seq, const std::string& what);
std::optional<watchdog::Entered> parse_entered(const std::string& value, int comm);

}  // namespace fsdp::comm
