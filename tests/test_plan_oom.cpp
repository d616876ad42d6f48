// The headline demo (让放不下的模型放得下, examples/gpt/oom_demo.sh): GPT-mini
// L=8 d=256 (6.4 M parameters), T=64, B=4, on 2 ranks with a 96 MiB budget
// per rank. NO_SHARD replicates P + G + O (98.7 MiB with Adam) and fails
// with the ledger diagnosis; FULL_SHARD keeps (P+G+O)/2 and trains (peak
// about 90 MiB). The planner predicts both outcomes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

using fsdp::testing::bin_path;
using fsdp::testing::run_command;

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

const std::vector<std::string> kModel = {"--layers", "8", "--dim", "256", "--heads", "4", "--seq", "64", "--batch", "4"};
constexpr int64_t kBudget = int64_t(96) << 20;

std::string text_file() {
  const fs::path d = fsdp::testing::temp_dir("plan-oom");
  auto path = (d / "t.txt").string();
  std::ofstream f(path);
  for (int i = 0; i < 400; ++i) f << "FSDP shards parameters, gradients and optimizer state across ranks. " << i << "\n";
  return path;
}

fsdp::testing::ProcResult train(const std::string& strategy, const std::string& text, bool check = true) {
  std::vector<std::string> argv = {bin_path("fsdp"), "run", "-n", "2", "--", bin_path("gpt"), "--text", text,
                                   "--steps", "3", "--eval-every", "0", "--strategy", strategy, "--max-memory", "96MiB"};
  argv.insert(argv.end(), kModel.begin(), kModel.end());
  if (!check) argv.push_back("--no-budget-check");
  return run_command(argv, {}, 180);
}

int64_t predicted_peak(const std::string& strategy) {
  std::vector<std::string> argv = {bin_path("fsdp"), "plan", "--json", "--world", "2", "--strategy", strategy};
  argv.insert(argv.end(), kModel.begin(), kModel.end());
  auto r = run_command(argv);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output)["plan"]["peak"].get<int64_t>();
}

TEST(PlanOom, NoShardFailsTheBudgetWithTheLedgerAndFullShardTrains) {
  // The planner says so before running.
  EXPECT_GT(predicted_peak("none"), kBudget);
  EXPECT_LT(predicted_peak("full"), kBudget);

  const std::string text = text_file();
  // The trainer refuses it before building anything, with the planner's terms.
  auto refused = train("none", text);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  for (const char* needle : {"cannot fit --max-memory 96MiB", "the planner's peak per rank at N=2 with NO_SHARD",
                             "the largest term is P+G+O, the model state NO_SHARD replicates", "Fix: --strategy full at this N"})
    EXPECT_NE(refused.output.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << refused.output;
  EXPECT_EQ(refused.output.find("FSDP units"), std::string::npos) << "refused before the model was built";

  // Run anyway: the out-of-memory diagnosis names the ledger term.
  auto none = train("none", text, /*check=*/false);
  EXPECT_NE(none.exit_code, 0) << none.output;
  for (const char* needle :
       {"out of memory", "would exceed the per-rank limit of 96.00 MiB", "FSDP ledger on rank",
        "(NO_SHARD) at the failure", "resident replicas P + G (NO_SHARD: nothing is sharded)  49.33 MiB",
        "the optimizer creating its state O", "Remedies (the FSDP guide's): FULL_SHARD", "fsdp plan"})
    EXPECT_NE(none.output.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << none.output;

  auto full = train("full", text);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_NE(full.output.find("trained 3 steps"), std::string::npos) << full.output;
  EXPECT_EQ(full.output.find("out of memory"), std::string::npos) << full.output;
  fs::remove_all(fs::path(text).parent_path());
}

// Activations the largest term: the refusal offers activation checkpointing
// first (its plan fits at this N), and the run with it passes the budget.
TEST(PlanOom, ActivationsTooLargeSuggestActivationCheckpointing) {
  const std::string text = text_file();
  auto run = [&](const char* ac) {
    return run_command({bin_path("fsdp"), "run", "-n", "2", "--", bin_path("gpt"), "--text", text, "--steps", "2",
                        "--eval-every", "0", "--layers", "4", "--dim", "128", "--heads", "4", "--seq", "256",
                        "--batch", "8", "--max-memory", "80MiB", "--ac", ac},
                       {}, 180);
  };
  auto refused = run("none");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  for (const char* needle : {"cannot fit --max-memory 80MiB", "the largest term is A, the activations",
                             "Fix: --ac block (each block keeps only its input and recomputes its activations in "
                             "backward: peak "})
    EXPECT_NE(refused.output.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << refused.output;
  EXPECT_EQ(refused.output.find("FSDP units"), std::string::npos) << "refused before the model was built";

  auto with_ac = run("block");
  ASSERT_EQ(with_ac.exit_code, 0) << with_ac.output;
  EXPECT_NE(with_ac.output.find("trained 2 steps"), std::string::npos) << with_ac.output;
  fs::remove_all(fs::path(text).parent_path());
}

}  // namespace FSDP_TEST_ID
