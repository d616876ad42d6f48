// Tests of the trace recorder (include/fsdp/trace.h): the file it writes is
// what Perfetto, the report and the engine's tests read.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fsdp/errors.h"
#include "fsdp/memory.h"
#include "fsdp/trace.h"
#include "test_util.h"

namespace FSDP_TEST_ID {

using json = nlohmann::json;

fsdp::trace::Options opts(size_t max_events) {
  fsdp::trace::Options o;
  o.max_events = max_events;
  o.sample_memory = false;  // deterministic event counts
  return o;
}

std::string fresh_dir(const std::string& tag) {
  std::string d = fsdp::testing::temp_dir("trace-" + tag);
  std::filesystem::remove(d);  // absent: the trace makes it
  return d;
}

json read(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

std::vector<json> events(const json& j, const std::string& ph, const std::string& name = "") {
  std::vector<json> out;
  for (auto& e : j["traceEvents"])
    if (e["ph"] == ph && (name.empty() || e["name"] == name)) out.push_back(e);
  return out;
}

TEST(Trace, DisabledIsNoop) {
  EXPECT_FALSE(fsdp::trace::enabled());
  fsdp::trace::Span s("all_gather", "comm", {{"bytes", 1}});
  EXPECT_FALSE(s.active());
  s.arg("unit", "x");  // ignored
  fsdp::trace::counter("memory", 1.0);
  fsdp::trace::instant("x", "step");
  EXPECT_EQ(fsdp::trace::stop(), "");
}

TEST(Trace, SpanCounterInstantMetadataLandInRankFile) {
  std::string dir = fresh_dir("basic");
  fsdp::trace::set_metadata("strategy", "FULL_SHARD");  // before start: kept
  fsdp::trace::start(dir, 1, 2, opts(1000));
  EXPECT_TRUE(fsdp::trace::enabled());
  {
    fsdp::trace::Span step("step", "step", {{"step", 0}});
    {
      FSDP_TRACE_SPAN("forward", "forward");
      fsdp::trace::Span ag("all_gather", "comm", {{"unit", "blocks.3"}});
      ag.arg("bytes", 4096);
    }
    fsdp::trace::counter("memory", {{"current", 10}, {"peak", 20}});
    fsdp::trace::instant("checkpoint", "ckpt", {{"path", "a.ckpt"}});
    step.arg("loss", 2.5);
  }
  fsdp::trace::set_metadata("units", json::array({{{"name", "blocks.3"}, {"numel", 7}}}));
  std::string path = fsdp::trace::stop();
  EXPECT_FALSE(fsdp::trace::enabled());
  ASSERT_EQ(path, dir + "/trace-rank1.json");

  json j = read(path);
  EXPECT_EQ(j["displayTimeUnit"], "ms");
  auto& meta = j["otherData"];
  EXPECT_EQ(meta["schema"], "fsdp-trace/1");
  EXPECT_EQ(meta["rank"], 1);
  EXPECT_EQ(meta["world"], 2);
  EXPECT_EQ(meta["strategy"], "FULL_SHARD");
  EXPECT_EQ(meta["units"][0]["name"], "blocks.3");
  EXPECT_EQ(meta["dropped_events"], 0);

  auto x = events(j, "X");
  ASSERT_EQ(x.size(), 3u);
  // Sorted by start: step, forward, all_gather; nested inside each other.
  EXPECT_EQ(x[0]["name"], "step");
  EXPECT_EQ(x[0]["args"]["step"], 0);
  EXPECT_EQ(x[0]["args"]["loss"], 2.5);
  EXPECT_EQ(x[1]["name"], "forward");
  EXPECT_EQ(x[2]["name"], "all_gather");
  EXPECT_EQ(x[2]["cat"], "comm");
  EXPECT_EQ(x[2]["args"]["unit"], "blocks.3");
  EXPECT_EQ(x[2]["args"]["bytes"], 4096);
  for (auto& e : x) {
    EXPECT_EQ(e["pid"], 1);
    EXPECT_GE(e["dur"].get<double>(), 0);
  }
  EXPECT_LE(x[0]["ts"].get<double>(), x[1]["ts"].get<double>());
  EXPECT_GE(x[0]["ts"].get<double>() + x[0]["dur"].get<double>(),
            x[2]["ts"].get<double>() + x[2]["dur"].get<double>());
  auto c = events(j, "C", "memory");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0]["args"]["peak"], 20);
  auto i = events(j, "i", "checkpoint");
  ASSERT_EQ(i.size(), 1u);
  EXPECT_EQ(i[0]["args"]["path"], "a.ckpt");
  auto pn = events(j, "M", "process_name");
  ASSERT_EQ(pn.size(), 1u);
  EXPECT_EQ(pn[0]["args"]["name"], "rank 1");
  auto tn = events(j, "M", "thread_name");
  ASSERT_EQ(tn.size(), 1u);
  EXPECT_EQ(tn[0]["args"]["name"], "compute");
}

