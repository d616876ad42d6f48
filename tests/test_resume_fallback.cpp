// fsdp-cpp tests: --resume does not loop on a damaged checkpoint. tiny saves
// sharded checkpoints at steps 2, 4, 6; the newest is then damaged (one
// flipped byte in a shard file, or a shard file cut short) and `--resume`
// must say so, loudly, resume from step 4 (the newest that verifies) and end
// with the weights of an uninterrupted run, bitwise. Damage to every
// checkpoint is one clear error, and a mismatch that is not damage (another
// model) is never "fallen back" from.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "test_util.h"

namespace FSDP_TEST_ID {

namespace fs = std::filesystem;
using fsdp::testing::bin_path;
using fsdp::testing::lines_with;
using fsdp::testing::run_command;

using fsdp::testing::slurp;

using fsdp::testing::temp_dir;

fsdp::testing::ProcResult tiny(const std::string& dir, int epochs, int min_params = 2048) {
  return run_command({bin_path("fsdp"), "run", "-n", "2", "--", bin_path("tiny"), "--epochs", std::to_string(epochs),
                      "--accum", "1", "--ckpt-dir", dir + "/ckpt", "--ckpt-every", "2", "--resume", "--save",
                      dir + "/final.safetensors", "--min-params", std::to_string(min_params),
                      "--straggler-factor", "0", "--no-progress"},
                     {}, 120);
}

// The reference: 8 steps uninterrupted (computed once per test binary).
const std::string& reference() {
  static std::string want = [] {
    const std::string d = temp_dir("ref");
    auto r = tiny(d, 8);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::string w = slurp(d + "/final.safetensors");
    fs::remove_all(d);
    return w;
  }();
  return want;
}

// Trains 6 steps (checkpoints 2, 4, 6), damages step 6 with `damage`, then
// resumes to 8 steps.
fsdp::testing::ProcResult damaged_resume(const std::string& d, void (*damage)(const std::string& file)) {
  auto r = tiny(d, 6);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(d + "/ckpt/latest"), "step-000006\n");
  const std::string f = d + "/ckpt/step-000006/rank-00001-of-00002.safetensors";
  EXPECT_TRUE(fs::exists(f)) << f;
  damage(f);
  return tiny(d, 8);
}

void expect_fell_back(const fsdp::testing::ProcResult& r, const std::string& d, const std::string& fault) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Loud: rank 0 warns on stderr, names the damaged checkpoint and the fault...
  auto warn = lines_with(r.output, "fsdp: WARNING: checkpoint '" + d + "/ckpt/step-000006' is damaged and was skipped: ");
  ASSERT_EQ(warn.size(), 1u) << r.output;
  EXPECT_EQ(warn[0].rfind("[rank 0] ", 0), 0u) << warn[0];
  EXPECT_NE(warn[0].find(fault), std::string::npos) << warn[0];
  EXPECT_NE(warn[0].find("Trying '" + d + "/ckpt/step-000004', the next older checkpoint"), std::string::npos) << warn[0];
  // ... says where it resumed instead, and the trainer's line carries the note.
  EXPECT_EQ(lines_with(r.output, "fsdp: WARNING: resuming from '" + d + "/ckpt/step-000004' (step 4), not from the newest").size(),
            1u)
      << r.output;
  auto resumed = lines_with(r.output, "resumed from " + d + "/ckpt/step-000004 at step 4; skipped 1 damaged checkpoint");
  ASSERT_EQ(resumed.size(), 1u) << r.output;
  // Nothing lost: the weights of the uninterrupted run.
  EXPECT_TRUE(slurp(d + "/final.safetensors") == reference()) << r.output;
}

TEST(ResumeFallback, AFlippedByteFallsBackToTheNewestCheckpointThatVerifies) {
  ASSERT_FALSE(reference().empty());
  const std::string d = temp_dir("flip");
  auto r = damaged_resume(d, [](const std::string& f) {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(0, std::ios::end);
    const auto size = static_cast<std::streamoff>(s.tellg());
    s.seekg(size - 100);
    char c = 0;
    s.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    s.seekp(size - 100);
    s.write(&c, 1);
  });
  expect_fell_back(r, d, "CRC32C");
  if (!HasFailure()) fs::remove_all(d);
}

TEST(ResumeFallback, ATruncatedFileFallsBackToTheNewestCheckpointThatVerifies) {
  ASSERT_FALSE(reference().empty());
  const std::string d = temp_dir("trunc");
  auto r = damaged_resume(d, [](const std::string& f) { fs::resize_file(f, fs::file_size(f) / 2); });
  expect_fell_back(r, d, "rank-00001-of-00002.safetensors");
  if (!HasFailure()) fs::remove_all(d);
}

TEST(ResumeFallback, EveryCheckpointDamagedIsOneClearError) {
  const std::string d = temp_dir("all");
  auto r = tiny(d, 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"step-000002", "step-000004"}) {
    const std::string f = d + "/ckpt/" + s + "/rank-00000-of-00002.safetensors";
    fs::resize_file(f, fs::file_size(f) - 7);
  }
  r = tiny(d, 8);
  EXPECT_NE(r.exit_code, 0) << r.output;
  // 4 is skipped (loudly), then 2, the last, fails too: one error.
  EXPECT_EQ(lines_with(r.output, "[rank 0] fsdp: WARNING: checkpoint '" + d + "/ckpt/step-000004' is damaged").size(), 1u)
      << r.output;
  auto err = lines_with(r.output, "': no checkpoint there verifies; every one is damaged: step-000004 (");
  ASSERT_FALSE(err.empty()) << r.output;
  EXPECT_NE(err[0].find("), step-000002 ("), std::string::npos) << err[0];
  EXPECT_NE(err[0].find("nothing was loaded"), std::string::npos) << err[0];
  if (!HasFailure()) fs::remove_all(d);
}

TEST(ResumeFallback, AMismatchThatIsNotDamageIsNotSkipped) {
  // Sound files, another shape: the error is the mismatch itself, and no
  // older checkpoint is tried (in one process, a world of one).
  const std::string d = temp_dir("other");
  auto comm = fsdp::make_local_communicator();
  for (int64_t step : {2, 4}) {
    std::vector<fsdp::ckpt::Slice> model{{"w", {4}, torch::kFloat32, 0, 4, torch::full({4}, float(step))}}, optim;
    fsdp::ckpt::save_sharded(*comm, d, step, model, optim, {{"step", step}});
  }
  std::vector<fsdp::ckpt::Slice> want{{"w", {5}, torch::kFloat32, 0, 5, torch::zeros({5})}}, none;
  try {
    fsdp::ckpt::load_sharded(*comm, d, want, none);
    ADD_FAILURE() << "loaded a [4] tensor into a [5] one";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("step-000004"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checkpoint has shape [4], this model expects [5]"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(torch::equal(want[0].data, torch::zeros({5})));
  // The same load of the right shape still takes the newest.
  std::vector<fsdp::ckpt::Slice> ok{{"w", {4}, torch::kFloat32, 0, 4, torch::zeros({4})}};
  auto r = fsdp::ckpt::load_sharded(*comm, d, ok, none);
  EXPECT_EQ(r.step, 4);
  EXPECT_TRUE(r.note.empty()) << r.note;
  EXPECT_TRUE(torch::equal(ok[0].data, torch::full({4}, 4.0f)));
  fs::remove_all(d);
}

}  // namespace FSDP_TEST_ID
