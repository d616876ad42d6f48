// Tests of `fsdp report`: the analysis (numbers) on a synthetic trace that
// follows the schema of include/fsdp/trace.h, the HTML's self-containment,
// and the page in a real headless browser (Debian's chromium).
//
// The synthetic trace is what the engine will write: 3 ranks, a GPT-like
// model (root + 4 blocks, d=64) under FULL_SHARD, 4 steps with all-gathers
// on the communication thread, forward/backward on the compute thread,
// reduce-scatters, the optimizer, memory samples and a checkpoint save.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <chrono>

#include "fsdp/errors.h"
#include "fsdp/trace.h"
#include "test_util.h"

namespace FSDP_TEST_ID {

using json = nlohmann::json;

constexpr int kWorld = 3, kSteps = 4, kLayers = 4, kDim = 64, kVocab = 256, kSeq = 32;

json param(const std::string& name, std::vector<int64_t> shape, int64_t& offset) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  json p = {{"name", name}, {"shape", shape}, {"offset", offset}, {"numel", n}};
  offset += n;
  return p;
}

json unit(int index, const std::string& name, json params, int world) {
  int64_t numel = 0;
  for (auto& p : params) numel += p["numel"].get<int64_t>();
  int64_t padded = (numel + world - 1) / world * world;
  return {{"index", index},
          {"name", name},
          {"numel", numel},
          {"padded_numel", padded},
          {"shard_numel", padded / world},
          {"unsharded_bytes", padded * 4},
          {"shard_bytes", padded / world * 4},
          {"params", params}};
}

// GPT-mini's units under --wrap block (root = tok, pos, ln, head).
json synthetic_units(int world) {
  const int64_t d = kDim;
  json units = json::array();
  int64_t off = 0;
  json root = json::array();
  root.push_back(param("tok.weight", {kVocab, d}, off));
  root.push_back(param("pos.weight", {kSeq, d}, off));
  root.push_back(param("ln.weight", {d}, off));
  root.push_back(param("ln.bias", {d}, off));
  root.push_back(param("head.weight", {kVocab, d}, off));
  root.push_back(param("head.bias", {kVocab}, off));
  units.push_back(unit(0, "", root, world));
  for (int i = 0; i < kLayers; ++i) {
    std::string p = "blocks." + std::to_string(i) + ".";
    json ps = json::array();
    off = 0;
    ps.push_back(param(p + "ln1.weight", {d}, off));
    ps.push_back(param(p + "ln1.bias", {d}, off));
    ps.push_back(param(p + "qkv.weight", {3 * d, d}, off));
    ps.push_back(param(p + "qkv.bias", {3 * d}, off));
    ps.push_back(param(p + "proj.weight", {d, d}, off));
    ps.push_back(param(p + "proj.bias", {d}, off));
    ps.push_back(param(p + "ln2.weight", {d}, off));
    ps.push_back(param(p + "ln2.bias", {d}, off));
    ps.push_back(param(p + "fc.weight", {4 * d, d}, off));
    ps.push_back(param(p + "fc.bias", {4 * d}, off));
    ps.push_back(param(p + "out.weight", {d, 4 * d}, off));
    ps.push_back(param(p + "out.bias", {d}, off));
    units.push_back(unit(i + 1, "blocks." + std::to_string(i), ps, world));
  }
  return units;
}

int64_t padded_total(const json& units) {
  int64_t n = 0;
  for (auto& u : units) n += u["padded_numel"].get<int64_t>();
  return n;
}

struct RankWriter {
  int rank;
  json events = json::array();
  int64_t mem = 0, peak = 0;
  void span(int tid, const std::string& name, const std::string& cat, double ts, double dur, json args = json::object()) {
    events.push_back({{"ph", "X"}, {"pid", rank}, {"tid", tid}, {"ts", ts}, {"dur", dur}, {"name", name},
                      {"cat", cat}, {"args", args}});
  }
  void memory(double ts, int64_t delta) {
    mem += delta;
    peak = std::max(peak, mem);
    json args = {{"current", mem}, {"peak", peak}};
    if (rank == 0) args["cached"] = peak - mem;  // rank 0's allocator keeps what was freed
    events.push_back({{"ph", "C"}, {"pid", rank}, {"tid", 0}, {"ts", ts}, {"name", "memory"}, {"args", args}});
  }
};

// What a synthetic run does beyond kSteps steps with a save after step 2.
struct RunShape {
  int steps = kSteps;
  int save_every = 0;   // > 0: a save after every save_every-th step too
  int slow_step = -1;   // this step's optimizer takes 40 ms longer
  int load_before = -1; // a checkpoint load just before this step (a restart)
  double grid_us = 0;    // > 0: steps start together on every rank, this far apart at least
                         // (the collectives keep a real run's ranks in step)
};

