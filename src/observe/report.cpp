// fsdp-cpp: reading a trace into the report's data model (fsdp::report::analyze).
//
// The HTML page only draws; every number it shows is computed here, so tests
// can check the numbers without a browser. The model is compact on purpose:
// a page that embeds a million raw trace events would not open, so spans keep
// six fields and the memory series is downsampled (keeping every local peak's
// bucket maximum, so the highest point survives).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>

#include "fsdp/errors.h"
#include "fsdp/trace.h"

namespace fsdp::report {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxMemoryPoints = 1500;  // per rank; a chart is ~1000 px wide
constexpr size_t kMaxSpansPerRank = 200000;

struct RankTrace {
  int rank = 0;
  json meta = json::object();
  std::vector<json> events;
};

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

json read_json(const std::string& file) {
  std::ifstream in(file);
  FSDP_USER_CHECK(in.good(), "report: cannot open '", file, "'. Expected a trace directory written by --trace ",
                  "or a trace.json file.");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  FSDP_USER_CHECK(j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array(), "report: '", file,
                  "' is not a Chrome trace (expected a JSON object with a traceEvents array). ",
                  "Was the run interrupted before fsdp::trace::stop()?");
  return j;
}

std::vector<RankTrace> load(const std::string& path) {
  std::vector<RankTrace> ranks;
  if (is_dir(path)) {
    std::vector<std::pair<int, std::string>> files;
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n.rfind("trace-rank", 0) == 0 && n.size() > 15 && n.substr(n.size() - 5) == ".json") {
          std::string num = n.substr(10, n.size() - 15);
          if (!num.empty() && std::all_of(num.begin(), num.end(), ::isdigit))
            files.emplace_back(std::stoi(num), path + "/" + n);
        }
      }
      ::closedir(d);
    }
    std::sort(files.begin(), files.end());
    if (files.empty() && !is_dir(path + "/trace.json")) {
      std::ifstream probe(path + "/trace.json");
      if (probe.good()) return load(path + "/trace.json");
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
  if (padded_total > 0) {
    lines["P_bytes"] = padded_total * pb;
    lines["full_3p"] = frac * padded_total * (2 * pb + rb);
    lines["grad_op_2p"] = frac * padded_total * (pb + rb);
    lines["ddp_2p"] = 2 * frac * padded_total * rb;
    // HYBRID: the units are padded over the shard group of S; per rank
    // (S-1)/S x 3P (ZERO2: 2P) inside it, 2 (R-1)/R x P/S across replicas.
    const int S = meta0.value("shard_group_size", world);
    const std::string strategy = meta0.value("strategy", "");
    if (S > 0 && S < world && strategy.rfind("HYBRID_SHARD", 0) == 0) {
      const double in = double(S - 1) / S, R = double(world) / S;
      lines["hybrid_intra"] = in * padded_total * (strategy == "HYBRID_SHARD" ? 2 * pb + rb : pb + rb);
      lines["hybrid_inter"] = 2 * (R - 1) / R * padded_total / S * rb;
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

// One rank's events sorted into what the page draws and what the step table needs.
struct RankEvents {
  json spans = json::array(), memory_raw = json::array(), ckpt = json::array();
  std::map<int, std::string> thread_names;
  struct StepSpan { double t0, t1; json args; };
  std::vector<StepSpan> step_spans;
  struct Comm { double t; std::string name; double bytes, inter; };
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
      if (cat == "comm") r.comms.push_back({t, name, bytes, num(args, "inter_host_bytes")});
      if (cat == "ckpt")
        r.ckpt.push_back({{"t", t}, {"dur", dur}, {"name", name}, {"path", str(args, "path")},
                          {"bytes", bytes}, {"step", args.value("step", json(nullptr))}});
      if (kept < kMaxSpansPerRank) {
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
  for (size_t i = 0; i < r.step_spans.size(); ++i) {
    auto& s = r.step_spans[i];
    double ag = 0, rs = 0, ar = 0, other = 0, inter = 0;
    int n_ag = 0, n_rs = 0, n_ar = 0;
    for (auto& c : r.comms) {
      if (c.t < s.t0 || c.t > s.t1) continue;
      inter += c.inter;
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

json analyze_rank(const RankTrace& rt, double t_origin, json& warnings) {
  RankEvents r = collect_events(rt, t_origin);
  if (r.skipped)
    warnings.push_back("rank " + std::to_string(rt.rank) + ": " + std::to_string(r.skipped) +
                       " spans beyond " + std::to_string(kMaxSpansPerRank) + " are not drawn.");
  if (num(rt.meta, "dropped_events") > 0)
    warnings.push_back("rank " + std::to_string(rt.rank) + " dropped " +
                       std::to_string((int64_t)num(rt.meta, "dropped_events")) +
                       " events (the recorder's cap): the end of the run is missing.");
  json steps = step_table(r);
  json memory = downsample_memory(std::move(r.memory_raw));
  json tn = json::object();
  for (auto& [tid, n] : r.thread_names) tn[std::to_string(tid)] = n;
  return {{"rank", rt.rank}, {"meta", rt.meta}, {"spans", std::move(r.spans)},
          {"memory", std::move(memory)}, {"steps", std::move(steps)},
          {"ckpt", std::move(r.ckpt)}, {"peak", std::max(r.peak, r.peak_counter)}, {"cached_peak", r.cached_peak},
          {"peak_current", r.peak}, {"threads", tn}};
}

}  // namespace

// load -> time origin -> run-wide facts (rank 0's metadata: every rank
// writes the same) -> each rank -> the model the page draws.
json analyze(const std::string& path) {
  std::vector<RankTrace> ranks = load(path);
  json warnings = json::array();
  const double t_origin = time_origin(ranks, path);

  const json& meta0 = ranks.front().meta;
  int world = meta0.value("world", static_cast<int>(ranks.size()));
  json units = meta0.value("units", json::array());
  double pb = num(meta0, "param_bytes_per_elem", 4);
  double rb = num(meta0, "reduce_bytes_per_elem", pb);
  json lines = traffic_lines(meta0, world, pb, rb, warnings);
  if (units.empty()) warnings.push_back("no \"units\" metadata: the shard map cannot be drawn.");
  if ((int)ranks.size() != world)
    warnings.push_back("found " + std::to_string(ranks.size()) + " rank file(s) for world size " +
                       std::to_string(world) + ": a rank did not write its trace.");

  json out_ranks = json::array();
  for (auto& rt : ranks) out_ranks.push_back(analyze_rank(rt, t_origin, warnings));

  double t_end = 0;
  for (auto& r : out_ranks)
    for (auto& s : r["spans"]) t_end = std::max(t_end, s[0].get<double>() + s[1].get<double>());

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
                {"optimizer_state_per_param", meta0.value("optimizer_state_per_param", json(nullptr))},
                {"model", meta0.value("model", "")},
                {"traffic_lines", lines},
                {"t_end", t_end},
                {"ranks", out_ranks},
                {"warnings", warnings}};
  return model;
}

}  // namespace fsdp::report
