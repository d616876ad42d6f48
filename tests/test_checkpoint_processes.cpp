// fsdp-cpp tests: checkpoints across real processes — N -> M through
// `fsdp run`, and saves killed with SIGKILL part-way.
#include <gtest/gtest.h>
#include <unistd.h>

#include "fsdp/checkpoint.h"
#include "test_checkpoint_util.h"
#include "test_util.h"

namespace fsdp::ckpt {
namespace FSDP_TEST_ID {

// Removed when the test ends (fsdp::testing::temp_dir).
std::string processes_dir(const std::string& tag) { return fsdp::testing::temp_dir("ckpt-" + tag); }

// What a save killed part-way leaves: a temp dir, a half-renamed pointer, a
// trash dir, or a published step newer than `latest`.
std::vector<std::string> list_leftovers(const std::string& root, const std::string& latest_dir) {
  std::vector<std::string> out;
  auto r = testing::run_command({"/bin/ls", "-a", root}, {}, 10);
  std::string latest = latest_dir.substr(latest_dir.rfind('/') + 1);
  for (auto& l : testing::lines_with(r.output, ""))
    if (l.rfind(".tmp-", 0) == 0 || l.rfind(".trash-", 0) == 0 || l == "latest.tmp" ||
        (l.rfind("step-", 0) == 0 && l > latest))
      out.push_back(l);
  return out;
}

bool launcher_available() {
  auto r = testing::run_command({testing::bin_path("fsdp"), "run", "--help"}, {}, 30);
  return r.exit_code == 0;
}

TEST(CheckpointProcesses, SaveAtFourLoadAtThreeOneTwo) {
  if (!launcher_available()) GTEST_SKIP() << "`fsdp run` not built yet";
  auto root = processes_dir("proc");
  auto r = testing::run_ranks(4, "ckpt_save", {root, "3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int m : {3, 1, 2}) {
    r = testing::run_ranks(m, "ckpt_load", {root, "3"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(testing::lines_with(r.output, "ckpt_load ok").size(), static_cast<size_t>(m)) << r.output;
  }
}

// Kill a process that saves in a loop at several moments; every time, `latest`
// must name a complete checkpoint whose values are those of its step, and
// steps only move forward.
TEST(CheckpointProcesses, SigkillDuringSaveLeavesLatestLoadable) {
  std::string worker = testing::bin_path("fsdp_test_worker");
  if (::access(worker.c_str(), X_OK) != 0) GTEST_SKIP() << "fsdp_test_worker not built";
  auto root = processes_dir("kill");
  int64_t last = 0;
  int kills_mid_save = 0;
  for (double t : {0.3, 0.45, 0.6, 0.8, 1.0, 1.3, 1.7, 2.2}) {
    auto r = testing::run_command({worker, "ckpt_save_loop", root, std::to_string(last + 1)}, {}, t);
    ASSERT_EQ(r.exit_code, 128 + 9) << "expected SIGKILL: " << r.output;
    std::string dir = resolve_checkpoint(root);
    if (dir.empty()) continue;  // killed before the first save completed
    int64_t step = read_info(dir).step;
    EXPECT_GE(step, last);
    // Did this kill land inside a save? (leftovers readers must ignore)
    for (auto& n : list_leftovers(root, dir)) {
      (void)n;
      ++kills_mid_save;
      break;
    }
    auto model = testing::model_at_step(step, true);
    auto errs = testing::run_threads(2, [&](Communicator& c) {
      auto ms = testing::fsdp_slices(model, c.rank(), 2, true);
      std::vector<Slice> os;
      auto res = load_sharded(c, root, ms, os);
      EXPECT_TRUE(res.found);
      EXPECT_EQ(res.step, step);
      testing::expect_slices_equal(ms, model);
    });
    for (auto& e : errs) EXPECT_EQ(e, "") << "after a kill at " << t << " s";
    EXPECT_TRUE(verify_checkpoint(root).empty());
    last = step;
  }
  EXPECT_GT(last, 0) << "no save ever completed";
  std::printf("kills that left a partial save behind: %d of 8\n", kills_mid_save);
}

// Files written by the libtorch 1.13 build (tests/fixtures/libtorch-1.13,
// README there) load on this one: the sharded checkpoint verifies, resumes
// at its world size and resharded to 3, and either way the full weights
// written after it equal, bit for bit, the ones the 1.13 build wrote.
TEST(CheckpointCompat, Libtorch113CheckpointsStillLoad) {
  if (!launcher_available()) GTEST_SKIP() << "`fsdp run` not built yet";
  const std::string fix = testing::source_path("tests/fixtures/libtorch-1.13");
  EXPECT_TRUE(verify_checkpoint(fix + "/ckpt/step-000003").empty());
  auto root = processes_dir("compat113");
  for (int n : {2, 3}) {
    const std::string ckpt = root + "/ckpt" + std::to_string(n), out = root + "/out" + std::to_string(n) + ".safetensors";
    std::system(("cp -r " + fix + "/ckpt " + ckpt).c_str());
    auto r = testing::run_command({testing::bin_path("fsdp"), "run", "-n", std::to_string(n), "--",
                                   testing::bin_path("gpt"), "--text", fix + "/text.md", "--vocab", "256", "--seq",
                                   "16", "--dim", "16", "--layers", "2", "--heads", "2", "--batch", "2", "--lr",
                                   "1e-2", "--seed", "7", "--steps", "3", "--resume", "--ckpt-dir", ckpt, "--save", out},
                                  {}, 240);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(testing::lines_with(r.output, "[rank 0] resumed from " + ckpt + "/step-000003: step 3 (saved at world size 2")
                  .size(),
              1u)
        << r.output;
    // The same tensors, bitwise, read by PyTorch's safetensors.
    auto py = testing::run_command(
        {testing::torch_python(), "-c",
         "import sys, torch\n"
         "from safetensors.torch import load_file\n"
         "a, b = load_file(sys.argv[1]), load_file(sys.argv[2])\n"
         "assert sorted(a) == sorted(b), (sorted(a), sorted(b))\n"
         "bad = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]\n"
         "print('TENSORS %d DIFFERENT %d %s' % (len(a), len(bad), bad[:5]))\n",
         fix + "/full.safetensors", out},
        {}, 120);
    ASSERT_EQ(py.exit_code, 0) << py.output;
    EXPECT_EQ(testing::lines_with(py.output, "TENSORS 30 DIFFERENT 0 []").size(), 1u) << "N=" << n << ": " << py.output;
  }
  std::system(("rm -rf " + root).c_str());
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::ckpt