// Writes DIR/trace-rank<R>.json for every rank; returns the units metadata.
json write_synthetic_trace(const std::string& dir, int world = kWorld, RunShape shape = {}) {
  ::mkdir(dir.c_str(), 0755);
  json units = synthetic_units(world);
  const int64_t Np = padded_total(units);
  const int64_t rest = 4 * Np / world * 4;  // P + G + 2P (Adam), fp32 shards
  int64_t p_block = 0;
  std::string p_block_unit;
  for (auto& u : units)
    if (u["unsharded_bytes"].get<int64_t>() > p_block) {
      p_block = u["unsharded_bytes"];
      p_block_unit = u["name"];
    }
  const int64_t act_per_block = 16 * 8 * kSeq * kDim * 4 + 8 * 4 * kSeq * kSeq * 4;  // B=8
  const int64_t A = kLayers * act_per_block;
  for (int r = 0; r < world; ++r) {
    RankWriter w{r};
    const double us_per_byte = 1e-3;  // 1 GB/s
    double t = 1.7e15 + 250 * r;      // wall-clock microseconds, ranks slightly apart
    w.memory(t, rest);
    auto ag = [&](const json& u, double at, const char* phase) {
      int64_t bytes = (world - 1) * u["shard_numel"].get<int64_t>() * 4;
      double dur = 60 + bytes * us_per_byte;
      w.span(1, "all_gather", "comm", at, dur, {{"unit", u["name"]}, {"bytes", bytes}, {"phase", phase}});
      return at + dur;
    };
    auto rs = [&](const json& u, double at) {
      int64_t bytes = (world - 1) * u["shard_numel"].get<int64_t>() * 4;
      double dur = 80 + bytes * us_per_byte;
      w.span(1, "reduce_scatter", "comm", at, dur, {{"unit", u["name"]}, {"bytes", bytes}});
      return at + dur;
    };
    double grid = t;
    for (int s = 0; s < shape.steps; ++s) {
      if (shape.grid_us > 0) t = std::max(t, grid);
      if (s == shape.load_before) {
        w.span(0, "load", "ckpt", t, 3000, {{"path", "ckpt/step-1500"}, {"bytes", rest}, {"step", 1500}});
        t += 3200;
      }
      double step0 = t;
      // forward: root gathered first and kept until its own forward ends
      t = ag(units[0], t, "forward");
      w.memory(t, units[0]["unsharded_bytes"].get<int64_t>());
      double root_fwd0 = t;
      for (int i = 1; i <= kLayers; ++i) {
        t = ag(units[i], t, "forward");
        w.memory(t, units[i]["unsharded_bytes"].get<int64_t>());
        double dur = 1800 + 40 * r;
        w.span(0, "forward", "forward", t, dur, {{"unit", units[i]["name"]}});
        t += dur;
        w.memory(t, act_per_block - units[i]["unsharded_bytes"].get<int64_t>());
      }
      w.span(0, "forward", "forward", root_fwd0, t + 300 - root_fwd0, {{"unit", ""}});
      t += 300;
      w.memory(t, -units[0]["unsharded_bytes"].get<int64_t>());
      // backward: root's head first, then blocks in reverse
      t = ag(units[0], t, "backward");
      w.memory(t, 2 * units[0]["unsharded_bytes"].get<int64_t>());
      double root_bwd0 = t;
      t += 400;
      double comm_free = t;
      for (int i = kLayers; i >= 1; --i) {
        t = ag(units[i], std::max(t, comm_free), "backward");
        w.memory(t, 2 * units[i]["unsharded_bytes"].get<int64_t>());
        double dur = 3300 + 60 * r;
        w.span(0, "backward", "backward", t, dur, {{"unit", units[i]["name"]}});
        t += dur;
        w.memory(t, -act_per_block - units[i]["unsharded_bytes"].get<int64_t>());
        comm_free = rs(units[i], t);
        w.memory(comm_free, -units[i]["unsharded_bytes"].get<int64_t>());
      }
      w.span(0, "backward", "backward", root_bwd0, t + 200 - root_bwd0, {{"unit", ""}});
      t += 200;
      t = rs(units[0], std::max(t, comm_free));
      w.memory(t, -2 * units[0]["unsharded_bytes"].get<int64_t>());
      const double opt = s == shape.slow_step ? 41500 : 1500;
      w.span(0, "optimizer_step", "optim", t, opt);
      t += opt;
      w.span(0, "step", "step", step0, t - step0, {{"step", s}, {"loss", 5.5 - 0.4 * s}});
      t += 200;
      if (s == 2 || (shape.save_every > 0 && (s + 1) % shape.save_every == 0)) {
        const std::string at = std::to_string(s + 1);
        w.span(0, "save", "ckpt", t, 5000 + 300 * r,
               {{"path", "ckpt/step-" + at + "/rank" + std::to_string(r) + ".safetensors"}, {"bytes", rest},
                {"step", s + 1}});
        t += 5600;
      }
      grid = std::max(grid + shape.grid_us, t);
    }
    json meta = {{"schema", "fsdp-trace/1"},
                 {"rank", r},
                 {"world", world},
                 {"dropped_events", 0},
                 {"strategy", "FULL_SHARD"},
                 {"param_dtype", "fp32"},
                 {"param_bytes_per_elem", 4},
                 {"master_bytes_per_elem", 4},
                 {"reduce_bytes_per_elem", 4},
                 {"optimizer", "adamw"},
                 {"optimizer_state_per_param", 2},
                 {"model", "gpt L=4 d=64 V=256 T=32 (synthetic)"},
                 {"units", units},
                 {"ledger",
                  {{"P_full", Np * 4},
                   {"P", Np / world * 4},
                   {"G", Np / world * 4},
                   {"O", 2 * Np / world * 4},
                   {"P_block", p_block},
                   {"P_block_unit", p_block_unit},
                   {"A", A},
                   {"predicted_rest", rest},
                   {"predicted_peak", rest + 2 * p_block + A}}},
                 // VmHWM's parts (memory::ProcessMemory): rank r's VmHWM is (300 + r) MiB.
                 {"process_memory",
                  {{"vmhwm", (300 + r) << 20},
                   {"at_start", 110 << 20},
                   {"code_since", 20 << 20},
                   {"tensors", (120 + r) << 20},
                   {"comm", 1 << 20},
                   {"cache", 40 << 20},
                   {"malloc_used", 6 << 20},
                   {"malloc_free", 1 << 20},
                   {"unexplained", 2 << 20},
                   {"sample", (300 + r) << 20},
                   {"elsewhere", 0},
                   {"comm_high", 2 << 20}}}};
    json file = {{"traceEvents", w.events}, {"displayTimeUnit", "ms"}, {"otherData", meta}};
    file["traceEvents"].push_back({{"ph", "M"}, {"pid", r}, {"tid", 1}, {"name", "thread_name"},
                                   {"args", {{"name", "comm"}}}});
    std::ofstream(dir + "/trace-rank" + std::to_string(r) + ".json") << file.dump();
  }
  return units;
}

