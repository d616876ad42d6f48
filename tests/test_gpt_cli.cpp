// build/bin/gpt: usage errors exit 2 and name the flag; bad data is a clear
// error; a tiny run trains, samples, saves and reloads (--init).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "fsdp/checkpoint.h"
#include "test_util.h"

using fsdp::testing::bin_path;
using fsdp::testing::run_command;

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

std::string cli_dir(const std::string& name) { return fsdp::testing::temp_dir("gpt-cli-" + name); }

fsdp::testing::ProcResult gpt(std::vector<std::string> args) {
  args.insert(args.begin(), bin_path("gpt"));
  return run_command(args, {}, 120);
}

TEST(GptCli, BadFlagsExitTwoAndNameTheFlag) {
  const std::string d = cli_dir("flags");
  std::ofstream(d + "/t.txt") << std::string(1000, 'a');
  const std::string t = d + "/t.txt";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--text", t, "--steps", "-1"}, "--steps"},
      {{"--text", t, "--lr", "0"}, "--lr"},
      {{"--text", t, "--strategy", "half"}, "--strategy"},
      {{"--text", t, "--wrap", "size:x"}, "--wrap"},
      {{"--text", t, "--wrap", "blocks"}, "--wrap"},
      {{"--text", t, "--dtype", "fp16"}, "--dtype"},
      {{"--text", t, "--dim", "30"}, "--dim"},
      {{"--text", t, "--shuffle", "maybe"}, "--shuffle"},
      {{"--text", t, "--max-memory", "lots"}, "--max-memory"},
      {{"--text", t, "--min-lr", "1", "--lr", "0.1"}, "--min-lr"},
      {{"--text", t, "--top-k", "300"}, "--top-k"},
      {{"--text", t, "--bogus"}, "--bogus"},
      {{"--data", t, "--text", t}, "--text"},
      {{"--steps", "3"}, "--data"},
  };
  for (auto& [args, flag] : cases) {
    auto r = gpt(args);
    EXPECT_EQ(r.exit_code, 2) << flag << ":\n" << r.output;
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << ":\n" << r.output;
  }
  fs::remove_all(d);
}

