// fsdp-cpp: reading a trace into the report's data model (fsdp::report::analyze).
//
// The HTML page only draws; every number it shows is computed here, so tests
// can check the numbers without a browser. The model is compact on purpose:
// a page that embeds a million raw trace events would not open, so spans keep
// seven fields, a long run's timeline keeps the spans of the steps a user
// looks for (choose_span_steps: the slowest, those around checkpoints and
// restarts, the first, every k-th) within a budget per rank, and the memory
// series is downsampled (keeping every local peak's bucket maximum, so the
// highest point survives). The step picker's shortcuts are chosen here too.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "common/env.h"
#include "common/traffic_math.h"
#include "fsdp/errors.h"
#include "fsdp/strategy.h"
#include "fsdp/trace.h"

namespace fsdp::report {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxMemoryPoints = 1500;  // per rank; a chart is ~1000 px wide
constexpr size_t kMaxSpansRead = 4000000;  // per rank, read from the trace at all
// Spans one rank's timeline embeds: beyond it, whole steps' spans are left
// out (the steps themselves, their traffic and memory, are always kept).
constexpr size_t kSpanBudgetPerRank = 60000;
constexpr size_t kSlowestShortcuts = 5;     // the step picker's "slowest" shortcuts
constexpr size_t kCheckpointShortcuts = 3;  // checkpoint events given before/after shortcuts
constexpr size_t kRestartShortcuts = 3;     // restarts given a shortcut
constexpr int kFirstStepsKept = 3;          // warm-up steps whose spans are always kept

struct RankTrace {
  int rank = 0;
  json meta = json::object();
  std::vector<json> events;
};

bool is_dir(const std::string& p) { return fsdp::detail::env().kind(p) == fsdp::detail::FileKind::kDirectory; }

json read_json(const std::string& file) {
  std::string text;
  try {
    text = fsdp::detail::read_file(file, int64_t(4) << 30);
  } catch (const Error& e) {
    throw Error(fsdp::detail::cat("report: ", e.what(), " Expected a trace directory written by --trace or a "
                                  "trace.json file."));
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  FSDP_USER_CHECK(j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array(), "report: '", file,
                  "' is not a Chrome trace (expected a JSON object with a traceEvents array). ",
                  "Was the run interrupted before fsdp::trace::stop()?");
  return j;
}

// DIR's trace-rank<R>.json files as (R, path), by rank.
std::vector<std::pair<int, std::string>> rank_files(const std::string& dir) {
  std::vector<std::pair<int, std::string>> files;
  if (is_dir(dir))
    for (const std::string& n : fsdp::detail::env().list_dir(dir))
      if (n.rfind("trace-rank", 0) == 0 && n.size() > 15 && n.substr(n.size() - 5) == ".json") {
        std::string num = n.substr(10, n.size() - 15);
        if (!num.empty() && std::all_of(num.begin(), num.end(), ::isdigit))
          files.emplace_back(std::stoi(num), dir + "/" + n);
      }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<RankTrace> load(const std::string& path) {
  std::vector<RankTrace> ranks;
  if (is_dir(path)) {
    const auto files = rank_files(path);
    if (files.empty() && !is_dir(path + "/trace.json")) {
      if (fsdp::detail::env().kind(path + "/trace.json") == fsdp::detail::FileKind::kFile)
        return load(path + "/trace.json");
    }
    FSDP_USER_CHECK(!files.empty(), "report: expected trace-rank<R>.json files in '", path,
                    "', found none. Run the trainer with --trace ", path, " first.");
    for (auto& [rank, file] : files) {
      json j = read_json(file);
      RankTrace rt;
      rt.rank = rank;
      rt.meta = j.value("otherData", json::object());
      for (auto& e : j["traceEvents"]) rt.events.push_back(std::move(e));
      ranks.push_back(std::move(rt));
    }
    return ranks;
  }
  // One file: a merged trace (pid = rank) or a single rank's file.
  json j = read_json(path);
  json other = j.value("otherData", json::object());
  std::map<int, RankTrace> by_pid;
  for (auto& e : j["traceEvents"]) {
    int pid = e.value("pid", 0);
    by_pid[pid].rank = pid;
    by_pid[pid].events.push_back(std::move(e));
  }
  if (other.value("merged", false) && other.contains("ranks")) {
    for (auto& m : other["ranks"]) {
      int r = m.value("rank", 0);
      by_pid[r].rank = r;
      by_pid[r].meta = m;
    }
  } else if (by_pid.size() == 1) {
    by_pid.begin()->second.meta = other;
  }
  for (auto& [pid, rt] : by_pid) ranks.push_back(std::move(rt));
  return ranks;
}

// Replica groups (fsdp/replicas.h) write one trace folder per group:
// DIR/group<g>/trace-rank<R>.json. The groups' folders when DIR holds no
// rank files of its own and at least one such folder; empty otherwise.
std::vector<std::pair<int, std::string>> group_dirs(const std::string& path) {
  std::vector<std::pair<int, std::string>> out;
  if (!is_dir(path)) return out;
  if (!rank_files(path).empty() || fsdp::detail::env().kind(path + "/trace.json") != fsdp::detail::FileKind::kNone)
    return out;  // its own trace
  for (const std::string& n : fsdp::detail::env().list_dir(path))
    if (n.size() > 5 && n.rfind("group", 0) == 0 &&
        std::all_of(n.begin() + 5, n.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
        is_dir(path + "/" + n))
      out.emplace_back(std::stoi(n.substr(5)), path + "/" + n);
  std::sort(out.begin(), out.end());
  // Only the folders that hold a trace (a group killed before it wrote one has none).
  out.erase(std::remove_if(out.begin(), out.end(), [](const auto& g) { return rank_files(g.second).empty(); }),
            out.end());
  return out;
}

// Which row of the timeline a span belongs to.
std::string lane_of(const std::string& name, const std::string& cat) {
  if (cat == "comm") {
    if (name == "all_gather") return "ag";
    return "rs";  // reduce_scatter, all_reduce, broadcast, barrier
  }
  if (cat == "step") return "step";
  if (cat == "ckpt") return "ckpt";
  if (cat == "forward" || cat == "backward" || cat == "optim") return cat;
  return "other";
}

double num(const json& j, const char* key, double dflt = 0) {
  if (!j.is_object()) return dflt;
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : dflt;
}

std::string str(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// The replica groups' steps as the traces saw them: every quorum (instant
// "quorum", cat "ft", one per step a group took part in, on each of its
// ranks) by id, and every heal a rank received (span "heal", cat "ft",
// receiving). A group's killed launch leaves no trace; the others' quorums
// still name it, so participation is read from every group's view at once.
struct ReplicaEvents {
  struct Quorum {
    int64_t id = 0, step = 0;
    std::vector<int> groups;
    bool committed = false;
    std::string dropped;
    double ts = std::numeric_limits<double>::infinity();  // microseconds, the earliest record
  };
  std::map<int64_t, Quorum> quorums;
  struct Heal {
    int group, rank, source;
    int64_t step, quorum;
    double ts, dur, bytes, wait;  // wait: milliseconds of dur spent before the source's first byte
  };
  std::vector<Heal> heals;
  std::set<int> traced;  // groups whose ranks wrote a trace

  // group_of_dir: the group whose folder the ranks came from; -1: read it
  // from the events (a single group's folder).
  void add(const std::vector<RankTrace>& ranks, int group_of_dir) {
    if (group_of_dir >= 0) traced.insert(group_of_dir);
    for (const auto& rt : ranks)
      for (const auto& e : rt.events) {
        if (e.value("cat", "") != "ft") continue;
        const std::string ph = e.value("ph", ""), name = e.value("name", "");
        const json args = e.value("args", json::object());
        const int group = args.value("group", group_of_dir);
        if (ph == "i" && name == "quorum" && args.contains("quorum")) {
          Quorum& q = quorums[args.value("quorum", int64_t(0))];
          q.id = args.value("quorum", int64_t(0));
          q.step = args.value("step", int64_t(0));
          if (args.contains("groups") && args["groups"].is_array()) q.groups = args["groups"].get<std::vector<int>>();
          q.committed = q.committed || args.value("committed", false);
          if (q.dropped.empty()) q.dropped = args.value("dropped", "");
          q.ts = std::min(q.ts, num(e, "ts"));
          if (group >= 0) traced.insert(group);
        } else if (ph == "X" && name == "heal" && args.value("receiving", false)) {
          heals.push_back({group, rt.rank, args.value("source", -1), args.value("step", int64_t(-1)),
                           args.value("quorum", int64_t(-1)), num(e, "ts"), num(e, "dur"), num(args, "bytes"),
                           num(args, "wait_ms")});
        }
      }
  }

  // The model's "replicas" (null without any quorum): the quorums in
  // order; per group, the steps it committed, dropped (a member of a quorum
  // that dropped) and missed; the heals (the bytes of all its ranks, the
  // slowest rank's duration, and how much of it was spent waiting for the
  // source to reach the step).
  json to_json(double t_origin) const {
    if (quorums.empty()) return nullptr;
    auto ms = [&](double us) { return (us - t_origin) / 1000.0; };
    std::set<int> groups = traced;
    json qs = json::array();
    for (const auto& [id, q] : quorums) {
      groups.insert(q.groups.begin(), q.groups.end());
      qs.push_back({{"id", id}, {"step", q.step}, {"groups", q.groups}, {"committed", q.committed},
                    {"dropped", q.dropped}, {"t", std::isfinite(q.ts) ? json(ms(q.ts)) : json(nullptr)}});
    }
    // One heal per (group, quorum): the group's duration is its slowest rank's.
    std::map<std::pair<int, int64_t>, json> by_heal;
    for (const auto& h : heals) {
      json& row = by_heal[{h.group, h.quorum}];
      if (row.is_null())
        row = {{"group", h.group}, {"step", h.step}, {"quorum", h.quorum}, {"source", h.source},
               {"sources", json::array()}, {"t", ms(h.ts)}, {"dur", 0.0}, {"wait", 0.0}, {"bytes", 0.0},
               {"ranks", 0}};
      // Shard r comes from source r mod #sources: a group heals from several.
      auto& src = row["sources"];
      if (std::find(src.begin(), src.end(), json(h.source)) == src.end()) src.push_back(h.source);
      row["dur"] = std::max(row["dur"].get<double>(), h.dur / 1000.0);
      row["wait"] = std::max(row["wait"].get<double>(), h.wait);
      row["bytes"] = row["bytes"].get<double>() + h.bytes;
      row["ranks"] = row["ranks"].get<int>() + 1;
      row["t"] = std::min(row["t"].get<double>(), ms(h.ts));
    }
    json hs = json::array();
    for (auto& [key, row] : by_heal) {
      groups.insert(key.first);
      std::vector<int> src = row["sources"].get<std::vector<int>>();
      std::sort(src.begin(), src.end());
      row["sources"] = src;
      row["source"] = src.front();
      hs.push_back(row);
    }
    json per = json::array();
    for (int g : groups) {
      int committed = 0, dropped = 0, absent = 0, healed = 0;
      for (const auto& [id, q] : quorums) {
        const bool member = std::find(q.groups.begin(), q.groups.end(), g) != q.groups.end();
        if (!member) ++absent;
        else if (q.committed) ++committed;
        else ++dropped;
      }
      for (const auto& [key, row] : by_heal) healed += key.first == g;
      per.push_back({{"group", g}, {"committed", committed}, {"dropped", dropped}, {"absent", absent},
                     {"heals", healed}, {"traced", traced.count(g) > 0}});
    }
    return {{"quorums", qs}, {"groups", per}, {"heals", hs}};
  }
};

// The stages of analyze(), in order.

// Microseconds of the first timed event of any rank: every time is ms after it.
double time_origin(const std::vector<RankTrace>& ranks, const std::string& path) {
  double t_origin = std::numeric_limits<double>::infinity();
  for (auto& rt : ranks)
    for (auto& e : rt.events)
      if (e.value("ph", "") != "M" && e.contains("ts") && e["ts"].is_number())
        t_origin = std::min(t_origin, e["ts"].get<double>());
  FSDP_USER_CHECK(std::isfinite(t_origin), "report: '", path,
                  "' holds no timed events. Was tracing started (fsdp::trace::start) before training?");
  return t_origin;
}

// The traffic chart's reference lines (3P, 2P) from the units or the ledger.
json traffic_lines(const json& meta0, int world, double pb, double rb, json& warnings) {
  const json units = meta0.value("units", json::array());
  double padded_total = 0;
  for (auto& u : units) padded_total += num(u, "padded_numel", num(u, "numel"));
  double frac = world > 0 ? double(world - 1) / world : 0;
  json lines = json::object();
  if (padded_total > 0 && world > 0) {
    // The planner's formulas (common/traffic_math.h), one micro-step.
    const auto padded = static_cast<int64_t>(padded_total);
    const auto P = static_cast<int64_t>(pb), R = static_cast<int64_t>(rb);
    auto bytes = [&](ShardingStrategy s, int group) {
      return traffic::per_step(s, padded, world, group, 1, P, R);
    };
    lines["P_bytes"] = padded_total * pb;
    lines["full_3p"] = bytes(ShardingStrategy::FULL_SHARD, world).total();
    lines["grad_op_2p"] = bytes(ShardingStrategy::SHARD_GRAD_OP, world).total();
    lines["ddp_2p"] = bytes(ShardingStrategy::NO_SHARD, world).total();
    // HYBRID: the units are padded over the shard group of S.
    const int S = meta0.value("shard_group_size", world);
    const std::string strategy = meta0.value("strategy", "");
    if (S > 0 && S < world && world % S == 0 && strategy.rfind("HYBRID_SHARD", 0) == 0) {
      const traffic::Bytes h = bytes(
          strategy == "HYBRID_SHARD" ? ShardingStrategy::HYBRID_SHARD : ShardingStrategy::HYBRID_SHARD_ZERO2, S);
      lines["hybrid_intra"] = h.all_gather + h.reduce_scatter;
      lines["hybrid_inter"] = h.all_reduce;
    }
  } else if (meta0.contains("ledger") && num(meta0["ledger"], "P_full") > 0) {
    double P = num(meta0["ledger"], "P_full");
    lines["P_bytes"] = P;
    lines["full_3p"] = 3 * frac * P;
    lines["grad_op_2p"] = 2 * frac * P;
    lines["ddp_2p"] = 2 * frac * P;
  } else {
    warnings.push_back("no \"units\" (or \"ledger\".P_full) metadata: the traffic chart has no 3P / 2P lines.");
  }
  return lines;
}

// The state tensors the optimizer keeps per parameter, as the run recorded
// it (the ledger taken with the optimizer reads the optimizer table,
// optim/optimizer_state.h); null where the trace does not say, and the page
// then says so instead of assuming an optimizer.
json optimizer_state_per_param(const json& meta0) {
  const json k = meta0.value("optimizer_state_per_param", json(nullptr));
  return k.is_number() && k.get<double>() >= 0 ? k : json(nullptr);
}

// One rank's events sorted into what the page draws and what the step table needs.
struct SpanRow {
  double t, dur;
  std::string lane, name, unit;
  double bytes;
  int tid;
};

struct RankEvents {
  std::vector<SpanRow> spans;  // every span read, in trace order
  json memory_raw = json::array(), ckpt = json::array();
  std::map<int, std::string> thread_names;
  struct StepSpan { double t0, t1; json args; };
  std::vector<StepSpan> step_spans;
  // inter_logical: what `inter` would have been uncompressed (FSDP_COMPRESS;
  // the span's inter_host_logical_bytes, else inter).
  struct Comm { double t; std::string name; double bytes, inter, inter_logical; };
  std::vector<Comm> comms;
  std::vector<std::pair<double, double>> mem_points;  // (t, current) for step peaks
  double peak = 0, peak_counter = 0, cached_peak = 0;
  size_t skipped = 0;
};

RankEvents collect_events(const RankTrace& rt, double t_origin) {
  auto ms = [&](double us) { return (us - t_origin) / 1000.0; };
  RankEvents r;
  size_t kept = 0;
  for (auto& e : rt.events) {
    std::string ph = e.value("ph", "");
    std::string name = e.value("name", "");
    std::string cat = e.value("cat", "");
    const json args = e.value("args", json::object());
    if (ph == "M") {
      if (name == "thread_name") r.thread_names[e.value("tid", 0)] = str(args, "name");
      continue;
    }
    double t = ms(num(e, "ts"));
    if (ph == "X") {
      double dur = num(e, "dur") / 1000.0;
      std::string lane = lane_of(name, cat);
      std::string unit = str(args, "unit");
      if (unit.empty()) unit = str(args, "label");
      double bytes = num(args, "bytes");
      if (cat == "step") r.step_spans.push_back({t, t + dur, args});
      if (cat == "comm") {
        const double inter = num(args, "inter_host_bytes");
        r.comms.push_back({t, name, bytes, inter, num(args, "inter_host_logical_bytes", inter)});
      }
      if (cat == "ckpt")
        r.ckpt.push_back({{"t", t}, {"dur", dur}, {"name", name}, {"path", str(args, "path")},
                          {"bytes", bytes}, {"step", args.value("step", json(nullptr))}});
      if (kept < kMaxSpansRead) {
        r.spans.push_back({t, dur, lane, name, unit, bytes, e.value("tid", 0)});
        ++kept;
      } else {
        ++r.skipped;
      }
    } else if (ph == "C" && name == "memory") {
      double cur = num(args, "current"), pk = num(args, "peak", cur), cached = num(args, "cached", 0);
      // [t, held, peak, cached]: cached bytes are the allocator's, beside the tensors' (held)
      r.memory_raw.push_back({t, cur, pk, cached});
      r.cached_peak = std::max(r.cached_peak, cached);
      r.mem_points.emplace_back(t, cur);
      r.peak = std::max(r.peak, cur);
      r.peak_counter = std::max(r.peak_counter, pk);
    } else if (ph == "i" && (cat == "ckpt" || name == "checkpoint")) {
      r.ckpt.push_back({{"t", t}, {"dur", 0}, {"name", name}, {"path", str(args, "path")},
                        {"bytes", num(args, "bytes")}, {"step", args.value("step", json(nullptr))}});
    }
  }
  return r;
}

// Per step: traffic from the comm spans that start inside it, memory
// high-water from the samples inside it.
json step_table(RankEvents& r) {
  json steps = json::array();
  std::sort(r.step_spans.begin(), r.step_spans.end(), [](auto& a, auto& b) { return a.t0 < b.t0; });
  std::sort(r.mem_points.begin(), r.mem_points.end());
  std::sort(r.comms.begin(), r.comms.end(), [](auto& a, auto& b) { return a.t < b.t; });
  for (size_t i = 0; i < r.step_spans.size(); ++i) {
    auto& s = r.step_spans[i];
    double ag = 0, rs = 0, ar = 0, other = 0, inter = 0, inter_logical = 0;
    int n_ag = 0, n_rs = 0, n_ar = 0;
    // The collectives that start inside the step (comms sorted by start).
    auto first = std::lower_bound(r.comms.begin(), r.comms.end(), s.t0, [](auto& c, double t) { return c.t < t; });
    for (auto it = first; it != r.comms.end() && it->t <= s.t1; ++it) {
      auto& c = *it;
      inter += c.inter;
      inter_logical += c.inter_logical;
      if (c.name == "all_gather") ag += c.bytes, ++n_ag;
      else if (c.name == "reduce_scatter") rs += c.bytes, ++n_rs;
      else if (c.name == "all_reduce") ar += c.bytes, ++n_ar;
      else other += c.bytes;
    }
    double mpk = 0;
    auto lo = std::lower_bound(r.mem_points.begin(), r.mem_points.end(), std::make_pair(s.t0, -1e300));
    for (auto it = lo; it != r.mem_points.end() && it->first <= s.t1; ++it) mpk = std::max(mpk, it->second);
    json st = {{"index", (int)i}, {"step", s.args.value("step", json((int)i))}, {"t0", s.t0}, {"t1", s.t1},
               {"ag_bytes", ag},  {"rs_bytes", rs}, {"ar_bytes", ar}, {"other_bytes", other},
               {"total_bytes", ag + rs + ar + other}, {"inter_bytes", inter},
               {"inter_logical_bytes", inter_logical},
               {"intra_bytes", ag + rs + ar + other - inter}, {"n_ag", n_ag}, {"n_rs", n_rs}, {"n_ar", n_ar},
               {"peak_mem", mpk}};
    if (s.args.contains("loss")) st["loss"] = s.args["loss"];
    steps.push_back(std::move(st));
  }
  return steps;
}

// Downsample memory: keep the largest sample of each bucket.
json downsample_memory(json memory_raw) {
  if (memory_raw.size() <= kMaxMemoryPoints) return memory_raw;
  json memory = json::array();
  size_t n = memory_raw.size(), buckets = kMaxMemoryPoints;
  for (size_t b = 0; b < buckets; ++b) {
    size_t i0 = b * n / buckets, i1 = std::max(i0 + 1, (b + 1) * n / buckets);
    size_t best = i0;
    for (size_t i = i0; i < i1 && i < n; ++i)
      if (memory_raw[i][1].get<double>() > memory_raw[best][1].get<double>()) best = i;
    memory.push_back(memory_raw[best]);
  }
  return memory;
}

// One rank after collect_events and step_table.
struct RankModel {
  int rank = 0;
  json meta;
  RankEvents ev;
  json steps;
};

// The steps of the run by index, across ranks: the window from the earliest
// start to the latest end of step i on any rank, and its label (rank 0's).
// Its duration is the longest of the ranks' own (the ranks' clocks are not
// one clock: the window can be wider than any rank's step).
struct StepWindow {
  double t0, t1;
  json label;
  double longest = 0;
  double dur() const { return longest; }
};

std::vector<StepWindow> step_windows(const std::vector<RankModel>& ranks) {
  std::vector<StepWindow> w;
  for (auto& r : ranks)
    for (size_t i = 0; i < r.steps.size(); ++i) {
      const json& s = r.steps[i];
      const double t0 = s["t0"].get<double>(), t1 = s["t1"].get<double>();
      if (i == w.size()) w.push_back({t0, t1, s["step"]});
      w[i].t0 = std::min(w[i].t0, t0);
      w[i].t1 = std::max(w[i].t1, t1);
      w[i].longest = std::max(w[i].longest, t1 - t0);
    }
  return w;
}

// As the page's fms(): "1.23 s", "45.6 ms", "7.89 ms".
std::string ms_text(double ms) {
  char b[32];
  if (ms >= 1000)
    std::snprintf(b, sizeof b, "%.2f s", ms / 1000);
  else if (ms >= 10)
    std::snprintf(b, sizeof b, "%.1f ms", ms);
  else
    std::snprintf(b, sizeof b, "%.2f ms", ms);
  return b;
}

std::string label_text(const json& label) { return label.is_string() ? label.get<std::string>() : label.dump(); }

// The last step that ends by t, and the first that starts at or after it
// (-1: none).
std::pair<int, int> steps_around(const std::vector<StepWindow>& w, double t) {
  int before = -1, after = -1;
  for (int i = 0; i < (int)w.size(); ++i) {
    if (w[i].t1 <= t || (w[i].t0 <= t && t <= w[i].t1)) before = i;
    if (after < 0 && w[i].t0 >= t) after = i;
  }
  return {before, after};
}

// A rank's own steps (start, end), in order.
std::vector<std::pair<double, double>> own_steps(const RankModel& r) {
  std::vector<std::pair<double, double>> v;
  for (auto& s : r.steps) v.emplace_back(s["t0"].get<double>(), s["t1"].get<double>());
  return v;
}

// The index of the rank's step that holds time t; -1 outside every step.
int step_of(const std::vector<std::pair<double, double>>& own, double t) {
  auto it = std::upper_bound(own.begin(), own.end(), t, [](double x, const auto& s) { return x < s.first; });
  if (it == own.begin() || t > std::prev(it)->second) return -1;
  return int(std::prev(it) - own.begin());
}

// The step picker's shortcuts: the few steps a user looks for in a long run.
//   slowest     the longest step, and up to kSlowestShortcuts - 1 more that
//               take 5% or more over the median (a step's duration: the
//               longest of the ranks' own)
//   checkpoint  the step before and the step after a checkpoint event (the
//               first and the last event, and the longest in between, up to
//               kCheckpointShortcuts events)
//   restart     the step after a checkpoint load, or where the step numbers
//               go back or jump (a restart resumed there)
json shortcuts(const std::vector<StepWindow>& w, const std::vector<RankModel>& ranks) {
  json out = json::array();
  if (w.empty()) return out;
  std::vector<double> durs;
  for (auto& s : w) durs.push_back(s.dur());
  std::vector<double> sorted = durs;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  if (w.size() > 1) {
    std::vector<int> idx(w.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = (int)i;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return durs[a] > durs[b]; });
    for (size_t k = 0; k < std::min(kSlowestShortcuts, idx.size()); ++k) {
      const int i = idx[k];
      if (k > 0 && durs[i] < 1.05 * median) break;  // the rest are ordinary steps
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.1f", median > 0 ? durs[i] / median : 0.0);
      out.push_back({{"kind", "slowest"}, {"index", i}, {"step", w[i].label},
                     {"label", "step " + label_text(w[i].label) + " · " + ms_text(durs[i])},
                     {"why", std::string(ratio) + "x the median step (" + ms_text(median) + ")"}});
    }
  }
  // Checkpoint events: rank 0's (every rank saves and loads together).
  const json* ck = nullptr;
  for (auto& r : ranks)
    if (!r.ev.ckpt.empty()) {
      ck = &r.ev.ckpt;
      break;
    }
  std::vector<const json*> saves, loads;
  if (ck)
    for (auto& c : *ck) (c.value("name", "") == "load" ? loads : saves).push_back(&c);
  if (!saves.empty()) {
    std::vector<const json*> pick;
    pick.push_back(saves.front());
    if (saves.size() > 1) pick.push_back(saves.back());
    std::vector<const json*> middle(saves.begin() + 1, saves.end() - (saves.size() > 1 ? 1 : 0));
    std::stable_sort(middle.begin(), middle.end(),
                     [](auto a, auto b) { return a->value("dur", 0.0) > b->value("dur", 0.0); });
    for (auto* c : middle)
      if (pick.size() < kCheckpointShortcuts) pick.push_back(c);
    std::sort(pick.begin(), pick.end(), [](auto a, auto b) { return a->value("t", 0.0) < b->value("t", 0.0); });
    for (auto* c : pick) {
      auto [before, after] = steps_around(w, c->value("t", 0.0));
      const std::string what = c->value("name", "save") + ((*c).contains("step") && !(*c)["step"].is_null()
                                                              ? " of step " + label_text((*c)["step"])
                                                              : std::string());
      if (before >= 0)
        out.push_back({{"kind", "checkpoint"}, {"index", before}, {"step", w[before].label},
                       {"label", "before " + what + ": step " + label_text(w[before].label)},
                       {"why", "the last step before the checkpoint at " + ms_text(c->value("t", 0.0))}});
      if (after >= 0)
        out.push_back({{"kind", "checkpoint"}, {"index", after}, {"step", w[after].label},
                       {"label", "after " + what + ": step " + label_text(w[after].label)},
                       {"why", "the first step after the checkpoint (" + ms_text(c->value("dur", 0.0)) + ")"}});
    }
  }
  // Restarts: after a load, or where the step numbers do not follow on.
  std::vector<std::pair<int, std::string>> restarts;
  for (auto* c : loads) {
    auto [before, after] = steps_around(w, c->value("t", 0.0));
    (void)before;
    if (after >= 0) restarts.emplace_back(after, "resumed from a checkpoint load");
  }
  // (A step number seen twice in a row is a step replica groups dropped
  // and ran again, not a restart: the replica section shows those.)
  for (size_t i = 1; i < w.size(); ++i)
    if (w[i].label.is_number_integer() && w[i - 1].label.is_number_integer() &&
        w[i].label.get<int64_t>() != w[i - 1].label.get<int64_t>() + 1 &&
        w[i].label.get<int64_t>() != w[i - 1].label.get<int64_t>())
      restarts.emplace_back((int)i, "the step numbers go from " + label_text(w[i - 1].label) + " to " +
                                        label_text(w[i].label));
  std::sort(restarts.begin(), restarts.end(), [](auto& a, auto& b) { return a.first < b.first; });
  restarts.erase(std::unique(restarts.begin(), restarts.end(), [](auto& a, auto& b) { return a.first == b.first; }),
                 restarts.end());
  for (size_t k = 0; k < std::min(kRestartShortcuts, restarts.size()); ++k) {
    const int i = restarts[k].first;
    out.push_back({{"kind", "restart"}, {"index", i}, {"step", w[i].label},
                   {"label", "restart: step " + label_text(w[i].label)}, {"why", restarts[k].second}});
  }
  return out;
}

// Which steps' spans the page embeds. Everything when every rank's spans fit
// kSpanBudgetPerRank; else, in this order while they fit: the shortcuts'
// steps, the first kFirstStepsKept, then every k-th step. Spans outside any
// step (construction, a checkpoint between steps) are always kept.
std::vector<bool> choose_span_steps(const std::vector<StepWindow>& w, const std::vector<RankModel>& ranks,
                                    const json& cuts, json& info) {
  const size_t n = w.size();
  std::vector<bool> keep(n, true);
  // Spans per step (by start time) on the rank with the most, and outside steps.
  std::vector<size_t> cost(n, 0);
  size_t outside_max = 0;
  bool over = false;
  for (auto& r : ranks) {
    std::vector<size_t> c(n, 0);
    size_t outside = 0;
    const auto own = own_steps(r);
    for (auto& sp : r.ev.spans) {
      const int i = step_of(own, sp.t);
      if (i >= 0 && i < (int)n) ++c[i];
      else ++outside;
    }
    for (size_t i = 0; i < n; ++i) cost[i] = std::max(cost[i], c[i]);
    outside_max = std::max(outside_max, outside);
    over = over || r.ev.spans.size() > kSpanBudgetPerRank;
  }
  info = {{"all", !over}, {"steps", n}, {"kept", n}, {"budget", kSpanBudgetPerRank}};
  if (!over) return keep;
  std::fill(keep.begin(), keep.end(), false);
  size_t used = outside_max, kept = 0;
  auto take = [&](size_t i) {
    if (i >= n || keep[i] || used + cost[i] > kSpanBudgetPerRank) return;
    keep[i] = true;
    used += cost[i];
    ++kept;
  };
  for (auto& c : cuts) take(c["index"].get<size_t>());
  for (int i = 0; i < kFirstStepsKept; ++i) take(i);
  // Every k-th step with what is left.
  size_t avg = 0;
  for (size_t c : cost) avg += c;
  avg = std::max<size_t>(1, avg / std::max<size_t>(1, n));
  const size_t room = used < kSpanBudgetPerRank ? (kSpanBudgetPerRank - used) / avg : 0;
  const size_t stride = room ? std::max<size_t>(1, (n + room - 1) / room) : n + 1;
  for (size_t i = 0; i < n && room; i += stride) take(i);
  info["all"] = false;
  info["kept"] = kept;
  info["stride"] = stride;
  return keep;
}

json rank_json(RankModel& r, const std::vector<bool>& keep) {
  json spans = json::array();
  const auto own = own_steps(r);
  for (auto& sp : r.ev.spans) {
    if (!keep.empty()) {
      const int i = step_of(own, sp.t);
      if (i >= 0 && i < (int)keep.size() && !keep[i]) continue;
    }
    spans.push_back({sp.t, sp.dur, sp.lane, sp.name, sp.unit, sp.bytes, sp.tid});
  }
  for (size_t i = 0; i < r.steps.size() && i < keep.size(); ++i)
    if (!keep[i]) r.steps[i]["spans"] = false;
  json memory = downsample_memory(std::move(r.ev.memory_raw));
  json tn = json::object();
  for (auto& [tid, n] : r.ev.thread_names) tn[std::to_string(tid)] = n;
  return {{"rank", r.rank}, {"meta", r.meta}, {"spans", std::move(spans)},
          {"memory", std::move(memory)}, {"steps", std::move(r.steps)},
          {"ckpt", std::move(r.ev.ckpt)}, {"peak", std::max(r.ev.peak, r.ev.peak_counter)},
          {"cached_peak", r.ev.cached_peak}, {"peak_current", r.ev.peak}, {"threads", tn}};
}

}  // namespace

// load -> time origin -> run-wide facts (rank 0's metadata: every rank
// writes the same) -> each rank's events and steps -> the steps across ranks:
// shortcuts and which steps' spans to embed -> the model the page draws.
namespace {

json analyze_ranks(std::vector<RankTrace> ranks, const std::string& path, const ReplicaEvents& replicas,
                   double t_origin, json warnings) {
  const json meta0 = ranks.front().meta;  // a copy: the traces are freed once read
  int world = meta0.value("world", static_cast<int>(ranks.size()));
  json units = meta0.value("units", json::array());
  double pb = num(meta0, "param_bytes_per_elem", 4);
  double rb = num(meta0, "reduce_bytes_per_elem", pb);
  json lines = traffic_lines(meta0, world, pb, rb, warnings);
  if (units.empty()) warnings.push_back("no \"units\" metadata: the shard map cannot be drawn.");
  if ((int)ranks.size() != world)
    warnings.push_back("found " + std::to_string(ranks.size()) + " rank file(s) for world size " +
                       std::to_string(world) + ": a rank did not write its trace.");

  std::vector<RankModel> models;
  for (auto& rt : ranks) {
    RankModel m;
    m.rank = rt.rank;
    m.meta = rt.meta;
    m.ev = collect_events(rt, t_origin);
    if (m.ev.skipped)
      warnings.push_back("rank " + std::to_string(rt.rank) + ": " + std::to_string(m.ev.skipped) + " spans beyond " +
                         std::to_string(kMaxSpansRead) + " are not read.");
    if (num(rt.meta, "dropped_events") > 0)
      warnings.push_back("rank " + std::to_string(rt.rank) + " dropped " +
                         std::to_string((int64_t)num(rt.meta, "dropped_events")) +
                         " events (the recorder's cap): the end of the run is missing.");
    m.steps = step_table(m.ev);
    models.push_back(std::move(m));
  }
  ranks.clear();

  double t_end = 0;
  for (auto& m : models)
    for (auto& s : m.ev.spans) t_end = std::max(t_end, s.t + s.dur);

  const std::vector<StepWindow> windows = step_windows(models);
  json cuts = shortcuts(windows, models);
  json span_info;
  const std::vector<bool> keep = choose_span_steps(windows, models, cuts, span_info);
  if (!span_info["all"].get<bool>())
    warnings.push_back(std::to_string(windows.size()) + " steps: the timeline keeps the spans of " +
                       std::to_string(span_info["kept"].get<size_t>()) +
                       " of them (the shortcuts' steps, the first " + std::to_string(kFirstStepsKept) +
                       ", then one in every " + std::to_string(span_info["stride"].get<size_t>()) +
                       "; at most " + std::to_string(kSpanBudgetPerRank) +
                       " spans per rank). Every step's traffic and memory are kept; trace.json has every span.");

  json out_ranks = json::array();
  for (auto& m : models) out_ranks.push_back(rank_json(m, span_info["all"].get<bool>() ? std::vector<bool>{} : keep));

  json model = {{"schema", "fsdp-report/1"},
                {"source", path},
                {"world", world},
                {"strategy", meta0.value("strategy", "")},
                {"shard_group_size", meta0.value("shard_group_size", world)},
                {"hosts", meta0.value("hosts", json(nullptr))},
                {"units", units},
                {"param_bytes_per_elem", pb},
                {"reduce_bytes_per_elem", rb},
                {"master_bytes_per_elem", num(meta0, "master_bytes_per_elem", 4)},
                {"optimizer", meta0.value("optimizer", "")},
                {"optimizer_state_per_param", optimizer_state_per_param(meta0)},
                {"model", meta0.value("model", "")},
                {"traffic_lines", lines},
                {"t_end", t_end},
                {"ranks", out_ranks},
                {"shortcuts", cuts},
                {"span_steps", span_info},
                {"warnings", warnings}};
  json rep = replicas.to_json(t_origin);
  if (!rep.is_null()) model["replicas"] = std::move(rep);
  return model;
}

}  // namespace

json analyze(const std::string& path) {
  const auto groups = group_dirs(path);
  ReplicaEvents replicas;
  if (groups.empty()) {
    std::vector<RankTrace> ranks = load(path);
    replicas.add(ranks, -1);
    const double t0 = time_origin(ranks, path);
    return analyze_ranks(std::move(ranks), path, replicas, t0, json::array());
  }
  // A replica-group job: the page's timeline, memory and traffic are one
  // group's (the one with the most steps; each group's folder is a report
  // of its own); participation and heals come from every group.
  std::vector<RankTrace> main;
  int main_group = -1;
  size_t main_steps = 0;
  double t0 = std::numeric_limits<double>::infinity();
  json dirs = json::array();
  for (const auto& [g, dir] : groups) {
    std::vector<RankTrace> ranks = load(dir);
    replicas.add(ranks, g);
    t0 = std::min(t0, time_origin(ranks, dir));
    size_t steps = 0;
    for (const auto& e : ranks.front().events) steps += e.value("cat", "") == "step" && e.value("ph", "") == "X";
    dirs.push_back(dir);
    if (main_group < 0 || steps > main_steps) {
      main = std::move(ranks);
      main_group = g;
      main_steps = steps;
    }
  }
  json model =
      analyze_ranks(std::move(main), path + "/group" + std::to_string(main_group), replicas, t0, json::array());
  if (!model.contains("replicas"))
    model["warnings"].push_back("replica group folders but no \"quorum\" events in them: participation is not drawn");
  model["replica_group"] = main_group;  // whose timeline, memory and traffic the page draws
  model["replica_dirs"] = dirs;
  return model;
}

}  // namespace fsdp::report
