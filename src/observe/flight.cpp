// fsdp-cpp: phases and the flight recorder (see include/fsdp/flight.h).
//
// One ring of slots behind one mutex: enqueue (the caller's thread), start
// and finish (the communication thread) each hold it for a few stores. The
// live byte counters of a running collective live outside the lock
// (Progress, atomics), shared between the slot and the transfer. Everything
// a detached thread may touch at exit is immortal (never destroyed).
#include "fsdp/flight.h"
#include "observe/flight_hooks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <atomic>
#include <mutex>
#include <thread>

#include "fsdp/config.h"
#include "common/env.h"
#include "fsdp/errors.h"

namespace fsdp {
namespace {

std::atomic<int> g_phase{0};
std::atomic<int64_t> g_step{-1};

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Wall seconds of a steady_clock instant (ns), through the current offset.
double wall_of(int64_t ns) {
  if (ns == 0) return 0;
  const double now_wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return now_wall - double(steady_ns() - ns) * 1e-9;
}

}  // namespace

const char* to_string(Phase p) {
  switch (p) {
    case Phase::NONE: return "none";
    case Phase::DATA: return "data";
    case Phase::FORWARD: return "forward";
    case Phase::BACKWARD: return "backward";
    case Phase::OPTIMIZER: return "optimizer";
    case Phase::CHECKPOINT: return "checkpoint";
    case Phase::EVALUATION: return "evaluation";
  }
  return "none";
}

void set_phase(Phase p) { g_phase.store(static_cast<int>(p), std::memory_order_relaxed); }
Phase current_phase() { return static_cast<Phase>(g_phase.load(std::memory_order_relaxed)); }
void set_step(int64_t step) { g_step.store(step, std::memory_order_relaxed); }
int64_t current_step() { return g_step.load(std::memory_order_relaxed); }

namespace flight {
namespace {

struct Slot {
  uint64_t ticket = 0;  // 0: empty
  int comm = 0;
  uint64_t seq = 0;
  const char* kind = "";
  std::string unit;
  const char* dtype = "";
  int64_t numel = 0, bytes = 0;
  int64_t enqueued = 0, started = 0, ended = 0;  // steady ns
  int64_t step = -1;
  int phase = 0;
  bool failed = false;
  std::string error;
  std::shared_ptr<Progress> live;  // while running
  // Final counters once ended.
  int peer = -1, waiting = 0;
  int64_t recv_done = 0, recv_total = 0, sent_done = 0, send_total = 0, moved = 0;
};

struct Recorder {
  std::mutex mu;
  std::vector<Slot> slots;
  uint64_t next = 1;  // the next ticket
  std::map<std::string, nlohmann::json> notes;
  int rank = -1, world = 0;
  std::string default_dir;
  std::string dir_override;  // FSDP_FLIGHT_DIR
  bool on = true;
};

Recorder& rec() {
  // Immortal: the heartbeat and signal threads may record or dump while the
  // process exits. Sized by configure() (fsdp::init, the environment).
  static Recorder* r = [] {
    auto* x = new Recorder();
    x->slots.resize(static_cast<size_t>(RecorderOptions{}.entries));
    return x;
  }();
  return *r;
}

Record to_record(const Slot& s) {
  Record r;
  r.comm = s.comm;
  r.seq = s.seq;
  r.kind = s.kind;
  r.unit = s.unit;
  r.dtype = s.dtype;
  r.numel = s.numel;
  r.bytes = s.bytes;
  r.state = s.ended ? (s.failed ? "failed" : "done") : s.started ? "running" : "queued";
  r.enqueued = wall_of(s.enqueued);
  r.started = wall_of(s.started);
  r.ended = wall_of(s.ended);
  r.step = s.step;
  r.phase = to_string(static_cast<Phase>(s.phase));
  r.error = s.error;
  if (s.live) {
    const Progress& p = *s.live;
    r.peer = p.peer.load(std::memory_order_relaxed);
    r.waiting = to_string(static_cast<Progress::Waiting>(p.waiting.load(std::memory_order_relaxed)));
    r.recv_done = p.recv_done.load(std::memory_order_relaxed);
    r.recv_total = p.recv_total.load(std::memory_order_relaxed);
    r.sent_done = p.sent_done.load(std::memory_order_relaxed);
    r.send_total = p.send_total.load(std::memory_order_relaxed);
    r.moved = wall_of(p.moved_ns.load(std::memory_order_relaxed));
  } else {
    r.peer = s.peer;
    r.waiting = to_string(static_cast<Progress::Waiting>(s.waiting));
    r.recv_done = s.recv_done;
    r.recv_total = s.recv_total;
    r.sent_done = s.sent_done;
    r.send_total = s.send_total;
    r.moved = wall_of(s.moved);
  }
  return r;
}

std::string host_name() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

}  // namespace

void Progress::arrived(int64_t n) {
  recv_done.fetch_add(n, std::memory_order_relaxed);
  moved_ns.store(steady_ns(), std::memory_order_relaxed);
}
void Progress::sent(int64_t n) {
  sent_done.fetch_add(n, std::memory_order_relaxed);
  moved_ns.store(steady_ns(), std::memory_order_relaxed);
}

const char* to_string(Progress::Waiting w) {
  switch (w) {
    case Progress::RECEIVE: return "receive";
    case Progress::SEND: return "send";
    case Progress::READ: return "read";
    default: return "";
  }
}

nlohmann::json Record::to_json() const {
  auto t = [](double x) { return x > 0 ? nlohmann::json(x) : nlohmann::json(nullptr); };
  return {{"comm", comm},           {"seq", seq},           {"kind", kind},
          {"unit", unit},           {"dtype", dtype},       {"numel", numel},
          {"bytes", bytes},         {"state", state},       {"enqueued", t(enqueued)},
          {"started", t(started)},  {"ended", t(ended)},    {"step", step},
          {"phase", phase},         {"peer", peer},         {"waiting", waiting},
          {"recv_done", recv_done}, {"recv_total", recv_total}, {"sent_done", sent_done},
          {"send_total", send_total}, {"moved", t(moved)},  {"error", error}};
}

bool enabled() { return rec().on; }
int capacity() { return static_cast<int>(rec().slots.size()); }

uint64_t enqueue(int comm, const char* kind, const std::string& unit, const char* dtype, int64_t numel,
                 int64_t bytes) {
  Recorder& r = rec();
  if (!r.on) return 0;
  const int64_t now = steady_ns();
  const int64_t step = current_step();
  const int phase = g_phase.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(r.mu);
  const uint64_t t = r.next++;
  Slot& s = r.slots[t % r.slots.size()];
  s.ticket = t;
  s.comm = comm;
  s.seq = 0;
  s.kind = kind;
  s.unit = unit;
  s.dtype = dtype;
  s.numel = numel;
  s.bytes = bytes;
  s.enqueued = now;
  s.started = s.ended = 0;
  s.step = step;
  s.phase = phase;
  s.failed = false;
  s.error.clear();
  s.live.reset();
  s.peer = -1;
  s.waiting = 0;
  s.recv_done = s.recv_total = s.sent_done = s.send_total = s.moved = 0;
  return t;
}

std::shared_ptr<Progress> start(uint64_t ticket, uint64_t seq) {
  auto p = std::make_shared<Progress>();
  if (ticket == 0) return p;
  Recorder& r = rec();
  const int64_t now = steady_ns();
  std::lock_guard<std::mutex> g(r.mu);
  Slot& s = r.slots[ticket % r.slots.size()];
  if (s.ticket != ticket) return p;
  s.seq = seq;
  s.started = now;
  s.live = p;
  return p;
}

void finish(uint64_t ticket, const std::string& error) {
  if (ticket == 0) return;
  Recorder& r = rec();
  const int64_t now = steady_ns();
  std::lock_guard<std::mutex> g(r.mu);
  Slot& s = r.slots[ticket % r.slots.size()];
  if (s.ticket != ticket) return;
  s.ended = now;
  if (!s.started) s.started = now;
  s.failed = !error.empty();
  s.error = error;
  if (s.live) {
    const Progress& p = *s.live;
    s.peer = p.peer.load(std::memory_order_relaxed);
    s.waiting = s.failed ? p.waiting.load(std::memory_order_relaxed) : 0;
    s.recv_done = p.recv_done.load(std::memory_order_relaxed);
    s.recv_total = p.recv_total.load(std::memory_order_relaxed);
    s.sent_done = p.sent_done.load(std::memory_order_relaxed);
    s.send_total = p.send_total.load(std::memory_order_relaxed);
    s.moved = p.moved_ns.load(std::memory_order_relaxed);
    s.live.reset();
  }
}

std::vector<Record> snapshot() {
  Recorder& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<Record> out;
  const uint64_t n = r.slots.size();
  const uint64_t first = r.next > n ? r.next - n : 1;
  for (uint64_t t = first; t < r.next; ++t) {
    const Slot& s = r.slots[t % n];
    if (s.ticket == t) out.push_back(to_record(s));
  }
  return out;
}

bool in_flight(Record* out) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  const uint64_t n = r.slots.size();
  const uint64_t first = r.next > n ? r.next - n : 1;
  for (uint64_t t = first; t < r.next; ++t) {
    const Slot& s = r.slots[t % n];
    if (s.ticket == t && s.started && !s.ended) {
      if (out) *out = to_record(s);
      return true;
    }
  }
  return false;
}

void note(const std::string& key, nlohmann::json value) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  r.notes[key] = std::move(value);
}