TEST(GptCli, BadDataIsAClearError) {
  const std::string d = cli_dir("data");
  std::ofstream(d + "/odd.bin") << "abc";
  std::ofstream(d + "/short.txt") << "tiny";
  auto r = gpt({"--data", d + "/odd.bin"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("expected an even count"), std::string::npos) << r.output;
  r = gpt({"--data", d + "/missing.bin"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  r = gpt({"--text", d + "/short.txt", "--seq", "16"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("too few for --seq 16"), std::string::npos) << r.output;
  fs::remove_all(d);
}

// One process, a tiny model on a repetitive text: the loss falls, the sample
// and the weights come out, and --init of those weights reproduces them.
TEST(GptCli, TinyRunTrainsSamplesSavesAndReloads) {
  const std::string d = cli_dir("run");
  {
    std::ofstream f(d + "/t.txt");
    for (int i = 0; i < 300; i++) f << "hello fsdp world. ";
  }
  const std::vector<std::string> common = {"--text", d + "/t.txt", "--seq", "32", "--dim", "32", "--layers", "1",
                                           "--heads", "2", "--batch", "4", "--lr", "3e-3", "--warmup", "0",
                                           "--log-every", "10", "--eval-every", "20", "--eval-batches", "2",
                                           "--threads", "1"};
  auto args = common;
  args.insert(args.end(), {"--steps", "40", "--sample", "40", "--save", d + "/w.safetensors"});
  auto r = gpt(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto vals = fsdp::testing::lines_with(r.output, "val loss");
  ASSERT_GE(vals.size(), 2u) << r.output;
  const double first = std::stod(vals.front().substr(vals.front().rfind(' ') + 1));
  const double last = std::stod(vals.back().substr(vals.back().rfind(' ') + 1));
  EXPECT_LT(last, first - 1.0) << r.output;
  EXPECT_NE(r.output.find("sample (40 bytes, greedy)"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(d + "/w.safetensors")) << r.output;
  fsdp::ckpt::SafetensorsReader w(d + "/w.safetensors");
  EXPECT_NE(w.find("blocks.0.qkv.weight"), nullptr);
  EXPECT_EQ(w.find("blocks.0.qkv.weight")->shape, (std::vector<int64_t>{96, 32}));

  // --init with 0 steps: the validation loss is the trained one.
  args = common;
  args.insert(args.end(), {"--steps", "0", "--init", d + "/w.safetensors"});
  r = gpt(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto again = fsdp::testing::lines_with(r.output, "val loss");
  ASSERT_EQ(again.size(), 1u) << r.output;
  EXPECT_NEAR(std::stod(again[0].substr(again[0].rfind(' ') + 1)), last, 1e-4) << r.output;
  // A wrong model size is refused with the name and both shapes.
  args = common;
  args[7] = "2";  // --layers 2: blocks.1.* missing from the file
  args.insert(args.end(), {"--steps", "0", "--init", d + "/w.safetensors"});
  r = gpt(args);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("blocks.1"), std::string::npos) << r.output;
  fs::remove_all(d);
}

// --plan: the planner's ledger from the real wrapped model's units before
// step 1, and its peak and traffic against the measured ones at the end.
TEST(GptCli, PlanBeforeStepOneMatchesTheMeasuredRun) {
  const std::string d = cli_dir("plan");
  std::ofstream(d + "/t.txt") << std::string(4000, 'x') << "the quick brown fox jumps over the lazy dog\n";
  for (const char* strategy : {"full", "grad-op"}) {
    auto r = run_command({bin_path("fsdp"), "run", "-n", "2", "--", bin_path("gpt"), "--text", d + "/t.txt",
                          "--steps", "3", "--layers", "2", "--dim", "64", "--heads", "2", "--seq", "32", "--batch",
                          "2", "--eval-every", "0", "--no-progress", "--straggler-factor", "0", "--strategy",
                          strategy, "--plan"},
                         {}, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto head = r.output.find("[rank 0] plan: ");
    auto step0 = r.output.find("[rank 0] step     0");
    ASSERT_NE(head, std::string::npos) << r.output;
    ASSERT_NE(step0, std::string::npos) << r.output;
    EXPECT_LT(head, step0) << "the plan prints before step 1";
    auto lines = fsdp::testing::lines_with(r.output, "plan vs measured (rank 0)");
    ASSERT_EQ(lines.size(), 1u) << r.output;
    double peak_ratio = 0, traffic_ratio = 0;
    auto p = lines[0].find(" measured (", lines[0].find("peak "));
    ASSERT_NE(p, std::string::npos) << lines[0];
    peak_ratio = std::stod(lines[0].substr(p + 11));
    auto t = lines[0].find("training steps (");
    ASSERT_NE(t, std::string::npos) << lines[0];
    traffic_ratio = std::stod(lines[0].substr(t + 16));
    // gpt's plan leaves out the logits [B,T,V] (GptShape::caller_holds_logits
    // = false): train_step drops its `logits` handle with the forward's
    // scope, and cross_entropy keeps only the log_softmax output. What is
    // left for SHARD_GRAD_OP at this 2.3 MiB toy size (about 8%) is, by the
    // formula, its working set counting G_block on top of the head's
    // backward transients, which are gone once a block's gradient exists.
    EXPECT_NEAR(peak_ratio, 1.0, 0.10) << strategy << ": " << lines[0];
    EXPECT_NEAR(traffic_ratio, 1.0, 0.01) << strategy << ": " << lines[0];
  }
  fs::remove_all(d);
}

// `fsdp plan` plans what a run on this host does unless told otherwise
// (CPU ranks keep one copy of each unit per host where the host lets them:
// --share-host auto) and says which; a run's own plan (gpt --plan) asks the
// same rule with its communicator's answer. With make scale's flags (FULL_SHARD,
// --ac block, prefetch, gpt's loop dropping the logits) at a small size, both
// print the same predicted peak.
TEST(GptCli, FsdpPlanPrintsThePeakOfTheRunsOwnPlan) {
  const std::string d = cli_dir("plan-same");
  std::ofstream(d + "/t.txt") << std::string(4000, 'x') << "the quick brown fox jumps over the lazy dog\n";
  const std::vector<std::string> model = {"--layers", "2", "--dim", "64", "--heads", "2", "--vocab", "256",
                                          "--seq", "32", "--batch", "2", "--ac", "block", "--strategy", "full"};
  std::vector<std::string> plan = {bin_path("fsdp"), "plan", "--world", "2", "--prefetch", "1", "--logits", "dropped"};
  plan.insert(plan.end(), model.begin(), model.end());
  const auto planned = run_command(plan);
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  const auto said = fsdp::testing::lines_with(planned.output, "host-shared units: ");
  ASSERT_EQ(said.size(), 1u) << planned.output;
  EXPECT_NE(said[0].find("as the CPU ranks fsdp run starts here (--share-host auto): "), std::string::npos) << said[0];
  std::vector<std::string> run = {bin_path("fsdp"), "run", "-n", "2", "--", bin_path("gpt"), "--text", d + "/t.txt",
                                  "--steps", "0", "--eval-every", "0", "--sample", "0", "--no-progress", "--plan"};
  run.insert(run.end(), model.begin(), model.end());
  const auto ran = run_command(run, {}, 120);
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  // "  predicted peak      2.17 MiB   rest + working + A": the same line in both.
  auto peak_line = [](const std::string& text) {
    std::vector<std::string> lines;
    for (std::string l : fsdp::testing::lines_with(text, "  predicted peak ")) {
      if (l.rfind("[rank 0] ", 0) == 0) l = l.substr(9);
      if (l.rfind("  predicted peak ", 0) == 0) lines.push_back(l);
    }
    EXPECT_EQ(lines.size(), 1u) << text;
    return lines.empty() ? std::string("(none)") : lines[0];
  };
  const std::string by_plan = peak_line(planned.output), by_run = peak_line(ran.output);
  EXPECT_EQ(by_plan, by_run) << "fsdp plan:\n" << planned.output << "\ngpt --plan:\n" << ran.output;
  // Shared or not, both agree on it: the host-shared rows come with the same answer.
  const bool shared = said[0].find("host-shared units: on") != std::string::npos;
  EXPECT_EQ(fsdp::testing::lines_with(planned.output, "  host-shared units ").size(), shared ? 1u : 0u);
  EXPECT_EQ(fsdp::testing::lines_with(ran.output, "  host-shared units ").size(), shared ? 1u : 0u) << ran.output;
  // Told otherwise, it says so and plans each rank's own copy.
  plan.insert(plan.end(), {"--share-host", "off"});
  const auto copies = run_command(plan);
  ASSERT_EQ(copies.exit_code, 0) << copies.output;
  EXPECT_EQ(fsdp::testing::lines_with(copies.output, "host-shared units: off (--share-host off)").size(), 1u)
      << copies.output;
  EXPECT_EQ(fsdp::testing::lines_with(copies.output, "  host-shared units ").size(), 0u) << copies.output;
  fs::remove_all(d);
}

// --ac: activation checkpointing of the blocks trains the same (the loss
// lines are equal to --ac none's), the planner's peak with recomputation is
// within 10% of the measured one, and the peak is lower.
TEST(GptCli, ActivationCheckpointingTrainsTheSameAndThePlanKnowsIt) {
  const std::string d = cli_dir("ac");
  std::ofstream(d + "/t.txt") << std::string(4000, 'x') << "the quick brown fox jumps over the lazy dog\n";
  std::map<std::string, std::vector<std::string>> losses;
  std::map<std::string, double> peaks;
  for (const char* ac : {"none", "block", "every:2"}) {
    auto r = run_command({bin_path("fsdp"), "run", "-n", "2", "--", bin_path("gpt"), "--text", d + "/t.txt",
                          "--steps", "3", "--layers", "3", "--dim", "64", "--heads", "2", "--seq", "64", "--batch",
                          "4", "--eval-every", "0", "--log-every", "1", "--no-progress", "--straggler-factor", "0",
                          "--ac", ac, "--plan"},
                         {}, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (auto& l : fsdp::testing::lines_with(r.output, "[rank 0] step "))
      if (l.find("| loss ") != std::string::npos) losses[ac].push_back(l.substr(0, l.find(" | lr")));
    if (std::string(ac) != "none")
      EXPECT_EQ(fsdp::testing::lines_with(r.output, std::string("activation checkpointing (--ac ") + ac + "): " +
                                                       (std::string(ac) == "block" ? "3" : "2") + " of 3 blocks")
                    .size(),
                1u)
          << r.output;
    auto lines = fsdp::testing::lines_with(r.output, "plan vs measured (rank 0)");
    ASSERT_EQ(lines.size(), 1u) << r.output;
    auto p = lines[0].find(" measured (", lines[0].find("peak "));
    ASSERT_NE(p, std::string::npos) << lines[0];
    EXPECT_NEAR(std::stod(lines[0].substr(p + 11)), 1.0, 0.10) << ac << ": " << lines[0];
    // "... predicted, 3.52 MiB measured": in bytes.
    std::istringstream measured(lines[0].substr(lines[0].find("predicted, ") + 11));
    double v = 0;
    std::string unit;
    measured >> v >> unit;
    peaks[ac] = v * (unit == "GiB" ? 1 << 30 : unit == "MiB" ? 1 << 20 : unit == "KiB" ? 1 << 10 : 1);
  }
  EXPECT_EQ(losses["none"].size(), 3u);
  EXPECT_EQ(losses["block"], losses["none"]);
  EXPECT_EQ(losses["every:2"], losses["none"]);
  EXPECT_LT(peaks["block"], peaks["every:2"]);
  EXPECT_LT(peaks["every:2"], peaks["none"]);
  fs::remove_all(d);
}

// Mixed precision: bf16 parameters (compute and all-gather; fp32 master
// shards) track fp32 over 200 GPT-mini steps: validation loss within 1%.
TEST(GptCli, Bf16ValidationLossAfter200StepsIsWithinOnePercentOfFp32) {
  const std::string d = cli_dir("bf16");
  {
    std::ofstream f(d + "/t.txt");
    for (int i = 0; i < 60; ++i) f << "line " << i << ": the quick brown fox jumps over the lazy dog; pack my box.\n";
  }
  std::map<std::string, double> val;
  for (const char* dtype : {"fp32", "bf16"}) {
    auto r = run_command({bin_path("fsdp"), "run", "-n", "2", "--", bin_path("gpt"), "--text", d + "/t.txt",
                          "--steps", "200", "--layers", "2", "--dim", "64", "--heads", "2", "--seq", "32", "--batch",
                          "4", "--eval-every", "200", "--log-every", "100", "--no-progress", "--straggler-factor", "0",
                          "--dtype", dtype},
                         {}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto lines = fsdp::testing::lines_with(r.output, "step   200 | val loss");
    ASSERT_EQ(lines.size(), 1u) << r.output;
    val[dtype] = std::stod(lines[0].substr(lines[0].find("val loss") + 9));
  }
  EXPECT_LT(val["fp32"], 4.0) << "200 steps should learn something";
  EXPECT_NEAR(val["bf16"], val["fp32"], 0.01 * val["fp32"]) << "bf16 " << val["bf16"] << " vs fp32 " << val["fp32"];
  std::printf("val loss after 200 steps: fp32 %.4f, bf16 %.4f (%.3f%%)\n", val["fp32"], val["bf16"],
              100.0 * (val["bf16"] - val["fp32"]) / val["fp32"]);
  fs::remove_all(d);
}

}  // namespace FSDP_TEST_ID
