// fsdp-cpp: the heartbeat thread of a process (see include/fsdp/watchdog.h
// for what is published, and comm/diagnosis.h for how a failed collective
// is read against it).
// defines: WatchClock, Watchdog
//
// One Watchdog per process, shared by its communicators (acquire()). It owns
// a bounded store client (comm/store_client.h) whose thread writes the
// heartbeat every interval and serves the others' reads and writes (read(),
// write()), each bounded by the caller's budget: a store that is frozen or
// cut off blocks that thread, never the caller. So the communication
// thread's diagnosis of a timeout reads the store through it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/world_env.h"
#include "fsdp/watchdog.h"

namespace fsdp::comm {

class StoreClient;

// The clocks the watchdog and a diagnosis read: steady time for budgets and
// the sleep in between, wall time for heartbeats (ranks on different hosts
// compare them). Default: the real ones; a test injects its own, as
// ProgressOptions::clock, and so waits on its events instead of time.
struct WatchClock {
  using Clock = std::chrono::steady_clock;
  std::function<Clock::time_point()> now = [] { return Clock::now(); };
  std::function<double()> wall = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  std::function<void(Clock::time_point)> sleep_until = [](Clock::time_point t) { std::this_thread::sleep_until(t); };
};

class Watchdog {
 public:
  // The process's watchdog: the running one, or a new one for this world
  // (keys under `base`, e.g. "fsdp/<token>/"; the interval, host identity
  // and clock from the first caller's).
  static std::shared_ptr<Watchdog> acquire(const WorldEnv& world, const std::string& base,
                                           const ResolvedOptions& opts, WatchClock clock = {});
  // Stops the heartbeats (a last one says the rank left, unless it failed).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  double interval() const;      // seconds between heartbeats
  double silent_after() const;  // seconds without one that make a rank silent
  // Seconds since the store last answered this process's store client (each
  // heartbeat is a round trip); 0 before its first answer. Longer than
  // silent_after(): the store is as good as unreachable (cut off, frozen)
  // and a diagnosis does not wait for it.
  double store_silent_for() const;
  const std::string& base() const;

  // Values of `keys` (nullopt for an absent key), or nullopt when the store
  // did not answer within `budget`.
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
  // The clock its heartbeats are stamped with; a diagnosis reads the same.
  const WatchClock& clock() const;

  struct Beats;  // what the heartbeats say; shared with the client's thread

 private:
  Watchdog(std::shared_ptr<Beats> b, std::unique_ptr<StoreClient> client);
  std::shared_ptr<Beats> b_;
  std::unique_ptr<StoreClient> client_;  // declared last: stopped first
};

}  // namespace fsdp::comm