void set_identity(int rank, int world) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  if (r.rank < 0) r.rank = rank, r.world = world;
}

void set_default_dir(const std::string& d) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  r.default_dir = d;
}

std::string dir() {
  Recorder& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.dir_override.empty()) return r.dir_override;
  return r.default_dir.empty() ? "fsdp-flight" : r.default_dir;
}

void configure(const RecorderOptions& o) {
  FSDP_USER_CHECK(o.entries >= config::kMinFlightEntries && o.entries <= config::kMaxFlightEntries,
                  "flight::RecorderOptions::entries must be in [", config::kMinFlightEntries, ", ",
                  config::kMaxFlightEntries, "], found ", o.entries);
  Recorder& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  r.on = o.enabled;
  // The ring is fixed once something is recorded (tickets index it).
  if (r.next == 1) r.slots.assign(static_cast<size_t>(o.entries), Slot{});
}

void apply_env(const config::EnvConfig& env) {
  Recorder& r = rec();
  if (env.flight_recorder || env.flight_entries) {
    RecorderOptions o;
    {
      std::lock_guard<std::mutex> g(r.mu);
      o.enabled = r.on;
      o.entries = static_cast<int>(r.slots.size());
    }
    if (env.flight_recorder) o.enabled = *env.flight_recorder;
    if (env.flight_entries) o.entries = *env.flight_entries;
    configure(o);
  }
  std::lock_guard<std::mutex> g(r.mu);
  r.dir_override = env.flight_dir;
}