std::string fresh_dir(const std::string& tag) {
  return fsdp::testing::temp_dir("report-" + tag);
}

using fsdp::testing::slurp;

TEST(Report, AnalyzeSyntheticTraceTrafficStepsCheckpoints) {
  std::string dir = fresh_dir("analyze");
  json units = write_synthetic_trace(dir);
  json m = fsdp::report::analyze(dir);
  EXPECT_EQ(m["world"], kWorld);
  EXPECT_EQ(m["strategy"], "FULL_SHARD");
  ASSERT_EQ(m["ranks"].size(), (size_t)kWorld);
  EXPECT_TRUE(m["warnings"].empty()) << m["warnings"].dump();
  const double Np = padded_total(units);
  const double full = 3.0 * (kWorld - 1) / kWorld * Np * 4;
  EXPECT_DOUBLE_EQ(m["traffic_lines"]["full_3p"].get<double>(), full);
  EXPECT_DOUBLE_EQ(m["traffic_lines"]["grad_op_2p"].get<double>(), 2.0 * (kWorld - 1) / kWorld * Np * 4);
  for (auto& r : m["ranks"]) {
    ASSERT_EQ(r["steps"].size(), (size_t)kSteps);
    for (auto& s : r["steps"]) {
      // every unit gathered twice and reduce-scattered once: exactly 3P(N-1)/N
      EXPECT_DOUBLE_EQ(s["total_bytes"].get<double>(), full);
      EXPECT_EQ(s["n_ag"], 2 * (kLayers + 1));
      EXPECT_EQ(s["n_rs"], kLayers + 1);
      EXPECT_GT(s["peak_mem"].get<double>(), 0);
    }
    EXPECT_EQ(r["steps"][1]["loss"], 5.1);
    ASSERT_EQ(r["ckpt"].size(), 1u);
    EXPECT_EQ(r["ckpt"][0]["name"], "save");
    EXPECT_EQ(r["ckpt"][0]["step"], 3);
    EXPECT_GT(r["peak"].get<double>(), r["meta"]["ledger"]["predicted_rest"].get<double>());
    EXPECT_EQ(r["threads"]["1"], "comm");
  }
  // times start at 0 (the earliest event of any rank)
  EXPECT_DOUBLE_EQ(m["ranks"][0]["memory"][0][0].get<double>(), 0.0);
}

// The allocator's cache is drawn beside the held bytes: each memory sample
// carries it as its fourth value, and the rank its largest.
TEST(Report, MemorySamplesCarryTheAllocatorsCache) {
  std::string dir = fresh_dir("cached");
  json units = write_synthetic_trace(dir);
  // Rewrite rank 0's memory counters with a cache that grows 1000 bytes a sample.
  const std::string f = dir + "/trace-rank0.json";
  json t = json::parse(slurp(f));
  int64_t cached = 0, samples = 0;
  for (auto& e : t["traceEvents"])
    if (e["ph"] == "C" && e["name"] == "memory") e["args"]["cached"] = (cached += 1000), ++samples;
  std::ofstream(f) << t.dump();
  json m = fsdp::report::analyze(dir);
  ASSERT_GT(samples, 2);
  auto& mem = m["ranks"][0]["memory"];
  ASSERT_GT(mem.size(), 2u);
  ASSERT_EQ(mem[0].size(), 4u) << mem[0].dump();
  EXPECT_EQ(mem[0][3].get<double>(), 1000.0);
  EXPECT_EQ(m["ranks"][0]["cached_peak"].get<double>(), double(cached));
  EXPECT_EQ(m["ranks"][1]["cached_peak"].get<double>(), 0.0) << "rank 1's trace has no cached field";
}

TEST(Report, MergedTraceGivesTheSameNumbers) {
  std::string dir = fresh_dir("merged");
  write_synthetic_trace(dir);
  json a = fsdp::report::analyze(dir);
  std::string merged = fsdp::trace::merge(dir);
  json b = fsdp::report::analyze(merged);
  ASSERT_EQ(b["ranks"].size(), a["ranks"].size());
  for (size_t r = 0; r < a["ranks"].size(); ++r) {
    EXPECT_EQ(b["ranks"][r]["steps"], a["ranks"][r]["steps"]);
    EXPECT_EQ(b["ranks"][r]["meta"]["ledger"], a["ranks"][r]["meta"]["ledger"]);
  }
  EXPECT_EQ(b["units"], a["units"]);
}

