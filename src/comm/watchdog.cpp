// fsdp-cpp: heartbeats, their reading after a failed collective, and the
// store a launcher hosts (see comm/watchdog.h, include/fsdp/watchdog.h).
#include "comm/watchdog.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>

#include "comm/cma.h"
#include "comm/rendezvous.h"
#include "fsdp/errors.h"
#include "fsdp/flight.h"
#include "fsdp/memory.h"

namespace fsdp {
namespace watchdog {

nlohmann::json Heartbeat::to_json() const {
  nlohmann::json j = {{"rank", rank},       {"pid", pid},       {"host", host},   {"time", time},
                      {"beat", beat},       {"interval", interval}, {"left", left}, {"usr1", dumps_on_signal},
                      {"step", step},       {"phase", phase}};
  if (seq > 0)
    j["coll"] = {{"comm", comm},       {"seq", seq},           {"kind", kind},       {"unit", unit},
                 {"peer", peer},       {"waiting", waiting},   {"recv_done", recv_done},
                 {"recv_total", recv_total}, {"started", started}, {"moved", moved}};
  return j;
}

std::optional<Heartbeat> Heartbeat::parse(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    Heartbeat h;
    h.rank = j.value("rank", -1);
    h.pid = j.value("pid", int64_t(0));
    h.host = j.value("host", "");
    h.time = j.value("time", 0.0);
    h.beat = j.value("beat", int64_t(0));
    h.interval = j.value("interval", 1.0);
    h.left = j.value("left", false);
    h.dumps_on_signal = j.value("usr1", false);
    h.step = j.value("step", int64_t(-1));
    h.phase = j.value("phase", "");
    if (j.contains("coll") && j["coll"].is_object()) {
      const auto& c = j["coll"];
      h.comm = c.value("comm", 0);
      h.seq = c.value("seq", uint64_t(0));
      h.kind = c.value("kind", "");
      h.unit = c.value("unit", "");
      h.peer = c.value("peer", -1);
      h.waiting = c.value("waiting", "");
      h.recv_done = c.value("recv_done", int64_t(0));
      h.recv_total = c.value("recv_total", int64_t(0));
      h.started = c.value("started", 0.0);
      h.moved = c.value("moved", 0.0);
    }
    return h;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

nlohmann::json Verdict::to_json() const {
  return {{"rank", rank},       {"comm", comm},     {"seq", seq},         {"what", what},
          {"kind", kind},       {"unit", unit},     {"step", step},       {"phase", phase},
          {"timed_out", timed_out}, {"silent", silent}, {"elsewhere", elsewhere}, {"slow", slow},
          {"stuck", stuck},     {"dead", dead},     {"desync", desync},   {"waited_on", waited_on},
          {"culprits", culprits}, {"summary", summary}};
}

std::optional<Verdict> Verdict::parse(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    Verdict v;
    v.rank = j.value("rank", -1);
    v.comm = j.value("comm", 0);
    v.seq = j.value("seq", uint64_t(0));
    v.what = j.value("what", "");
    v.kind = j.value("kind", "");
    v.unit = j.value("unit", "");
    v.step = j.value("step", int64_t(-1));
    v.phase = j.value("phase", "");
    v.timed_out = j.value("timed_out", false);
    auto ints = [&](const char* k) {
      std::vector<int> out;
      if (j.contains(k) && j[k].is_array())
        for (auto& x : j[k])
          if (x.is_number_integer()) out.push_back(x.get<int>());
      return out;
    };
    v.silent = ints("silent");
    v.elsewhere = ints("elsewhere");
    v.slow = ints("slow");
    v.stuck = ints("stuck");
    v.dead = ints("dead");
    v.desync = ints("desync");
    v.waited_on = ints("waited_on");
    v.culprits = ints("culprits");
    v.summary = j.value("summary", "");
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {
std::string step_phase(int64_t step, const std::string& phase, bool in_collective) {
  std::string s;
  if (step >= 0) s = detail::cat("step ", step);
  if (!phase.empty() && phase != "none") s += detail::cat(s.empty() ? "" : ", ", in_collective ? "" : "phase ", phase);
  return s;
}
}  // namespace

std::string describe_place(const Heartbeat& h) {
  if (h.seq == 0) {
    const std::string sp = step_phase(h.step, h.phase, false);
    return "no collective" + (sp.empty() ? std::string() : " (" + sp + ")");
  }
  const std::string sp = step_phase(h.step, h.phase, true);
  return detail::cat(h.kind, h.unit.empty() ? "" : " '" + h.unit + "'", " #", h.seq, sp.empty() ? "" : " (" + sp + ")");
}

std::string describe_place(const Entered& e) {
  // what: "all_gather 'blocks.1' (fp32, ...)": kind and label, then the seq.
  std::string head = e.what.substr(0, e.what.find(" ("));
  const std::string sp = step_phase(e.step, e.phase, true);
  return detail::cat(head, " #", e.seq, sp.empty() ? "" : " (" + sp + ")");
}

std::string key_base(const std::string& job_token) {
  return "fsdp/" + (job_token.empty() ? std::string() : job_token + "/");
}

}  // namespace watchdog

namespace comm {
namespace {

using watchdog::Entered;
using watchdog::Heartbeat;
using watchdog::Verdict;

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }


// /proc/<pid>/stat's state letter; 0 when the process is gone.
char proc_state(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
}

}  // namespace

std::string format_entered(uint64_t seq, const std::string& what) {
  char t[32];
  std::snprintf(t, sizeof t, "%.3f", wall_now());
  return detail::cat(seq, "|", t, "|", current_step(), "|", to_string(current_phase()), "|", what);
}

std::optional<Entered> parse_entered(const std::string& v, int comm) {
  Entered e;
  e.comm = comm;
  try {
    size_t a = v.find('|');
    if (a == std::string::npos) {  // "0": nothing entered yet
      e.seq = std::stoll(v);
      return e;
    }
    size_t b = v.find('|', a + 1), c = v.find('|', b + 1), d = v.find('|', c + 1);
    if (b == std::string::npos || c == std::string::npos || d == std::string::npos) return std::nullopt;
    e.seq = std::stoll(v.substr(0, a));
    e.time = std::stod(v.substr(a + 1, b - a - 1));
    e.step = std::stoll(v.substr(b + 1, c - b - 1));
    e.phase = v.substr(c + 1, d - c - 1);
    e.what = v.substr(d + 1);
    return e;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// ---------------------------------------------------------------------------
// The heartbeat thread.

struct Watchdog::State {
  WorldEnv world;
  std::string base;
  double interval = 1;
  std::chrono::milliseconds connect_timeout{2000};

  std::mutex mu;
  std::condition_variable cv;
  struct Request {
    std::vector<std::string> keys;
    std::vector<std::pair<std::string, std::string>> writes;
    bool done = false, ok = false;
    std::vector<std::optional<std::string>> values;
  };
  std::deque<std::shared_ptr<Request>> requests;  // guarded by mu
  bool stop = false;                              // guarded by mu
  bool finished = false;                          // guarded by mu: the thread returned
  std::atomic<bool> failed{false};
  int64_t beats = 0;
  std::string identity;  // host_identity(), set by acquire
  std::vector<std::optional<Watchdog::Where>> where;  // guarded by mu
  bool where_done = false;                            // the thread's own
  int where_tries = 0;

  // When the store last answered a round trip of this thread (steady
  // clock, ns; 0 before the first): a diagnosis does not wait long for a
  // store that has been silent for a while (Watchdog::store_silent_for).
  std::atomic<int64_t> answered_ns{0};
  void answered() {
    answered_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
  }

  // The thread's own; freed with the State, or when a call on it threw.
  c10::intrusive_ptr<c10d::TCPStore> store;

  bool connect() {
    if (store) return true;
    try {
      store = connect_store_client(world, connect_timeout);
      answered();
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
  // A store call that threw leaves its connection out of step: drop it
  // (a client's destructor only closes its socket; it waits for nobody).
  void broken() { store.reset(); }

  Heartbeat beat(bool left) {
    Heartbeat h;
    h.rank = world.rank;
    h.pid = getpid();
    h.host = host_name();
    h.time = wall_now();
    h.beat = ++beats;
    h.interval = interval;
    h.left = left;
    h.dumps_on_signal = flight::dumps_on_signal();
    h.step = current_step();
    h.phase = failed ? std::string("failed") : std::string(to_string(current_phase()));
    flight::Record r;
    if (!left && flight::in_flight(&r)) {
      h.comm = r.comm;
      h.seq = r.seq;
      h.kind = r.kind;
      h.unit = r.unit;
      h.peer = r.peer;
      h.waiting = r.waiting;
      h.recv_done = r.recv_done;
      h.recv_total = r.recv_total;
      h.started = r.started;
      h.moved = r.moved;
    }
    return h;
  }

  void publish(bool left) {
    if (!connect()) return;
    try {
      const std::string key = base + "hb/" + std::to_string(world.rank);
      store->set(key, bytes(beat(left).to_json().dump()));
      // A set is one-way; a check waits for the store's reply: the store
      // is known to be alive as of now.
      if (!left && store->check({key})) answered();
    } catch (const std::exception&) {
      broken();
    }
  }

  void serve(Request& q) {
    q.values.assign(q.keys.size(), std::nullopt);
    if (!connect()) return;
    try {
      for (auto& [k, v] : q.writes) store->set(k, bytes(v));
      for (size_t i = 0; i < q.keys.size(); ++i) {
        // check() first: get() of an absent key would wait for it.
        if (!store->check({q.keys[i]})) continue;
        auto b = store->get(q.keys[i]);
        q.values[i] = std::string(b.begin(), b.end());
      }
      q.ok = true;
      answered();
    } catch (const std::exception&) {
      broken();
    }
  }

  // Once after start: every rank's host and pid ("where/<q>").
  void learn_where() {
    if (where_done || !connect()) return;
    try {
      if (where_tries++ == 0)
        store->set(base + "where/" + std::to_string(world.rank),
                   bytes(nlohmann::json{{"host", host_name()}, {"identity", identity}, {"pid", int64_t(getpid())}}.dump()));
      std::vector<std::optional<Watchdog::Where>> got(world.world_size);
      bool all = true;
      for (int q = 0; q < world.world_size; ++q) {
        const std::string k = base + "where/" + std::to_string(q);
        if (!store->check({k})) {
          all = false;
          continue;
        }
        auto b = store->get(k);
        auto j = nlohmann::json::parse(std::string(b.begin(), b.end()), nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;
        got[q] = Watchdog::Where{j.value("host", ""), j.value("identity", ""), j.value("pid", int64_t(0))};
      }
      std::lock_guard<std::mutex> lock(mu);
      where = got;
      where_done = all || where_tries > 60;
    } catch (const std::exception&) {
      broken();
    }
  }

  void loop() {
    auto next = std::chrono::steady_clock::now();
    for (;;) {
      std::deque<std::shared_ptr<Request>> todo;
      bool stopping;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_until(lock, next, [&] { return stop || !requests.empty(); });
        todo.swap(requests);
        stopping = stop;
      }
      for (auto& q : todo) {
        serve(*q);
        {
          std::lock_guard<std::mutex> lock(mu);
          q->done = true;
        }
        cv.notify_all();
      }
      if (stopping) {
        if (!failed) publish(/*left=*/true);
        break;
      }
      if (std::chrono::steady_clock::now() >= next) {
        publish(false);
        learn_where();
        next += std::chrono::microseconds(int64_t(interval * 1e6));
        const auto now = std::chrono::steady_clock::now();
        if (next < now) next = now;  // the thread was held up: no burst
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
    cv.notify_all();
  }
};

namespace {
std::mutex g_mu;
std::weak_ptr<Watchdog> g_dog;  // guarded by g_mu
}  // namespace

std::shared_ptr<Watchdog> Watchdog::acquire(const WorldEnv& world, const std::string& base,
                                            const ResolvedOptions& opts) {
  std::lock_guard<std::mutex> g(g_mu);
  if (auto d = g_dog.lock()) return d;
  auto s = std::make_shared<State>();
  s->world = world;
  s->base = base;
  s->identity = host_identity(opts.host_id);
  const double iv = opts.heartbeat_interval.count() / 1000.0;
  s->interval = iv;
  flight::set_identity(world.rank, world.world_size);
  auto d = std::shared_ptr<Watchdog>(new Watchdog(s));
  d->thread_ = std::thread([s] { s->loop(); });  // joined (bounded) by ~Watchdog
  g_dog = d;
  return d;
}

Watchdog::Watchdog(std::shared_ptr<State> s) : s_(std::move(s)) {}

Watchdog::~Watchdog() {
  bool finished;
  {
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->stop = true;
    s_->cv.notify_all();
    // The thread's last heartbeat ("left") is one store round trip, bounded
    // by the client's timeout (connect_timeout) even when the store stopped
    // answering.
    finished = s_->cv.wait_for(lock, s_->connect_timeout + std::chrono::seconds(1), [&] { return s_->finished; });
  }
  if (!thread_.joinable()) return;
  if (finished) {
    thread_.join();  // frees the store client with the State, on this thread
  } else {
    // Still inside a store call past its own timeout: left behind, owning
    // its State (and the client), rather than block the owner's exit.
    thread_.detach();
  }
}

double Watchdog::interval() const { return s_->interval; }
double Watchdog::silent_after() const { return 3 * s_->interval; }
double Watchdog::store_silent_for() const {
  const int64_t at = s_->answered_ns;
  if (at == 0) return 0;
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return std::max(0.0, (now - at) / 1e9);
}
const std::string& Watchdog::base() const { return s_->base; }
void Watchdog::mark_failed() { s_->failed = true; }

std::vector<std::optional<Watchdog::Where>> Watchdog::where() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->where;
}
const std::string& Watchdog::identity() const { return s_->identity; }

std::optional<std::vector<std::optional<std::string>>> Watchdog::read(const std::vector<std::string>& keys,
                                                                     std::chrono::milliseconds budget) {
  auto q = std::make_shared<State::Request>();
  q->keys = keys;
  std::unique_lock<std::mutex> lock(s_->mu);
  if (s_->finished) return std::nullopt;
  s_->requests.push_back(q);
  s_->cv.notify_all();
  if (!s_->cv.wait_for(lock, budget, [&] { return q->done; }) || !q->ok) return std::nullopt;
  return q->values;
}

bool Watchdog::write(const std::string& key, const std::string& value, std::chrono::milliseconds budget) {
  auto q = std::make_shared<State::Request>();
  q->writes.push_back({key, value});
  std::unique_lock<std::mutex> lock(s_->mu);
  if (s_->finished) return false;
  s_->requests.push_back(q);
  s_->cv.notify_all();
  return s_->cv.wait_for(lock, budget, [&] { return q->done; }) && q->ok;
}

// ---------------------------------------------------------------------------
// Reading a failed collective.

namespace {

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += detail::cat(i ? (i + 1 == v.size() ? " and " : ", ") : "", v[i]);
  return s;
}

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

std::string bytes_of(int64_t done, int64_t total) {
  return detail::cat(memory::format_bytes(done), " of ", memory::format_bytes(total));
}

}  // namespace

Classified classify(int self, int world, int comm, uint64_t seq, const std::string& what, const std::string& kind,
                    const std::string& unit, const std::vector<std::optional<Heartbeat>>& beats,
                    const std::vector<std::optional<Entered>>& entered, bool store_reachable, double now,
                    double silent_after, const std::vector<std::optional<Watchdog::Where>>& where,
                    const std::string& my_identity, const std::vector<bool>& gone) {
  Classified c;
  Verdict& v = c.verdict;
  v.rank = self;
  v.comm = comm;
  v.seq = seq;
  v.what = what;
  v.kind = kind;
  v.unit = unit;
  v.step = current_step();
  v.phase = to_string(current_phase());
  const std::string here = detail::cat(kind, unit.empty() ? "" : " '" + unit + "'", " #", seq);
  if (!store_reachable) {
    // No heartbeats: what this rank knows without the store. Ranks of this
    // host by their /proc; ranks of other hosts are cut off from it, as the
    // store is.
    c.lines = "\nHeartbeats: unreadable: the rendezvous store did not answer (its host is frozen, gone or cut off "
              "from this one).";
    std::string ranks, other_hosts;
    std::vector<int> far;
    for (int q = 0; q < world; ++q) {
      if (q == self) continue;
      const auto w = q < static_cast<int>(where.size()) ? where[q] : std::nullopt;
      std::string line;
      if (!w) {
        line = detail::cat("rank ", q, ": unknown (where it runs was never read)");
      } else if (w->identity == my_identity) {
        const char st = proc_state(w->pid);
        if (st == 0) {
          v.silent.push_back(q);
          line = detail::cat("rank ", q, ": SILENT, its process (pid ", w->pid, ") is gone");
        } else if (st == 'T' || st == 't') {
          v.silent.push_back(q);
          line = detail::cat("rank ", q, ": SILENT, its process (pid ", w->pid, ") is stopped");
        } else {
          line = detail::cat("rank ", q, ": alive on this host (pid ", w->pid, ")");
        }
      } else {
        v.silent.push_back(q);
        far.push_back(q);
        if (other_hosts.find("'" + w->host + "'") == std::string::npos)
          other_hosts += detail::cat(other_hosts.empty() ? "" : ", ", "'", w->host, "'");
        line = detail::cat("rank ", q, ": SILENT, on another host ('", w->host,
                           "'), unreachable like the store: no bytes and no heartbeat arrive from there");
      }
      ranks += (ranks.empty() ? "\nRanks: " : "\n       ") + line;
    }
    c.lines += ranks;
    if (!v.silent.empty()) {
      v.culprits = v.silent;
      v.summary = far.empty() ? detail::cat("rank", v.silent.size() == 1 ? " " : "s ", join(v.silent),
                                            v.silent.size() == 1 ? " is" : " are", " silent (stopped or gone, on this host)")
                              : detail::cat("rank", far.size() == 1 ? " " : "s ", join(far), " on ", other_hosts,
                                            far.size() == 1 ? " is" : " are",
                                            " silent: cut off from this host (the network between the hosts is down "
                                            "or those hosts are gone)");
      if (!far.empty() && far.size() < v.silent.size())
        v.summary += detail::cat("; also silent on this host: ", join(v.silent));
      c.lines += "\nCause: " + v.summary + ".";
    } else {
      v.summary = "the store did not answer";
    }
    return c;
  }
  std::string ranks, cause_silent, cause_elsewhere, cause_slow;
  std::vector<int> failed_too;
  for (int q = 0; q < world; ++q) {
    if (q == self) continue;
    const auto& h = beats[q];
    const auto& e = entered[q];
    const std::string last = e && e->seq > 0 ? "last entered " + watchdog::describe_place(*e)
                                             : std::string("entered no collective yet");
    std::string line;
    if (q < static_cast<int>(gone.size()) && gone[q]) {
      v.silent.push_back(q);
      v.dead.push_back(q);
      line = detail::cat("rank ", q, ": DEAD, its process is gone; ", last);
      cause_silent += detail::cat("\nCause: rank ", q, " is dead: its process is gone (killed, or crashed); it ", last,
                                  ".");
    } else if (!h) {
      v.silent.push_back(q);
      line = detail::cat("rank ", q, ": SILENT, no heartbeat at all; ", last);
      cause_silent += detail::cat("\nCause: rank ", q, " is silent: it never published a heartbeat; ", last, ".");
    } else if (h->left) {
      line = detail::cat("rank ", q, ": finished (closed its communicators cleanly)");
      v.elsewhere.push_back(q);
      cause_elsewhere += detail::cat("\nCause: rank ", q, " is elsewhere: it finished and closed its communicators ",
                                     "while this rank waits in ", here, ".");
    } else if (h->age(now) > silent_after) {
      v.silent.push_back(q);
      line = detail::cat("rank ", q, ": SILENT, no heartbeat for ", secs(h->age(now)), "; ", last);
      cause_silent += detail::cat("\nCause: rank ", q, " is silent: no heartbeat for ", secs(h->age(now)),
                                  " (frozen, dead or cut off); it ", last, ".");
    } else if (h->phase == "failed") {
      failed_too.push_back(q);
      line = detail::cat("rank ", q, ": failed too (its own collective error), ", last);
    } else {
      const bool entered_here = e && e->seq == static_cast<int64_t>(seq);
      // The collective entered after the last heartbeat is the newer news.
      const bool entry_newer = e && e->seq > 0 && e->time >= h->time;
      const bool same = (h->seq == seq && h->comm == comm) || (entered_here && e->what == what && (entry_newer || h->seq == 0));
      if (same) {
        const double still = h->seq == seq ? (h->moved > 0 ? now - h->moved : h->started > 0 ? now - h->started : 1e9)
                                           : now - e->time;
        std::string peer = h->seq == seq && h->peer >= 0 ? detail::cat(", waiting on rank ", h->peer) : std::string();
        if (h->seq == seq && still <= silent_after && h->moved > 0) {
          v.slow.push_back(q);
          line = detail::cat("rank ", q, ": slow, alive in this collective and still moving bytes (",
                             bytes_of(h->recv_done, h->recv_total), " arrived", peer, ")");
          cause_slow += detail::cat("\nCause: rank ", q, " is slow: alive in ", here, " and still moving bytes (",
                                    bytes_of(h->recv_done, h->recv_total),
                                    " arrived); the network or that host is slower than FSDP_TIMEOUT allows.");
        } else {
          v.stuck.push_back(q);
          line = detail::cat("rank ", q, ": stuck, alive in this collective, no bytes moved for ",
                             still > 1e8 ? std::string("all of it") : secs(still), peer,
                             h->seq == seq ? detail::cat(" (", bytes_of(h->recv_done, h->recv_total), " arrived)")
                                           : std::string());
        }
      } else {
        v.elsewhere.push_back(q);
        // Where it is: the collective it entered when that is newer than
        // its heartbeat, else what the heartbeat says.
        std::string there, why, kind_of;
        if (entered_here && e->what != what) {
          v.desync.push_back(q);
          there = entry_newer ? std::string() : "in " + watchdog::describe_place(*h);
          why = detail::cat(there.empty() ? "" : "; ", "it entered #", seq, " as ", e->what, ", a different collective");
          kind_of = " (a desync: the ranks issue different collectives)";
        } else if (h->seq == seq && h->comm == comm) {
          v.desync.push_back(q);
          there = "in " + watchdog::describe_place(*h);
          kind_of = " (a desync: the ranks issue different collectives)";
        } else if (e && e->seq > static_cast<int64_t>(seq)) {
          there = "in " + watchdog::describe_place(*h);
          why = detail::cat("; it is ahead of this rank (", last, ")");
          kind_of = " (this rank fell behind: it missed bytes or a collective)";
        } else {
          there = "in " + watchdog::describe_place(*h);
          if (e && e->seq >= 0 && e->seq < static_cast<int64_t>(seq))
            why = detail::cat("; it has not entered #", seq, " (", last, ")");
          kind_of = h->seq == 0 ? " (a rank stuck outside collectives: data loading, a checkpoint write, a loop of "
                                  "the program's own)"
                                : " (a rank in another collective: a desync, or another communicator)";
          if (h->seq != 0 && h->comm == comm) v.desync.push_back(q);
        }
        const std::string alive = there.empty() ? "alive; " : "alive ";
        line = detail::cat("rank ", q, ": ELSEWHERE, ", alive, there, why);
        cause_elsewhere += detail::cat("\nCause: rank ", q, " is elsewhere: ", alive, there, why,
                                       ", while this rank waits in ", here, kind_of, ".");
      }
    }
    ranks += (ranks.empty() ? "\nRanks: " : "\n       ") + line;
  }
  (void)failed_too;
  c.lines = ranks;
  if (!v.silent.empty()) {
    v.culprits = v.silent;
    c.lines += cause_silent;
  } else if (!v.elsewhere.empty()) {
    v.culprits = v.elsewhere;
    c.lines += cause_elsewhere;
  } else if (!v.slow.empty()) {
    v.culprits = v.slow;
    c.lines += cause_slow;
  }
  if (!v.culprits.empty()) {
    const size_t at = c.lines.find("\nCause: ");
    v.summary = c.lines.substr(at + 8, c.lines.find('\n', at + 1) == std::string::npos
                                           ? std::string::npos
                                           : c.lines.find('\n', at + 1) - at - 8);
  }
  return c;
}

}  // namespace comm

// ---------------------------------------------------------------------------
// The store a launcher hosts.
namespace watchdog {

// The launcher reads through a client of its own, each read on a thread of
// its own and waited for at most 2 s: libtorch's store daemon reads each
// request whole with blocking reads (no timeout on the server's sockets),
// so a client cut off halfway through a request (a cut link) blocks it for
// good; and the client's own socket timeout is only set by a wait(). Once a
// read has timed out, none is tried again, and the daemon is left running
// at exit (stopping it would join a thread that never returns).
constexpr std::chrono::milliseconds kHostReadTimeout{2000};

struct StoreHost::Impl {
  c10d::TCPStore* store = nullptr;   // the server
  c10d::TCPStore* reader = nullptr;  // the launcher's client; leaked once stuck
  std::string addr;
  int port = 0;
  bool stuck = false;  // a read timed out: the daemon does not answer

  struct Read {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::optional<std::string> value;
  };
  // `key`'s value (nullopt: absent, or no answer within the timeout).
  std::optional<std::string> read(const std::string& key) {
    if (stuck) return std::nullopt;
    auto r = std::make_shared<Read>();
    c10d::TCPStore** client = &reader;
    const std::string a = addr;
    const int p = port;
    std::thread([r, client, a, p, key] {
      std::optional<std::string> v;
      try {
        if (!*client) {
          c10d::TCPStoreOptions o;
          o.port = static_cast<uint16_t>(p);
          o.isServer = false;
          o.waitWorkers = false;
          o.timeout = kHostReadTimeout;
          *client = new c10d::TCPStore(a, o);
        }
        if ((*client)->check({key})) {
          auto b = (*client)->get(key);
          v = std::string(b.begin(), b.end());
        }
      } catch (const std::exception&) {
      }
      std::lock_guard<std::mutex> lock(r->mu);
      r->value = std::move(v);
      r->done = true;
      r->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(r->mu);
    if (!r->cv.wait_for(lock, kHostReadTimeout, [&] { return r->done; })) {
      stuck = true;  // the thread, the client and `*this` (leaked below) stay
      return std::nullopt;
    }
    return r->value;
  }
};

StoreHost::StoreHost(const std::string& addr, int port, std::chrono::milliseconds timeout, bool bind_all)
    : impl_(std::make_unique<Impl>()) {
  impl_->store = comm::host_store(addr, port, timeout, bind_all);
  impl_->addr = addr;
  impl_->port = port;
}

StoreHost::~StoreHost() {
  // A daemon that no longer answers cannot be stopped: leave it (and what a
  // stuck read thread still uses) to the process's exit.
  if (!impl_->stuck) impl_->read("fsdp/store-host-probe");
  if (impl_->stuck) {
    impl_.release();
    return;
  }
  delete impl_->reader;
  comm::close_hosted_store(impl_->store);
}

int StoreHost::port() const { return impl_->port; }
bool StoreHost::answering() const { return !impl_->stuck; }

std::optional<std::string> StoreHost::get(const std::string& key) { return impl_->read(key); }

std::optional<Heartbeat> StoreHost::heartbeat(const std::string& base, int rank) {
  auto v = get(base + "hb/" + std::to_string(rank));
  return v ? Heartbeat::parse(*v) : std::nullopt;
}

std::optional<Entered> StoreHost::entered(const std::string& base, int rank) {
  std::optional<Entered> best;
  for (int g = 0; g < 16; ++g) {
    auto v = get(detail::cat(base, "c", g, "/seq/", rank));
    if (!v) {
      if (!get(detail::cat(base, "c", g, "/world_size"))) break;  // no such communicator
      continue;
    }
    auto e = comm::parse_entered(*v, g);
    if (e && e->seq > 0 && (!best || e->time > best->time)) best = e;
  }
  return best;
}

std::optional<Verdict> StoreHost::verdict(const std::string& base, int rank) {
  auto v = get(base + "verdict/" + std::to_string(rank));
  return v ? Verdict::parse(*v) : std::nullopt;
}

}  // namespace watchdog
}  // namespace fsdp
