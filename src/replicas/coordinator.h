// fsdp-cpp: the coordinator of replica groups — its store I/O around the
// rules (rules.h), and the process `fsdp coordinator` runs.
// defines: Kv, CoordinatorCore, CoordinatorOptions, Coordinator
//
// One pass reads the new registrations, every watched rank's mailbox and
// heartbeat, applies the rules and writes what they decided (answers,
// decisions), then deletes what no rank reads again. Nothing a rank writes
// can stop it: a value that does not parse, of another protocol version or
// out of range is logged once and ignored.
//
// A coordinator can be restarted under a running job, on the same address:
// it starts with an empty store and a new epoch; the ranks find the new
// epoch (their heartbeat reads it), register again and report where they
// stand, and the coordinator rebuilds the job's state from that
// (docs/DESIGN.md, "A coordinator that restarts").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "replicas/protocol.h"
#include "replicas/rules.h"

namespace fsdp::replicas {

// The store as the coordinator uses it (its own TCPStore; the simulator's
// store in tests/sim/). Calls may throw when the store fails.
class Kv {
 public:
  virtual ~Kv() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The values of `keys`, nullopt for an absent key (never waits for one).
  virtual std::vector<std::optional<std::string>> get(const std::vector<std::string>& keys) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual void erase(const std::string& key) = 0;
};

using Log = std::function<void(const std::string&)>;

// The coordinator's work over a store, one pass at a time.
class CoordinatorCore {
 public:
  // Publishes the settings (a new epoch), the token's fingerprint and the
  // launch counter's start (`launch_seed`: launches counted from it, above
  // any a previous coordinator issued: the wall clock in microseconds).
  CoordinatorCore(Kv& kv, const std::string& job_token, RuleOptions o, const std::string& epoch, int64_t launch_seed,
                  Time now, Log log);
  // Whether a rank rang the bell since the last call (and silences it).
  bool rang();
  // One pass at `now`.
  void pass(Time now);
  const CoordState& state() const { return s_; }
  const Keys& keys() const { return keys_; }

 private:
  void discover(Time now, std::vector<std::string>& logs);
  void read(Time now, std::vector<std::string>& logs);
  void complain(const std::string& key, const std::string& text, const std::string& why);
  void log(const std::string& line) const;

  Kv& kv_;
  const Keys keys_;
  Log log_;
  CoordState s_;
  int64_t registered_ = 0;                   // registrations counted and queued: [0, registered_)
  std::vector<int64_t> holes_;               // counted, not written yet (its writer between its add and its write)
  std::vector<std::pair<int, int>> watched_;  // (group, rank), in order of first registration
  std::map<std::pair<int, int>, std::string> seen_mb_, seen_hb_;  // the text last taken or refused
  std::set<std::string> complained_;         // malformed values logged once
  int64_t newest_launch_ = 0;                // the largest launch registered
  int64_t launch_counter_ = -1;              // the counter's value as last read; -1: not made yet (recovering)
  int64_t launch_seed_ = 0;                  // where this coordinator's launches start, at the least
  int64_t first_issued_ = 0;                 // the first launch its counter issued (0: none yet)
  Time last_pass_{};                         // when the previous pass ran
  // Links no quorum uses any more, whose keys are deleted as their members'
  // lists of written keys appear (given up after a while: a member that
  // died while connecting wrote none).
  struct Retired {
    int64_t era = 0, comm = 0;
    int members = 0, shards = 0;
    Time since{};
    std::set<std::pair<int, int>> done;  // (shard, member) lists read
  };
  std::vector<Retired> retired_;
  void retire_links(Time now);
  // Writes the answers `f` decided (deleting each group's previous one) and its lines.
  void write_replies(const Formation& f, std::vector<std::string>& logs);
};

struct CoordinatorOptions {
  std::string host = "127.0.0.1";  // the address it listens on
  int port = 29400;                // 0: a free port (Coordinator::port())
  bool bind_all = false;           // listen on every interface
  std::chrono::milliseconds heartbeat_timeout{10000};
  int min_groups = 1;              // groups the job's first quorum waits for
  std::string job_token;           // FSDP_JOB_TOKEN: keys under it, and the ranks must hold the same
  // Each event ("group 1 joined", "quorum 7: step 12, groups 0,2", ...).
  Log log;
};

// The coordinator process: hosts the store and runs the passes (one thread: run()).
class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions o);
  ~Coordinator();
  int port() const;
  // Serves until `stop` is set.
  void run(const std::atomic<bool>& stop);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::replicas
