// fsdp-cpp tests: our safetensors files against PyTorch (the torch this
// build links, testing::torch_python(); the script parses the format itself).
#include <gtest/gtest.h>
#include <unistd.h>

#include "fsdp/checkpoint.h"
#include "test_checkpoint_util.h"
#include "test_util.h"

namespace fsdp::ckpt {
namespace FSDP_TEST_ID {

const std::string kPython = testing::torch_python();

// Must match SPECS in tests/python/check_safetensors.py.
std::vector<TensorSpec> specs() {
  return {{"embed.weight", {13, 7}, torch::kFloat32},
          {"blocks.0.fc.weight", {7, 5}, torch::kBFloat16},
          {"blocks.0.fc.bias", {5}, torch::kFloat16},
          {"head.scale", {}, torch::kFloat64},
          {"steps", {4}, torch::kInt64}};
}
torch::Tensor expected(int k, const TensorSpec& s) {
  return torch::arange(numel_of(s.shape), torch::kFloat64).mul(0.001).add(k).to(s.dtype).reshape(s.shape);
}

bool python_has_torch() {
  if (::access(kPython.c_str(), X_OK) != 0) return false;
  return testing::run_command({kPython, "-c", "import torch"}, {}, 120).exit_code == 0;
}

TEST(CheckpointPython, PyTorchReadsOurFullFile) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " with torch not available";
  std::string path = testing::temp_dir("ckpt-py-read") + "/full.safetensors";
  auto sp = specs();
  int k = 0;
  write_full_safetensors(path, sp, [&](const TensorSpec& s) { return expected(k++, s); });
  auto r = testing::run_command({kPython, testing::source_path("tests/python/check_safetensors.py"), "read", path},
                                {}, 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::lines_with(r.output, "ok ").size(), sp.size()) << r.output;
  ::unlink(path.c_str());
}

TEST(CheckpointPython, WeLoadAFileWrittenFromAPyTorchStateDict) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " with torch not available";
  std::string path = testing::temp_dir("ckpt-py-write") + "/full.safetensors";
  auto r = testing::run_command({kPython, testing::source_path("tests/python/check_safetensors.py"), "write", path},
                                {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto sp = specs();
  // Each of 3 ranks reads its FSDP range of every tensor.
  std::vector<testing::Param> params;
  for (size_t i = 0; i < sp.size(); ++i) params.push_back({sp[i].name, expected(static_cast<int>(i), sp[i])});
  auto errs = testing::run_threads(3, [&](Communicator& c) {
    auto ms = testing::fsdp_slices(params, c.rank(), 3, /*zero=*/true);
    load_full_safetensors(c, path, ms);
    testing::expect_slices_equal(ms, params);
  });
  for (auto& e : errs) EXPECT_EQ(e, "");
  ::unlink(path.c_str());
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::ckpt