TEST(Report, MissingRankAndMetadataBecomeWarnings) {
  std::string dir = fresh_dir("partial");
  write_synthetic_trace(dir);
  EXPECT_EQ(fsdp::report::analyze(dir)["optimizer_state_per_param"], 2) << "as the trace recorded it";
  // A trace without what the optimizer keeps: the report says so, it assumes no optimizer.
  for (int r = 0; r < 4; ++r) {
    const std::string f = dir + "/trace-rank" + std::to_string(r) + ".json";
    if (!std::ifstream(f)) continue;
    json t = json::parse(slurp(f));
    t["otherData"].erase("optimizer_state_per_param");
    std::ofstream(f) << t.dump();
  }
  EXPECT_TRUE(fsdp::report::analyze(dir)["optimizer_state_per_param"].is_null());
  std::remove((dir + "/trace-rank2.json").c_str());
  json m = fsdp::report::analyze(dir);
  ASSERT_FALSE(m["warnings"].empty());
  EXPECT_NE(m["warnings"][0].get<std::string>().find("did not write"), std::string::npos);
  EXPECT_THROW(fsdp::report::analyze(dir + "/nope"), fsdp::Error);
}

TEST(Report, HtmlIsSelfContainedAndEscapesData) {
  std::string dir = fresh_dir("html");
  write_synthetic_trace(dir);
  json m = fsdp::report::analyze(dir);
  m["model"] = "evil </script><script>alert(1)</script>";
  std::string out = dir + "/report.html";
  int64_t n = fsdp::report::write_html(m, out);
  std::string page = slurp(out);
  EXPECT_EQ((int64_t)page.size(), n);
  // Nothing is loaded from elsewhere; the only URL is the SVG namespace name.
  EXPECT_EQ(page.find("<script src"), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  EXPECT_EQ(page.find("@import"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  size_t http = page.find("http://");
  while (http != std::string::npos) {
    EXPECT_EQ(page.compare(http, 26, "http://www.w3.org/2000/svg"), 0) << page.substr(http, 60);
    http = page.find("http://", http + 1);
  }
  // The data cannot close its <script> block.
  EXPECT_EQ(page.find("</script><script>alert"), std::string::npos);
  EXPECT_NE(page.find("\\u003c/script>"), std::string::npos);
}

TEST(Report, CommandWritesPageAndMergedTrace) {
  std::string dir = fresh_dir("cmd");
  write_synthetic_trace(dir);
  auto r = fsdp::testing::run_command({fsdp::testing::bin_path("fsdp"), "report", dir, "-o", dir + "/r.html"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3 rank(s), 4 step(s), 5 unit(s)"), std::string::npos) << r.output;
  struct stat st;
  EXPECT_EQ(::stat((dir + "/r.html").c_str(), &st), 0);
  EXPECT_EQ(::stat((dir + "/trace.json").c_str(), &st), 0);
  auto bad = fsdp::testing::run_command({fsdp::testing::bin_path("fsdp"), "report", dir + "/missing"});
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("--trace"), std::string::npos) << bad.output;
}

// Debian's chromium, headless, quiet, its profile in `profile`, a 1400x1000
// window: the command line both browser tests start it with. Without it the
// test is skipped and says so.
constexpr const char* kChromium = "/usr/bin/chromium";
#define FSDP_SKIP_WITHOUT_CHROMIUM()                                                \
  if (::access(kChromium, X_OK) != 0)                                               \
  GTEST_SKIP() << "headless browser test skipped: " << kChromium                    \
               << " not found (install Debian's chromium: apt-get install chromium; make deps does it)"

std::vector<std::string> headless_chromium(const std::string& profile) {
  return {kChromium,         "--headless",     "--no-sandbox",
          "--disable-gpu",   "--disable-quic", "--no-first-run",
          "--disable-background-networking",   "--disable-component-update",
          "--disable-sync",  "--hide-scrollbars", "--user-data-dir=" + profile,
          "--window-size=1400,1000"};
}

// The page in a real browser: JS runs without errors, the DOM holds the rank
// columns and unit names, and the screenshot is not blank. The artifacts stay
// in the build folder (report-test/) for a person to look at.
TEST(Report, HeadlessChromiumRendersTheReport) {
  FSDP_SKIP_WITHOUT_CHROMIUM();
  std::string out = std::string(FSDP_BIN_DIR) + "/../report-test";
  std::system(("rm -rf '" + out + "' && mkdir -p '" + out + "'").c_str());
  write_synthetic_trace(out);
  fsdp::report::write_html(fsdp::report::analyze(out), out + "/report.html", "fsdp-cpp report (synthetic trace)");
  std::string profile = out + "/chromium-profile";
  const std::vector<std::string> flags = headless_chromium(profile);
  std::string url = "file://" + out + "/report.html";

  auto dom_args = flags;
  dom_args.push_back("--dump-dom");
  dom_args.push_back(url);
  auto dom = fsdp::testing::run_command(dom_args, {}, 120);
  ASSERT_EQ(dom.exit_code, 0) << dom.output;
  std::ofstream(out + "/dom.html") << dom.output;
  EXPECT_NE(dom.output.find("data-rendered=\"ok\""), std::string::npos)
      << "the page's script did not finish; its errors: " << dom.output.substr(0, 4000);
  EXPECT_NE(dom.output.find("<pre id=\"fsdp-errors\"></pre>"), std::string::npos)
      << "script errors were reported in #fsdp-errors";
  for (int r = 0; r < kWorld; ++r)
    EXPECT_NE(dom.output.find("data-rank-col=\"G" + std::to_string(r) + "\""), std::string::npos) << "G" << r;
  for (auto name : {"blocks.0", "blocks.3", "&lt;root&gt;"})
    EXPECT_NE(dom.output.find(name), std::string::npos) << name;
  EXPECT_NE(dom.output.find("blocks.2.qkv.weight"), std::string::npos) << "per-parameter hover titles";
  EXPECT_NE(dom.output.find("ckpt/step-3/rank1.safetensors"), std::string::npos) << "checkpoint table";
  EXPECT_NE(dom.output.find("class=\"cached-line\""), std::string::npos) << "rank 0's held + cached line";
  EXPECT_NE(dom.output.find("dotted: held + cached by the allocator"), std::string::npos) << "its legend";
  // VmHWM's parts: a table with a row and a bar per rank.
  EXPECT_NE(dom.output.find("id=\"process-memory-table\""), std::string::npos) << "the process memory table";
  size_t bars = 0;
  for (size_t at = dom.output.find("aria-label=\"VmHWM parts\""); at != std::string::npos;
       at = dom.output.find("aria-label=\"VmHWM parts\"", at + 1))
    ++bars;
  EXPECT_EQ(bars, size_t(kWorld)) << "one bar of VmHWM's parts per rank";
  for (int r = 0; r < kWorld; ++r)
    EXPECT_NE(dom.output.find(std::to_string(300 + r) + ".0 MiB"), std::string::npos) << "rank " << r << "'s VmHWM";
  EXPECT_NE(dom.output.find("malloc free"), std::string::npos) << "the parts' legend";

  auto shot_args = flags;
  shot_args.push_back("--screenshot=" + out + "/report.png");
  shot_args.push_back(url);
  auto shot = fsdp::testing::run_command(shot_args, {}, 120);
  ASSERT_EQ(shot.exit_code, 0) << shot.output;
  auto stats = fsdp::testing::run_command(
      {"/usr/bin/env", "python3", fsdp::testing::source_path("tests/browser/png_stats.py"), out + "/report.png"}, {}, 120);
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  double nonblank = -1;
  int w = 0, h = 0, colors = 0;
  ASSERT_EQ(std::sscanf(stats.output.c_str(), "width=%d height=%d nonblank=%lf colors=%d", &w, &h, &nonblank, &colors),
            4)
      << stats.output;
  EXPECT_EQ(w, 1400);
  EXPECT_EQ(h, 1000);
  EXPECT_GT(nonblank, 0.15) << "screenshot is mostly one colour: " << stats.output;
  EXPECT_GT(colors, 50) << stats.output;
  std::system(("rm -rf '" + profile + "'").c_str());
}

// A long run (3,000 steps, 2 ranks, a save every 1,000 steps and after step 2,
// one slow step, a restart): the analysis picks the shortcuts a user looks
// for and keeps the timeline's spans within the budget, the page stays small
// and draws a picker of one line.
constexpr int kLongSteps = 3000, kSlow = 1234, kRestart = 2000;

std::string long_run(const std::string& dir) {
  write_synthetic_trace(dir, 2, RunShape{kLongSteps, 1000, kSlow, kRestart, 30000});
  return dir;
}

TEST(Report, LongRunShortcutsAndSpanBudget) {
  std::string dir = long_run(fresh_dir("long"));
  json m = fsdp::report::analyze(dir);
  ASSERT_EQ(m["ranks"].size(), 2u);
  for (auto& r : m["ranks"]) ASSERT_EQ(r["steps"].size(), (size_t)kLongSteps);
  // Shortcuts: the slow step first, the checkpoints' neighbours, the restart.
  const json& cuts = m["shortcuts"];
  ASSERT_FALSE(cuts.empty());
  EXPECT_EQ(cuts[0]["kind"], "slowest");
  EXPECT_EQ(cuts[0]["index"], kSlow);
  EXPECT_NE(cuts[0]["label"].get<std::string>().find("step 1234 · "), std::string::npos) << cuts[0].dump();
  int slowest = 0, around = 0, restarts = 0;
  std::set<int> around_idx;
  for (auto& c : cuts) {
    const std::string k = c["kind"];
    if (k == "slowest") ++slowest;
    if (k == "checkpoint") ++around, around_idx.insert(c["index"].get<int>());
    if (k == "restart") {
      ++restarts;
      EXPECT_EQ(c["index"], kRestart) << c.dump();
    }
  }
  EXPECT_EQ(slowest, 1) << "the other steps take the median's time: not shortcuts";
  EXPECT_EQ(restarts, 1);
  // 4 saves (after steps 2, 999, 1999, 2999): the first, the last and the
  // longest between them (every save lasts as long: the first of them), each
  // with the step before and after (none after the last).
  EXPECT_EQ(around, 5) << cuts.dump();
  for (int i : {2, 3, 999, 1000, 2999}) EXPECT_TRUE(around_idx.count(i)) << i << " " << cuts.dump();
  // The spans: at most the budget per rank, the shortcuts' steps among those kept.
  const json& info = m["span_steps"];
  EXPECT_FALSE(info["all"].get<bool>());
  EXPECT_EQ(info["steps"], kLongSteps);
  EXPECT_LT(info["kept"].get<int>(), kLongSteps);
  EXPECT_GT(info["kept"].get<int>(), 100);
  bool warned = false;
  for (auto& w : m["warnings"]) warned = warned || w.get<std::string>().find("the timeline keeps the spans of") != std::string::npos;
  EXPECT_TRUE(warned) << m["warnings"].dump();
  for (auto& r : m["ranks"]) {
    EXPECT_LE(r["spans"].size(), info["budget"].get<size_t>());
    int dropped = 0;
    for (auto& st : r["steps"]) dropped += st.contains("spans") && st["spans"] == false;
    EXPECT_EQ(dropped, kLongSteps - info["kept"].get<int>());
    for (auto& c : cuts) EXPECT_FALSE(r["steps"][c["index"].get<int>()].contains("spans")) << c.dump();
    // The slow step's spans are there: its 40 ms optimizer span.
    const double t0 = r["steps"][kSlow]["t0"], t1 = r["steps"][kSlow]["t1"];
    int in_slow = 0;
    for (auto& sp : r["spans"]) in_slow += sp[0].get<double>() >= t0 && sp[0].get<double>() <= t1;
    EXPECT_GT(in_slow, 20);
    // Every step's traffic is still counted.
    for (auto& st : r["steps"]) ASSERT_GT(st["total_bytes"].get<double>(), 0);
  }
}

// The page of that run in a real browser: the picker is one line (6 controls,
// 3 of them buttons), the shortcuts are few, the page and its load time are
// bounded; #step=1234 opens the slow step.
TEST(Report, HeadlessChromiumLongRunPicker) {
  FSDP_SKIP_WITHOUT_CHROMIUM();
  std::string out = std::string(FSDP_BIN_DIR) + "/../report-test-long";
  std::system(("rm -rf '" + out + "' && mkdir -p '" + out + "'").c_str());
  long_run(out);
  auto t0 = std::chrono::steady_clock::now();
  auto r = fsdp::testing::run_command({fsdp::testing::bin_path("fsdp"), "report", out, "-o", out + "/report.html"}, {}, 300);
  const double analyze_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  struct stat st;
  ASSERT_EQ(::stat((out + "/report.html").c_str(), &st), 0);
  const double page_mib = st.st_size / 1048576.0;
  EXPECT_LT(page_mib, 12.0) << "the page of a 3,000-step run";

  std::string profile = out + "/chromium-profile";
  const std::vector<std::string> flags = headless_chromium(profile);
  auto dom_of = [&](const std::string& hash) {
    auto args = flags;
    args.push_back("--dump-dom");
    args.push_back("file://" + out + "/report.html" + hash);
    auto d = fsdp::testing::run_command(args, {}, 180);
    EXPECT_EQ(d.exit_code, 0) << d.output.substr(0, 2000);
    return d.output;
  };
  auto t1 = std::chrono::steady_clock::now();
  const std::string dom = dom_of("");
  const double browser_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::ofstream(out + "/dom.html") << dom;
  ASSERT_NE(dom.find("data-rendered=\"ok\""), std::string::npos) << "the page's script did not finish: "
                                                                 << dom.substr(0, 4000);
  int render_ms = -1;
  auto at = dom.find("data-render-ms=\"");
  ASSERT_NE(at, std::string::npos);
  render_ms = std::atoi(dom.c_str() + at + 16);
  EXPECT_GE(render_ms, 0);
  EXPECT_LT(render_ms, 20000) << "the page's own load and render time";
  auto count = [](const std::string& hay, const std::string& needle) {
    int n = 0;
    for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
    return n;
  };
  // The picker: one line of six controls whatever the length.
  const auto picker_at = dom.find("id=\"step-picker\"");
  ASSERT_NE(picker_at, std::string::npos);
  const std::string picker = dom.substr(picker_at, dom.find("id=\"step-shortcuts\"") - picker_at);
  EXPECT_EQ(count(picker, "data-pick=\""), 6) << picker;
  EXPECT_EQ(count(picker, "<button"), 3) << picker;
  EXPECT_NE(picker.find("step 1 (2 of 3000)"), std::string::npos) << picker;
  // Shortcuts: the slow step + 5 around checkpoints + 1 restart.
  EXPECT_EQ(count(dom, "data-shortcut=\"slowest\""), 1);
  EXPECT_EQ(count(dom, "data-shortcut=\"checkpoint\""), 5);
  EXPECT_EQ(count(dom, "data-shortcut=\"restart\""), 1);
  EXPECT_NE(dom.find("\">step 1234 · "), std::string::npos) << "the slow step's shortcut";
  EXPECT_LT(count(dom, "<button"), 20) << "no button per step";
  EXPECT_LT(count(dom, "<rect"), 20000) << "the charts draw a bounded number of shapes";
  // #step=1234 opens the slow step; a step whose spans were left out says so.
  const std::string slow = dom_of("#step=1234");
  EXPECT_NE(slow.find("step 1234 (1235 of 3000)"), std::string::npos);
  // (the script's own text holds the note's words: look in the note element)
  EXPECT_NE(slow.find("id=\"step-note\"></div>"), std::string::npos) << "no note for a kept step";
  json m = fsdp::report::analyze(out);
  int dropped = -1;
  for (auto& st : m["ranks"][0]["steps"])
    if (st.contains("spans")) {
      dropped = st["step"].get<int>();
      break;
    }
  ASSERT_GE(dropped, 0);
  const std::string left_out = dom_of("#step=" + std::to_string(dropped));
  EXPECT_NE(left_out.find("id=\"step-note\">This step's spans are not in the report"), std::string::npos) << dropped;
  const std::string all = dom_of("#all");
  EXPECT_NE(all.find("the whole run: 3000 steps"), std::string::npos);
  EXPECT_NE(all.find("data-merged=\""), std::string::npos) << "the whole run merges sub-pixel spans";
  std::printf("[ long run ] 3000 steps x 2 ranks: fsdp report %.2f s, page %.2f MiB, browser %.2f s "
              "(the page's own load and render: %d ms)\n",
              analyze_s, page_mib, browser_s, render_ms);
  std::system(("rm -rf '" + profile + "'").c_str());
}

// Replica groups (fsdp/replicas.h): DIR/group<g>/trace-rank<R>.json, one
// folder per group. Group 0 took part in all 6 quorums; group 1 in the
// first two (the second dropped), then was lost, restarted (its first
// launch wrote no trace), healed from group 0 before step 3 and took part
// again. Participation comes from every group's view at once.
std::string replica_run(const std::string& dir) {
  struct Q { int64_t id, step; std::vector<int> groups; bool committed; const char* dropped; };
  const std::vector<Q> quorums = {{1, 0, {0, 1}, true, ""},
                                  {2, 1, {0, 1}, false, "no vote from group 1 rank 1 (host h, pid 7)"},
                                  {3, 1, {0}, true, ""},
                                  {4, 2, {0}, true, ""},
                                  {5, 3, {0, 1}, true, ""},
                                  {6, 4, {0, 1}, true, ""}};
  for (int g = 0; g < 2; ++g) {
    const std::string gdir = dir + "/group" + std::to_string(g);
    std::system(("mkdir -p '" + gdir + "'").c_str());
    for (int r = 0; r < 2; ++r) {
      json ev = json::array();
      double ts = 1e9 + 1000 * r;
      for (const auto& q : quorums) {
        const bool member = std::find(q.groups.begin(), q.groups.end(), g) != q.groups.end();
        if (!member || (g == 1 && q.id < 5)) continue;  // group 1's first launch left no trace
        if (g == 1 && q.id == 5)
          ev.push_back({{"ph", "X"}, {"name", "heal"}, {"cat", "ft"}, {"pid", r}, {"tid", 0}, {"ts", ts},
                        {"dur", 30000.0 + 10000 * r},
                        {"args", {{"group", 1}, {"quorum", 5}, {"step", 3}, {"source", 0}, {"receiving", true},
                                  {"bytes", 1000000}, {"wait_ms", 5.0 + r}}}});
        ts += 50000;
        ev.push_back({{"ph", "X"}, {"name", "step"}, {"cat", "step"}, {"pid", r}, {"tid", 0}, {"ts", ts},
                      {"dur", 40000.0}, {"args", {{"step", q.step}}}});
        ev.push_back({{"ph", "i"}, {"name", "quorum"}, {"cat", "ft"}, {"pid", r}, {"tid", 0}, {"ts", ts + 39000},
                      {"s", "t"},
                      {"args", {{"quorum", q.id}, {"step", q.step}, {"groups", q.groups}, {"group", g},
                                {"committed", q.committed}, {"dropped", q.dropped}}}});
        ts += 50000;
      }
      json meta = {{"schema", "fsdp-trace/1"}, {"rank", r}, {"world", 2}, {"strategy", "FULL_SHARD"}};
      std::ofstream(gdir + "/trace-rank" + std::to_string(r) + ".json")
          << json{{"traceEvents", ev}, {"displayTimeUnit", "ms"}, {"otherData", meta}}.dump();
    }
  }
  return dir;
}

TEST(Report, ReplicaGroupsParticipationAndHeals) {
  const std::string dir = replica_run(fresh_dir("replicas"));
  json m = fsdp::report::analyze(dir);
  ASSERT_TRUE(m.contains("replicas")) << m.dump(1).substr(0, 2000);
  EXPECT_EQ(m["replica_group"], 0) << "the timeline is the group with the most steps";
  ASSERT_EQ(m["ranks"].size(), 2u);
  EXPECT_EQ(m["ranks"][0]["steps"].size(), 6u);
  EXPECT_EQ(m["replica_dirs"].size(), 2u);
  const json& rep = m["replicas"];
  ASSERT_EQ(rep["quorums"].size(), 6u);
  EXPECT_EQ(rep["quorums"][1]["committed"], false);
  EXPECT_EQ(rep["quorums"][1]["dropped"], "no vote from group 1 rank 1 (host h, pid 7)");
  EXPECT_EQ(rep["quorums"][2]["groups"], json::array({0}));
  ASSERT_EQ(rep["groups"].size(), 2u);
  const json& g0 = rep["groups"][0];
  const json& g1 = rep["groups"][1];
  EXPECT_EQ(g0["group"], 0);
  EXPECT_EQ(g0["committed"], 5);
  EXPECT_EQ(g0["dropped"], 1);
  EXPECT_EQ(g0["absent"], 0);
  EXPECT_EQ(g1["committed"], 3) << "its first step is known from group 0's trace";
  EXPECT_EQ(g1["dropped"], 1);
  EXPECT_EQ(g1["absent"], 2);
  EXPECT_EQ(g1["heals"], 1);
  ASSERT_EQ(rep["heals"].size(), 1u);
  const json& h = rep["heals"][0];
  EXPECT_EQ(h["group"], 1);
  EXPECT_EQ(h["step"], 3);
  EXPECT_EQ(h["source"], 0);
  EXPECT_EQ(h["sources"], json::array({0}));
  EXPECT_EQ(h["ranks"], 2);
  EXPECT_DOUBLE_EQ(h["dur"].get<double>(), 40.0) << "the slowest rank's";
  EXPECT_DOUBLE_EQ(h["bytes"].get<double>(), 2e6) << "both ranks' bytes";
  EXPECT_DOUBLE_EQ(h["wait"].get<double>(), 6.0) << "the longest wait for the source";
  // One group's folder alone: its own view (group 1's quorums only).
  json one = fsdp::report::analyze(dir + "/group1");
  ASSERT_TRUE(one.contains("replicas"));
  EXPECT_EQ(one["replicas"]["quorums"].size(), 2u);
  EXPECT_FALSE(one.contains("replica_group"));
  // A folder without quorum events has no replica section.
  std::string plain = fresh_dir("plain");
  write_synthetic_trace(plain);
  EXPECT_FALSE(fsdp::report::analyze(plain).contains("replicas"));
}

TEST(Report, HeadlessChromiumDrawsReplicaGroups) {
  FSDP_SKIP_WITHOUT_CHROMIUM();
  std::string out = std::string(FSDP_BIN_DIR) + "/../report-test-replicas";
  std::system(("rm -rf '" + out + "' && mkdir -p '" + out + "'").c_str());
  replica_run(out);
  auto r = fsdp::testing::run_command({fsdp::testing::bin_path("fsdp"), "report", out, "-o", out + "/report.html"},
                                      {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("replica groups: 6 quorum(s), 2 group(s), 1 heal(s) (timeline of group 0)"),
            std::string::npos)
      << r.output;
  std::string profile = out + "/chromium-profile";
  auto args = headless_chromium(profile);
  args.push_back("--dump-dom");
  args.push_back("file://" + out + "/report.html");
  auto dom = fsdp::testing::run_command(args, {}, 120);
  ASSERT_EQ(dom.exit_code, 0) << dom.output.substr(0, 2000);
  std::ofstream(out + "/dom.html") << dom.output;
  ASSERT_NE(dom.output.find("data-rendered=\"ok\""), std::string::npos) << dom.output.substr(0, 4000);
  EXPECT_NE(dom.output.find("<pre id=\"fsdp-errors\"></pre>"), std::string::npos);
  EXPECT_EQ(dom.output.find("id=\"sec-replicas\" hidden"), std::string::npos) << "the section is shown";
  // Group 1's row: committed, dropped, absent (two quorums in one run), committed (two).
  const auto row = dom.output.find("data-replica-row=\"g1\"");
  ASSERT_NE(row, std::string::npos);
  const std::string g1 = dom.output.substr(row, dom.output.find("</g>", row) - row);
  std::vector<std::string> states;
  for (size_t at = g1.find("data-state=\""); at != std::string::npos; at = g1.find("data-state=\"", at + 1))
    states.push_back(g1.substr(at + 12, 1));
  EXPECT_EQ(states, (std::vector<std::string>{"c", "d", "a", "c"})) << g1;
  EXPECT_NE(dom.output.find("data-heal=\"g1\""), std::string::npos) << "the heal's diamond";
  EXPECT_NE(dom.output.find("id=\"replica-table\""), std::string::npos);
  EXPECT_NE(dom.output.find("id=\"heal-table\""), std::string::npos);
  EXPECT_NE(dom.output.find("40.0 ms"), std::string::npos) << "the heal's duration";
  EXPECT_NE(dom.output.find("6.00 ms"), std::string::npos) << "the heal's wait for the source";
  std::system(("rm -rf '" + profile + "'").c_str());
}

// Compressed across hosts (FSDP_COMPRESS=int8 on the tiers, 2 x 2): each
// step says what crossed quantized and what would have crossed, and the
// latter is the uncompressed formula (3 (H-1) shards per rank per step, as
// CommTiers.TraceAndReportSeeTheComposedTiers checks without compression; a
// shard: the padded fp32 elements' bytes over 4 ranks):
// the counters' and the report's figures agree byte for byte.
TEST(Report, CompressedStepsShowTheBytesUncompressedBeside) {
  const std::string dir = fresh_dir("compressed");
  auto r = fsdp::testing::run_ranks(4, "hybrid_traffic", {"full"},
                     {"FSDP_TEST_HOSTS=2", "FSDP_TEST_TRACE=" + dir, "FSDP_COMPRESS=int8"}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = fsdp::testing::lines_with(r.output, "TRAFFIC rank=0 ");
  ASSERT_EQ(lines.size(), 1u) << r.output;
  auto f = fsdp::testing::parse_kv(lines[0]);
  ASSERT_TRUE(f.has("inter_logical")) << lines[0];
  const long long shard = f["padded"] * 4 / 4, crossed = f["ag_inter"] + f["rs_inter"] + f["ar_inter"];
  EXPECT_EQ(f["inter_logical"], 3 * shard) << lines[0];
  EXPECT_LT(crossed, f["inter_logical"]) << "nothing crossed quantized: " << lines[0];
  json m = fsdp::report::analyze(dir);
  ASSERT_EQ(m["ranks"].size(), 4u);
  for (auto& rk : m["ranks"]) {
    if (rk["rank"] != 0) continue;
    ASSERT_EQ(rk["steps"].size(), 2u);
    EXPECT_EQ(rk["steps"][1]["inter_bytes"].get<double>(), double(crossed));
    EXPECT_EQ(rk["steps"][1]["inter_logical_bytes"].get<double>(), double(3 * shard));
  }
  // The page's traffic table says both, and sets the formula against the
  // uncompressed bytes (the run's steps: warm-up and one more).
  auto html = fsdp::testing::run_command({fsdp::testing::bin_path("fsdp"), "report", dir, "-o", dir + "/r.html"}, {},
                                         120);
  ASSERT_EQ(html.exit_code, 0) << html.output;
  if (access(kChromium, X_OK) != 0) std::filesystem::remove_all(dir);
  FSDP_SKIP_WITHOUT_CHROMIUM();  // the counters' and report's checks above ran
  auto args = headless_chromium(dir + "/chromium-profile");
  args.push_back("--dump-dom");
  args.push_back("file://" + dir + "/r.html");
  auto dom = fsdp::testing::run_command(args, {}, 120);
  ASSERT_EQ(dom.exit_code, 0) << dom.output.substr(0, 2000);
  ASSERT_NE(dom.output.find("data-rendered=\"ok\""), std::string::npos) << dom.output.substr(0, 4000);
  EXPECT_NE(dom.output.find(" uncompressed)</td>"), std::string::npos) << "the table's inter-host cell";
  std::filesystem::remove_all(dir);
}

}  // namespace FSDP_TEST_ID
