// fsdp-cpp: the trace recorder (see include/fsdp/trace.h for the format).
//
// One recorder per process. Events go into a vector under one mutex: spans
// are per unit and per collective (hundreds per step), so the lock is not a
// bottleneck, and a single buffer keeps the order of the file simple. The
// buffer is bounded: a long run must not be killed by its own trace.
#include "fsdp/trace.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <sys/stat.h>
#include <vector>

#include "common/env.h"
#include "fsdp/errors.h"
#include "fsdp/memory.h"

namespace fsdp::trace {
namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

struct Event {
  char ph;  // 'X' complete, 'C' counter, 'i' instant
  int tid;
  double ts;   // us
  double dur;  // us ('X' only)
  std::string name;
  std::string cat;
  nlohmann::json args;
};

struct Recorder {
  std::mutex mu;
  // Constant while recording (set by start()).
  std::string dir;
  int rank = 0, world = 1;
  Options opts;
  double origin_wall_us = 0;
  std::chrono::steady_clock::time_point origin_steady;
  int generation = 0;  // bumps at every start(): thread ids restart
  // Protected by mu.
  std::vector<Event> events;
  int64_t dropped = 0;
  int next_tid = 0;
  std::map<int, std::string> thread_names;
  nlohmann::json metadata = nlohmann::json::object();
};

Recorder& rec() {
  static Recorder* r = new Recorder();  // never destroyed: threads may record at exit
  return *r;
}

double now_us() {
  auto& r = rec();
  auto d = std::chrono::steady_clock::now() - r.origin_steady;
  return r.origin_wall_us + std::chrono::duration<double, std::micro>(d).count();
}

// This thread's track id in the current recording; assigned on first use.
// Called with rec().mu held.
int thread_id_locked() {
  thread_local int gen = -1;
  thread_local int tid = -1;
  auto& r = rec();
  if (gen != r.generation) {
    gen = r.generation;
    tid = r.next_tid++;
    if (!r.thread_names.count(tid)) r.thread_names[tid] = tid == 0 ? "compute" : "thread " + std::to_string(tid);
  }
  return tid;
}

void push_locked(Event&& e) {
  auto& r = rec();
  if (r.events.size() >= r.opts.max_events) {
    ++r.dropped;
    return;
  }
  r.events.push_back(std::move(e));
}

void sample_memory_locked(int tid, double ts) {
  if (!rec().opts.sample_memory || !fsdp::memory::installed()) return;
  auto s = fsdp::memory::stats();
  push_locked(Event{'C', tid, ts, 0, "memory", "memory", {{"current", s.current}, {"peak", s.peak}, {"cached", s.cached}}});
}

void make_dirs(const std::string& dir) {
  try {
    fsdp::detail::make_dirs(dir, /*do_fsync=*/false);
  } catch (const Error& e) {
    throw Error(fsdp::detail::cat("trace: ", e.what(), " Pass a writable --trace DIR."));
  }
}

nlohmann::json event_json(const Event& e, int pid) {
  nlohmann::json j = {{"ph", std::string(1, e.ph)}, {"pid", pid}, {"tid", e.tid},
                      {"ts", e.ts},                 {"name", e.name}};
  if (!e.cat.empty()) j["cat"] = e.cat;
  if (e.ph == 'X') j["dur"] = e.dur;
  if (e.ph == 'i') j["s"] = "t";
  if (!e.args.is_null()) j["args"] = e.args;
  return j;
}

// Writes `text` to path through a temp file and rename, so a reader never
// sees half a trace.
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& body) {
  std::ostringstream f;
  body(f);
  try {
    fsdp::detail::replace_file(path, f.str(), /*do_fsync=*/false);
  } catch (const Error& e) {
    throw Error(fsdp::detail::cat("trace: ", e.what(), " Check that the trace directory is writable."));
  }
}

}  // namespace

void start(const std::string& dir, int rank, int world, const Options& opts) {
  auto& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  if (detail::g_enabled.load())
    throw Error(fsdp::detail::cat("trace: start('", dir, "') while a trace into '", r.dir,
                                  "' is running. Call fsdp::trace::stop() first."));
  FSDP_USER_CHECK(!dir.empty(), "trace: start() needs a directory, found an empty string.");
  FSDP_USER_CHECK(world >= 1 && rank >= 0 && rank < world, "trace: expected 0 <= rank < world, found rank ",
                  rank, " world ", world, ".");
  make_dirs(dir);
  r.dir = dir;
  r.rank = rank;
  r.world = world;
  r.opts = opts;
  r.origin_steady = std::chrono::steady_clock::now();
  r.origin_wall_us = std::chrono::duration<double, std::micro>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  ++r.generation;
  r.events.clear();
  r.dropped = 0;
  r.next_tid = 0;
  r.thread_names.clear();
  r.metadata["schema"] = "fsdp-trace/1";
  r.metadata["rank"] = rank;
  r.metadata["world"] = world;
  r.metadata["clock_origin_us"] = r.origin_wall_us;
  thread_id_locked();  // the starting thread is track 0, "compute"
  detail::g_enabled.store(true);
}

