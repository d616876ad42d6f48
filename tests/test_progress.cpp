// fsdp::Progress (fsdp/progress.h): the line format, rate limiting, the ETA
// from the moving average (with an injected clock), terminal rewriting and
// silencing; and the gpt trainer printing progress lines on rank 0 only.
#include <gtest/gtest.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fsdp/errors.h"
#include "fsdp/progress.h"
#include "test_util.h"

using fsdp::testing::lines_with;

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

// A FILE* whose bytes end up in a string, and a clock the test advances.
struct Capture {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  ~Capture() {
    std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, len);
  }
};

struct FakeClock {
  double t = 1000.0;
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

// No FSDP_PROGRESS* from the environment of whoever runs the tests.
class ProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("FSDP_PROGRESS");
    ::unsetenv("FSDP_PROGRESS_EVERY");
  }
  void TearDown() override { SetUp(); }

  fsdp::ProgressOptions lines_opts(Capture& cap, FakeClock& clk) {
    fsdp::ProgressOptions o;
    o.out = cap.f;
    o.tty = 0;
    o.clock = clk.fn();
    return o;
  }
};

int count_lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

TEST_F(ProgressTest, LineFormatWhenNotATerminal) {
  Capture cap;
  FakeClock clk;
  auto o = lines_opts(cap, clk);
  o.label = "train";
  o.total = 500;
  o.interval_s = 0;  // a line per update
  o.rate_scale = 4096;
  o.rate_unit = "tok/s";
  fsdp::Progress p(o);
  for (int i = 1; i <= 120; ++i) {
    clk.t += 0.25;  // 4 steps/s
    p.update(i, {{"loss", "2.3456"}});
  }
  auto text = cap.text();
  EXPECT_EQ(count_lines(text), 120);
  auto last = text.substr(text.rfind('\n', text.size() - 2) + 1);
  // 380 steps left at 4 steps/s: 95 s; 4 steps/s x 4096 tokens.
  EXPECT_EQ(last, "progress: train 120/500 steps (24%) | elapsed 30s | ETA 1m35s | 16384 tok/s | loss 2.3456\n");
  EXPECT_EQ(text.find('\r'), std::string::npos);
}

TEST_F(ProgressTest, BytesAreSizesWithAByteRate) {
  Capture cap;
  FakeClock clk;
  auto o = lines_opts(cap, clk);
  o.label = "saving step-000010 (rank 0 of 2)";
  o.unit = "bytes";
  o.total = 48ll << 20;
  o.interval_s = 0;
  fsdp::Progress p(o);
  clk.t += 2;
  p.update(12ll << 20);
  EXPECT_EQ(cap.text(),
            "progress: saving step-000010 (rank 0 of 2) 12.00 MiB/48.00 MiB (25%) | elapsed 2s | ETA 6s | "
            "6.00 MiB/s\n");
}

TEST_F(ProgressTest, RateLimitedWithTheFirstLineAfterTheInterval) {
  Capture cap;
  FakeClock clk;
  auto o = lines_opts(cap, clk);
  o.total = 100;
  o.interval_s = 5;
  fsdp::Progress p(o);
  std::vector<int> printed_at;
  for (int i = 1; i <= 23; ++i) {  // an update per second
    clk.t += 1;
    if (p.update(i)) printed_at.push_back(i);
  }
  EXPECT_EQ(printed_at, (std::vector<int>{5, 10, 15, 20}));
  // Nothing before the first interval: a short job prints nothing at all.
  Capture cap2;
  FakeClock clk2;
  auto o2 = lines_opts(cap2, clk2);
  o2.total = 3;
  o2.interval_s = 5;
  {
    fsdp::Progress q(o2);
    for (int i = 1; i <= 3; ++i) clk2.t += 1, q.update(i);
  }
  EXPECT_EQ(cap2.text(), "");
  // The last update (done == total) always prints once something was shown,
  // so the log ends at 100%; finish() adds nothing after it.
  clk.t += 1;
  EXPECT_TRUE(p.update(100));
  p.finish();
  auto text = cap.text();
  EXPECT_EQ(count_lines(text), 5);
  EXPECT_NE(text.find("100/100 steps (100%)"), std::string::npos) << text;
  EXPECT_NE(text.find("ETA 0s"), std::string::npos) << text;
}

TEST_F(ProgressTest, FinishPrintsTheFinalStateOfAnUnfinishedJob) {
  Capture cap;
  FakeClock clk;
  auto o = lines_opts(cap, clk);
  o.total = 100;
  o.interval_s = 5;
  fsdp::Progress p(o);
  for (int i = 1; i <= 7; ++i) clk.t += 1, p.update(i);  // a line at 5
  p.finish();                                           // the state at 7
  p.finish();                                           // idempotent
  EXPECT_FALSE(p.update(8));                            // finished: silent
  auto lines = lines_with(cap.text(), "progress:");
  ASSERT_EQ(lines.size(), 2u) << cap.text();
  EXPECT_NE(lines[1].find(" 7/100 steps"), std::string::npos) << lines[1];
}