TEST(Trace, CommunicationThreadGetsItsOwnTrack) {
  std::string dir = fresh_dir("threads");
  fsdp::trace::start(dir, 0, 1, opts(1000));
  { FSDP_TRACE_SPAN("forward", "forward"); }
  std::thread comm([] {
    fsdp::trace::set_thread_name("comm");
    for (int i = 0; i < 100; ++i) fsdp::trace::Span s("reduce_scatter", "comm", {{"bytes", i}});
  });
  for (int i = 0; i < 100; ++i) fsdp::trace::Span s("backward", "backward");
  comm.join();
  json j = read(fsdp::trace::stop());
  auto rs = events(j, "X", "reduce_scatter"), bw = events(j, "X", "backward");
  ASSERT_EQ(rs.size(), 100u);
  ASSERT_EQ(bw.size(), 100u);
  EXPECT_NE(rs[0]["tid"], bw[0]["tid"]);
  bool named = false;
  for (auto& t : events(j, "M", "thread_name"))
    if (t["tid"] == rs[0]["tid"]) named = t["args"]["name"] == "comm";
  EXPECT_TRUE(named);
}

TEST(Trace, EventsBeyondTheCapAreDroppedAndCounted) {
  std::string dir = fresh_dir("cap");
  fsdp::trace::start(dir, 0, 1, opts(10));
  for (int i = 0; i < 25; ++i) fsdp::trace::Span s("forward", "forward");
  json j = read(fsdp::trace::stop());
  EXPECT_EQ(events(j, "X").size(), 10u);
  EXPECT_EQ(j["otherData"]["dropped_events"], 15);
}

TEST(Trace, MemorySampledAtSpanEndWhenAllocatorInstalled) {
  ASSERT_TRUE(fsdp::memory::install());
  std::string dir = fresh_dir("mem");
  fsdp::trace::start(dir, 0, 1);
  {
    fsdp::trace::Span s("forward", "forward");
    auto t = torch::ones({1024});
  }
  json j = read(fsdp::trace::stop());
  auto c = events(j, "C", "memory");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0]["args"].contains("current"));
  EXPECT_GE(c[0]["args"]["peak"].get<int64_t>(), 4096);
}

TEST(Trace, StartWhileRunningThrowsAndSpanAfterStopIsDiscarded) {
  std::string dir = fresh_dir("twice");
  fsdp::trace::start(dir, 0, 1);
  EXPECT_THROW(fsdp::trace::start(dir, 0, 1), fsdp::Error);
  EXPECT_THROW(fsdp::trace::start(dir + "x", 2, 2), fsdp::Error);
  auto late = std::make_unique<fsdp::trace::Span>("forward", "forward");
  json j = read(fsdp::trace::stop());
  late.reset();  // ends after stop: nowhere to go, must not crash
  EXPECT_TRUE(events(j, "X").empty());
  EXPECT_THROW(fsdp::trace::start(dir, 3, 2), fsdp::Error);  // rank out of range
}

TEST(Trace, MergeGivesOneProcessTrackPerRank) {
  std::string dir = fresh_dir("merge");
  for (int r = 0; r < 3; ++r) {
    fsdp::trace::start(dir, r, 3, opts(100));
    fsdp::trace::set_metadata("strategy", "FULL_SHARD");
    { fsdp::trace::Span s("all_gather", "comm", {{"bytes", 100 * (r + 1)}}); }
    fsdp::trace::stop();
  }
  std::string path = fsdp::trace::merge(dir);
  EXPECT_EQ(path, dir + "/trace.json");
  json j = read(path);
  EXPECT_EQ(j["otherData"]["merged"], true);
  ASSERT_EQ(j["otherData"]["ranks"].size(), 3u);
  EXPECT_EQ(j["otherData"]["ranks"][2]["rank"], 2);
  auto pn = events(j, "M", "process_name");
  ASSERT_EQ(pn.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(pn[r]["args"]["name"], "rank " + std::to_string(r));
  auto ag = events(j, "X", "all_gather");
  ASSERT_EQ(ag.size(), 3u);
  for (auto& e : ag) EXPECT_EQ(e["args"]["bytes"], 100 * (e["pid"].get<int>() + 1));
}

TEST(Trace, MergeOfAnEmptyDirectorySaysWhatToRun) {
  std::string dir = fresh_dir("empty");
  std::system(("mkdir -p '" + dir + "'").c_str());
  try {
    fsdp::trace::merge(dir);
    FAIL() << "expected fsdp::Error";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--trace"), std::string::npos) << e.what();
  }
}

}  // namespace FSDP_TEST_ID