std::string dump(const std::string& reason, const std::string& where) {
  const std::string d = where.empty() ? dir() : where;
  Recorder& r = rec();
  nlohmann::json j;
  int rank;
  {
    std::lock_guard<std::mutex> g(r.mu);
    rank = std::max(r.rank, 0);
    j["world"] = r.world;
    j["notes"] = nlohmann::json::object();
    for (auto& [k, v] : r.notes) j["notes"][k] = v;
    j["capacity"] = r.slots.size();
    j["recorded"] = r.next - 1;
  }
  j["schema"] = "fsdp-flight/1";
  j["rank"] = rank;
  j["pid"] = static_cast<int64_t>(getpid());
  j["host"] = host_name();
  j["reason"] = reason;
  j["written"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  j["step"] = current_step();
  j["phase"] = to_string(current_phase());
  j["enabled"] = r.on;
  nlohmann::json list = nlohmann::json::array();
  for (auto& x : snapshot()) list.push_back(x.to_json());
  j["collectives"] = std::move(list);
  const std::string path = d + "/flight-rank" + std::to_string(rank) + ".json";
  // Two dumps of one process may run at once (a failed collective's, on the
  // communication thread, and the launcher's SIGUSR1, on the signal
  // thread): one at a time, each through a file of its own, so the file
  // renamed into place is always one whole dump (the later one).
  static std::mutex write_mu;
  static std::atomic<uint64_t> writes{0};
  std::lock_guard<std::mutex> one_at_a_time(write_mu);
  try {
    fsdp::detail::Env& fs = fsdp::detail::env();
    fsdp::detail::make_dirs(d, /*do_fsync=*/false);
    const std::string tmp = path + ".tmp" + std::to_string(getpid()) + "." + std::to_string(++writes);
    {
      const std::string text = j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      fs.remove_file(tmp);
      auto f = fs.create(tmp);
      f->append(text.data(), text.size());
      f->close();
    }
    fs.rename(tmp, path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp: flight recorder: could not write %s: %s (set FSDP_FLIGHT_DIR or fsdp run --flight-dir)\n",
                 path.c_str(), e.what());
    std::fflush(stderr);
    return "";
  }
  return path;
}

namespace {
int g_sig_pipe[2] = {-1, -1};
std::atomic<bool> g_sig_installed{false};

void on_usr1(int) {
  const int saved = errno;
  if (write(g_sig_pipe[1], "d", 1) < 0) {
  }  // a full pipe: a dump is pending anyway
  errno = saved;
}
}  // namespace

void dump_on_signal() {
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  if (g_sig_installed.load()) return;
  // A handler of the program's own (or SIG_IGN) is kept.
  struct sigaction old {};
  if (sigaction(SIGUSR1, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
  if (pipe2(g_sig_pipe, O_CLOEXEC) != 0) return;
  fcntl(g_sig_pipe[1], F_SETFL, O_NONBLOCK);
  // Detached and immortal: it only ever blocks in read().
  std::thread([] {
    char buf[64];
    for (;;) {
      const ssize_t n = read(g_sig_pipe[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      const std::string p = dump("SIGUSR1");
      if (!p.empty()) {
        std::fprintf(stderr, "fsdp: flight recorder: SIGUSR1: wrote %s\n", p.c_str());
        std::fflush(stderr);
      }
    }
  }).detach();
  struct sigaction sa {};
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  g_sig_installed = true;
}

bool dumps_on_signal() { return g_sig_installed.load(); }

std::vector<nlohmann::json> read_dumps(const std::string& d) {
  std::vector<std::pair<int, nlohmann::json>> found;
  fsdp::detail::Env& fs = fsdp::detail::env();
  if (fs.kind(d) != fsdp::detail::FileKind::kDirectory) return {};
  for (const std::string& name : fs.list_dir(d)) {
    if (name.rfind("flight-rank", 0) != 0 || name.size() < 17 || name.compare(name.size() - 5, 5, ".json") != 0)
      continue;
    std::string text;
    try {
      text = fsdp::detail::read_file(d + "/" + name, int64_t(1) << 30);
    } catch (const std::exception&) {  // unreadable or not a file: not a dump
      continue;
    }
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.value("schema", "") != "fsdp-flight/1") continue;
    found.emplace_back(j.value("rank", 0), std::move(j));
  }
  std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<nlohmann::json> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

}  // namespace flight
}  // namespace fsdp
