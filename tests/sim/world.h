// fsdp-cpp simulator: the simulated world of replica groups — processes that
// can be killed, frozen and thawed, a store that dies with its coordinator,
// connections that delay and duplicate, collectives that fail when a peer
// dies and time out when one freezes. tests/sim/replica_sim.cpp runs the
// real rules, the real coordinator I/O and the real rank-side protocol in it.
// defines: sim::Proc, sim::Gate, sim::Store, sim::Conn, sim::Crash, sim::World
#pragma once

#include <coroutine>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "task.h"

namespace sim {

constexpr int64_t kMs = 1000;  // simulated time is in microseconds

// A process failed (an exception inside its coroutines ends it).
struct Crash {
  std::string why;
};

// A simulated process: its coroutines run only while it is alive and not
// frozen; events for a frozen one wait for its thaw.
struct Proc {
  std::string name;
  bool alive = false;
  bool frozen = false;
  uint64_t life = 0;  // bumped at every death: events of an earlier life are dropped
  std::vector<std::function<void()>> held;
  std::vector<Task<void>> tasks;
  std::vector<std::string> links;  // meetings (by key prefix) its death breaks: its connected links
  std::function<void(bool ok, const std::string& why)> on_exit;  // its launcher's
};

// A waiter's slot: opened once, with a result; resumes the waiting coroutine.
struct Gate {
  std::coroutine_handle<> h;
  Proc* proc = nullptr;
  uint64_t life = 0;
  bool open = false;
  bool ok = false;
  std::string why;
  std::vector<std::optional<std::string>> values;  // a store call's reads
  int64_t number = 0;                              // a store call's add, a meeting's sum
};

// The coordinator's store: it lives and dies with the coordinator process.
struct Store {
  uint64_t gen = 0;  // one per coordinator process
  bool alive = false;
  bool frozen = false;  // its process is stopped: calls wait, and time out
  std::map<std::string, std::string> kv;
};

// One client connection to the store: requests arrive in order.
struct Conn {
  uint64_t gen = 0;  // the store it is connected to (0: none)
  int64_t last_arrival = 0;
};

// One store call: writes, an add, reads, in that order (as StoreClient's).
struct Op {
  std::vector<std::pair<std::string, std::string>> sets;
  std::optional<std::pair<std::string, int64_t>> add;
  std::vector<std::string> gets;
};

class World {
 public:
  explicit World(uint64_t seed) : rng(seed) {}

  Scheduler sched;
  std::mt19937_64 rng;
  Store store;
  std::deque<std::string> trace;  // the last events, printed with a failure
  bool verbose = false;
  std::function<void()> on_bell;  // the store's bell was set

  // Network delays (microseconds): most calls take base, a few spike.
  int64_t net_base = 100;
  double net_spike = 0.01;
  double dup_chance = 0.01;
  // Connections opened before `slow_connect_until` take up to
  // `slow_connect_max` more (a restarted coordinator on a loaded host: its
  // port answers late, and every client reconnects at once).
  int64_t slow_connect_until = 0, slow_connect_max = 0;

  int64_t now() const { return sched.now(); }
  int64_t range(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  void note(const std::string& line);

  // Runs `fn` at `at` for `p`'s current life (held while it is frozen).
  void at(Proc& p, int64_t at, std::function<void()> fn);
  void resume_at(Proc& p, std::coroutine_handle<> h, int64_t t) {
    at(p, t, [h] { h.resume(); });
  }
  // Opens `g` (once) and resumes its waiter at `t`.
  void open(const std::shared_ptr<Gate>& g, bool ok, const std::string& why, int64_t t);

  // Starts `p` with its coroutines (made by `make`).
  void start(Proc& p, std::vector<Task<void>> tasks);
  // Kills `p` now: its coroutines are destroyed, its waits dropped, its
  // links broken, its launcher told (once).
  void kill(Proc& p, const std::string& why);
  // `p` ends by itself (its main coroutine returned, or threw): as kill, from
  // inside one of its coroutines (they are destroyed after it suspends).
  void exit(Proc& p, bool ok, const std::string& why);
  void freeze(Proc& p);
  void thaw(Proc& p);

  // Awaitables.
  struct Sleep {
    World& w;
    Proc& p;
    int64_t until;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) { w.resume_at(p, h, until); }
    void await_resume() const noexcept {}
  };
  Sleep sleep(Proc& p, int64_t d) { return Sleep{*this, p, now() + d}; }
  // Waits for a gate. Await a named Wait, never a temporary: GCC 12 may
  // destroy a co_await operand's temporaries twice (its shared_ptr with them).
  struct Wait {
    Gate* g;
    bool await_ready() const noexcept { return g->open; }
    void await_suspend(std::coroutine_handle<> h) { g->h = h; }
    void await_resume() const noexcept {}
  };
  std::shared_ptr<Gate> gate(Proc& p) {
    auto g = std::make_shared<Gate>();
    g->proc = &p;
    g->life = p.life;
    return g;
  }

  // A store call over `c` (from `p`): what it read and added, or nullopt
  // when the store is gone or did not answer within `budget` (the
  // connection is then dropped, and the next call connects again).
  struct Result {
    std::vector<std::optional<std::string>> values;
    int64_t added = 0;
  };
  Task<std::optional<Result>> call(Proc& p, Conn& c, Op op, int64_t budget);

  // A meeting: every one of `expected` participants arrives with a number;
  // it completes `duration` after the last arrival with the sum, unless a
  // participant died (fails everyone at once) or a waiter's `timeout`
  // passed first (fails everyone). `peers`: the processes whose death
  // breaks it even before they arrive (a link's connected peers).
  Task<std::pair<bool, int64_t>> meet(Proc& p, const std::string& key, int expected, int64_t value, int64_t timeout,
                                      int64_t duration, std::string* why);
  // Breaks every meeting whose key starts with `prefix` (and any later
  // arrival at one): a link whose peer died.
  void break_meetings(const std::string& prefix, const std::string& why);

 private:
  struct Meeting {
    int expected = 0;
    std::vector<std::pair<Proc*, std::shared_ptr<Gate>>> arrived;
    int64_t sum = 0;
    bool done = false;
    bool broken = false;
    std::string why;
    int64_t duration = 0;
  };
  void exec(uint64_t gen, Op op, std::shared_ptr<Gate> g, int64_t deadline, int64_t reply_delay);
  void try_complete(const std::string& key);
  // `p` is gone: every meeting it arrived at fails, and so do its links'.
  void leave_meetings(Proc& p, const std::string& why);
  void fail_meeting(Meeting& m, const std::string& why, int64_t t);
  int64_t delay() { return chance(net_spike) ? range(5 * kMs, 40 * kMs) : range(net_base / 2, net_base * 2); }

  std::map<std::string, Meeting> meetings_;
  std::vector<std::string> broken_prefixes_;
};

}  // namespace sim