TEST_F(ProgressTest, EtaFollowsTheMovingAverage) {
  Capture cap;
  FakeClock clk;
  auto o = lines_opts(cap, clk);
  o.total = 1000;
  o.initial = 100;  // e.g. resumed at step 100: only this run's progress counts
  o.window_s = 10;
  fsdp::Progress p(o);
  EXPECT_LT(p.eta(), 0);  // no rate yet: unknown
  EXPECT_EQ(p.rate(), 0);
  for (int i = 1; i <= 20; ++i) clk.t += 0.5, p.update(100 + i);  // 2 steps/s for 10 s
  EXPECT_NEAR(p.rate(), 2.0, 1e-9);
  EXPECT_NEAR(p.eta(), (1000 - 120) / 2.0, 1e-6);
  // Slower: 1 step/s. Within the window the average mixes both rates...
  for (int i = 1; i <= 5; ++i) clk.t += 1, p.update(120 + i);
  EXPECT_GT(p.rate(), 1.0);
  EXPECT_LT(p.rate(), 2.0);
  // ...and once a whole window passed at the new rate, it is that rate.
  for (int i = 6; i <= 15; ++i) clk.t += 1, p.update(120 + i);
  EXPECT_NEAR(p.rate(), 1.0, 1e-9);
  EXPECT_NEAR(p.eta(), 1000 - 135, 1e-6);
  // Many fast updates keep a bounded number of samples and the same rate.
  for (int i = 1; i <= 100000; ++i) clk.t += 0.001, p.update(135 + i);
  EXPECT_NEAR(p.rate(), 1000.0, 0.5);
  EXPECT_EQ(fsdp::Progress(o).eta(), -1);
}

TEST_F(ProgressTest, UnknownTotalHasNoPercentageOrEta) {
  Capture cap;
  FakeClock clk;
  auto o = lines_opts(cap, clk);
  o.label = "read";
  o.interval_s = 0;
  fsdp::Progress p(o);
  clk.t += 4;
  p.update(8);
  EXPECT_EQ(cap.text(), "progress: read 8 steps | elapsed 4s | 2.00 steps/s\n");
}

TEST_F(ProgressTest, TerminalRewritesOneLine) {
  Capture cap;
  FakeClock clk;
  auto o = lines_opts(cap, clk);
  o.tty = 1;
  o.total = 10;
  fsdp::Progress p(o);
  clk.t += 0.5;
  EXPECT_FALSE(p.update(1));  // before tty_delay_s (1 s)
  clk.t += 0.6;
  EXPECT_TRUE(p.update(2));
  clk.t += 0.1;
  EXPECT_FALSE(p.update(3));  // within tty_interval_s (0.2 s)
  clk.t += 0.2;
  EXPECT_TRUE(p.update(4));
  auto text = cap.text();
  EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  EXPECT_NE(text.find("\rprogress: work 2/10 steps (20%)"), std::string::npos) << text;
  EXPECT_NE(text.find("\rprogress: work 4/10 steps (40%)"), std::string::npos) << text;
  EXPECT_NE(text.find("\033[K"), std::string::npos);
  // Another writer clears the line first; finish() redraws the final state
  // and ends it with a newline.
  fsdp::progress::clear_line();
  EXPECT_EQ(cap.text().substr(cap.text().size() - 4), "\r\033[K");
  p.update(10);
  p.finish();
  text = cap.text();
  EXPECT_EQ(text.back(), '\n');
  EXPECT_NE(text.find("\rprogress: work 10/10 steps (100%)"), std::string::npos) << text;
  EXPECT_EQ(count_lines(text), 1);
}