std::string stop() {
  auto& r = rec();
  std::vector<Event> events;
  std::map<int, std::string> names;
  nlohmann::json meta;
  std::string path;
  int rank;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!detail::g_enabled.load()) return "";
    detail::g_enabled.store(false);
    events.swap(r.events);
    names.swap(r.thread_names);
    meta = std::move(r.metadata);
    r.metadata = nlohmann::json::object();
    meta["dropped_events"] = r.dropped;
    rank = r.rank;
    path = r.dir + "/trace-rank" + std::to_string(rank) + ".json";
  }
  // Spans are pushed when they end; sort by start so viewers and the report
  // read them in time order, an enclosing span before the spans it contains
  // when both start on the same microsecond tick.
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.ts < b.ts || (a.ts == b.ts && a.dur > b.dur);
  });
  write_atomically(path, [&](std::ostream& f) {
    f << "{\"traceEvents\":[\n";
    nlohmann::json pn = {{"ph", "M"}, {"pid", rank}, {"tid", 0}, {"name", "process_name"},
                         {"args", {{"name", "rank " + std::to_string(rank)}}}};
    f << pn.dump();
    for (auto& [tid, name] : names) {
      nlohmann::json tn = {{"ph", "M"}, {"pid", rank}, {"tid", tid}, {"name", "thread_name"},
                           {"args", {{"name", name}}}};
      f << ",\n" << tn.dump();
    }
    for (auto& e : events) f << ",\n" << event_json(e, rank).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    f << "\n],\"displayTimeUnit\":\"ms\",\"otherData\":"
      << meta.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "}\n";
  });
  return path;
}

void set_thread_name(const std::string& name) {
  auto& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  if (!detail::g_enabled.load()) return;
  r.thread_names[thread_id_locked()] = name;
}

Span::Span(const char* name, const char* cat, nlohmann::json args) : Span(std::string(name), cat, std::move(args)) {}

Span::Span(std::string name, const char* cat, nlohmann::json args) {
  if (!enabled()) return;
  active_ = true;
  name_ = std::move(name);
  cat_ = cat ? cat : "";
  args_ = args.is_null() ? nlohmann::json::object() : std::move(args);
  ts_us_ = now_us();
}

Span::~Span() { end(); }

void Span::end() {
  if (!active_) return;
  active_ = false;
  double t1 = now_us();
  auto& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  // A span that outlives stop() (or straddles a restart) is discarded.
  if (!detail::g_enabled.load() || ts_us_ < r.origin_wall_us) return;
  int tid = thread_id_locked();
  push_locked(Event{'X', tid, ts_us_, t1 - ts_us_, std::move(name_), cat_, std::move(args_)});
  sample_memory_locked(tid, t1);
}

void counter(const std::string& name, const nlohmann::json& series) {
  if (!enabled()) return;
  double ts = now_us();
  auto& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  if (!detail::g_enabled.load()) return;
  push_locked(Event{'C', thread_id_locked(), ts, 0, name, name, series});
}

void counter(const std::string& name, double value) { counter(name, nlohmann::json{{"value", value}}); }

void instant(const std::string& name, const char* cat, const nlohmann::json& args) {
  if (!enabled()) return;
  double ts = now_us();
  auto& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  if (!detail::g_enabled.load()) return;
  push_locked(Event{'i', thread_id_locked(), ts, 0, name, cat ? cat : "", args});
}

void set_metadata(const std::string& key, const nlohmann::json& value) {
  auto& r = rec();
  std::lock_guard<std::mutex> g(r.mu);
  r.metadata[key] = value;
}

namespace {

// The largest rank file merge reads (never allocate from an unbounded size).
constexpr int64_t kMaxTraceBytes = int64_t(4) << 30;

std::vector<std::pair<int, std::string>> rank_files(const std::string& dir) {
  std::vector<std::pair<int, std::string>> out;
  if (fsdp::detail::env().kind(dir) != fsdp::detail::FileKind::kDirectory) return out;
  for (const std::string& n : fsdp::detail::env().list_dir(dir)) {
    const std::string pre = "trace-rank", suf = ".json";
    if (n.size() > pre.size() + suf.size() && n.compare(0, pre.size(), pre) == 0 &&
        n.compare(n.size() - suf.size(), suf.size(), suf) == 0) {
      std::string num = n.substr(pre.size(), n.size() - pre.size() - suf.size());
      if (!num.empty() && std::all_of(num.begin(), num.end(), ::isdigit))
        out.emplace_back(std::stoi(num), dir + "/" + n);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string merge(const std::string& dir) {
  auto files = rank_files(dir);
  FSDP_USER_CHECK(!files.empty(), "trace merge: expected files trace-rank<R>.json in '", dir,
                  "', found none. Run the program with --trace ", dir, " first.");
  std::string path = dir + "/trace.json";
  nlohmann::json ranks = nlohmann::json::array();
  write_atomically(path, [&](std::ostream& f) {
    f << "{\"traceEvents\":[";
    bool first = true;
    for (auto& [rank, file] : files) {
      nlohmann::json j = nlohmann::json::parse(fsdp::detail::read_file(file, kMaxTraceBytes), nullptr,
                                               /*allow_exceptions=*/false);
      FSDP_USER_CHECK(j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array(),
                      "trace merge: '", file, "' is not a trace (expected a JSON object with traceEvents). ",
                      "Was the run interrupted before trace::stop()? Delete the file and merge again.");
      for (auto& e : j["traceEvents"]) {
        e["pid"] = rank;  // one process track per rank, whatever the file said
        f << (first ? "\n" : ",\n") << e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        first = false;
      }
      nlohmann::json sort = {{"ph", "M"}, {"pid", rank}, {"tid", 0}, {"name", "process_sort_index"},
                             {"args", {{"sort_index", rank}}}};
      f << (first ? "\n" : ",\n") << sort.dump();
      first = false;
      nlohmann::json meta = j.value("otherData", nlohmann::json::object());
      meta["rank"] = rank;
      ranks.push_back(std::move(meta));
    }
    nlohmann::json other = {{"schema", "fsdp-trace/1"}, {"merged", true}, {"ranks", ranks}};
    f << "\n],\"displayTimeUnit\":\"ms\",\"otherData\":"
      << other.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "}\n";
  });
  return path;
}

}  // namespace fsdp::trace