TEST_F(ProgressTest, SilencedOnOtherRanksWhenDisabledAndByTheEnvironment) {
  FakeClock clk;
  for (int variant = 0; variant < 3; ++variant) {
    Capture cap;
    auto o = lines_opts(cap, clk);
    o.interval_s = 0;
    o.total = 2;
    if (variant == 0) o.rank = 1;
    if (variant == 1) o.enabled = false;
    if (variant == 2) ::setenv("FSDP_PROGRESS", "off", 1);
    fsdp::Progress p(o);
    EXPECT_FALSE(p.active());
    clk.t += 2;
    EXPECT_FALSE(p.update(1));
    clk.t += 2;
    p.update(2);
    p.finish();
    EXPECT_EQ(cap.text(), "") << variant;
    EXPECT_NEAR(p.rate(), 0.5, 1e-9);  // the arithmetic still runs
  }
  ::setenv("FSDP_PROGRESS", "lines", 1);
  {
    fsdp::ProgressOptions o;
    EXPECT_FALSE(fsdp::Progress(o).tty());
  }
  ::setenv("FSDP_PROGRESS", "tty", 1);
  {
    fsdp::ProgressOptions o;
    EXPECT_TRUE(fsdp::Progress(o).tty());
  }
  ::setenv("FSDP_PROGRESS", "sometimes", 1);
  try {
    fsdp::Progress p{fsdp::ProgressOptions{}};
    ADD_FAILURE() << "FSDP_PROGRESS=sometimes accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("FSDP_PROGRESS='sometimes': expected off"), std::string::npos) << e.what();
  }
  ::unsetenv("FSDP_PROGRESS");
  // FSDP_PROGRESS_EVERY sets the interval of reporters that left it < 0.
  ::setenv("FSDP_PROGRESS_EVERY", "2", 1);
  {
    Capture cap;
    FakeClock c2;
    auto o = lines_opts(cap, c2);
    fsdp::Progress p(o);
    c2.t += 1;
    EXPECT_FALSE(p.update(1));
    c2.t += 1;
    EXPECT_TRUE(p.update(2));
  }
  ::setenv("FSDP_PROGRESS_EVERY", "-1", 1);
  EXPECT_THROW({ fsdp::Progress p{fsdp::ProgressOptions{}}; }, fsdp::Error);
}

TEST_F(ProgressTest, Durations) {
  using fsdp::progress::format_duration;
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(98), "1m38s");
  EXPECT_EQ(format_duration(3600 * 2 + 5 * 60 + 7), "2h05m");
  EXPECT_EQ(format_duration(86400 * 3 + 3600 * 4), "3d04h");
  EXPECT_EQ(format_duration(-1), "?");
}

// ---------------------------------------------------------------------------
// The trainer: 2 ranks, a line per step and per tensor of the checkpoint
// saves (--progress-every 0 reaches the library's reporter too). Only rank 0
// prints: rank 1 runs the same loop and must print none.
TEST(ProgressGpt, TrainerPrintsProgressOnRankZeroOnly) {
  const fs::path d = fsdp::testing::temp_dir("progress-gpt");
  {
    std::ofstream f(d / "t.txt");
    for (int i = 0; i < 300; i++) f << "hello fsdp world. ";
  }
  std::vector<std::string> args = {fsdp::testing::bin_path("fsdp"), "run", "-n", "2", "--",
                                    fsdp::testing::bin_path("gpt"), "--text", (d / "t.txt").string(),
                                    "--seq", "32", "--dim", "32", "--layers", "1", "--heads", "2", "--batch", "2",
                                    "--steps", "6", "--log-every", "3", "--eval-every", "0", "--threads", "1",
                                    "--ckpt-dir", (d / "ckpt").string(), "--ckpt-every", "3"};
  auto with = args;
  with.insert(with.end(), {"--progress-every", "0"});
  auto r = fsdp::testing::run_command(with, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Lines come through `fsdp run`, prefixed by the rank that printed them.
  EXPECT_TRUE(lines_with(r.output, "[rank 1] progress:").empty()) << r.output;
  auto train = lines_with(r.output, "[rank 0] progress: train ");
  ASSERT_EQ(train.size(), 6u) << r.output;
  for (int s = 1; s <= 6; ++s) {
    const std::string want = "[rank 0] progress: train " + std::to_string(s) + "/6 steps (";
    EXPECT_EQ(train[s - 1].rfind(want, 0), 0u) << train[s - 1];
    EXPECT_NE(train[s - 1].find(" tok/s | loss "), std::string::npos) << train[s - 1];
  }
  EXPECT_NE(train.back().find("(100%) | elapsed "), std::string::npos) << train.back();
  EXPECT_NE(train.back().find("ETA 0s"), std::string::npos) << train.back();
  // Checkpoints at steps 3 and 6: rank 0's shard, tensor by tensor, ending
  // at 100% once each.
  for (const char* step : {"step-000003", "step-000006"}) {
    auto save = lines_with(r.output, std::string("[rank 0] progress: saving ") + step + " (rank 0 of 2) ");
    ASSERT_GE(save.size(), 2u) << r.output;
    EXPECT_NE(save.back().find("(100%)"), std::string::npos) << save.back();
    int full = 0;
    for (auto& l : save) full += l.find("(100%)") != std::string::npos;
    EXPECT_EQ(full, 1) << r.output;
  }
  // The step lines that other tools parse are still there.
  EXPECT_EQ(lines_with(r.output, " ms/step | ").size(), 3u) << r.output;

  // --no-progress: none at all.
  fs::remove_all(d / "ckpt");
  auto without = args;
  without.push_back("--no-progress");
  r = fsdp::testing::run_command(without, {"FSDP_PROGRESS_EVERY=0"}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "progress:").size(), 0u) << r.output;  // saves included
  fs::remove_all(d);
}

}  // namespace FSDP_TEST_ID
