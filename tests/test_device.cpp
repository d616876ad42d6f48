// Devices: CUDA support comes as a plugin loaded on request, with the CUDA
// runtime and NCCL of the torch install (never the toolkit's); a device the
// process cannot use is one clear error. The Gpu.* tests need a GPU and skip
// with one line saying so where there is none (make test prints the count);
// `make test-gpu` runs them on a machine with one (docs/GPU.md).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/device.h"
#include "fsdp/fully_shard.h"
#include "test_util.h"

namespace fs = std::filesystem;
using fsdp::testing::bin_path;
using fsdp::testing::run_command;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string plugin_path() { return bin_path("../lib/libfsdp_cuda.so"); }

// The torch install the build found: <site-packages>, from Torch_DIR
// (<site-packages>/torch/share/cmake/Torch).
std::string torch_site() {
  return fs::weakly_canonical(fs::path(FSDP_TORCH_DIR) / ".." / ".." / ".." / "..").string();
}

std::string maps() {
  std::ifstream f("/proc/self/maps");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The line of `ldd` output for `soname` ("" when it is not a dependency).
std::string ldd_line(const std::string& out, const std::string& soname) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (contains(line, soname)) return line;
  return "";
}

std::map<std::string, torch::Tensor> read_all(const std::string& path) {
  fsdp::ckpt::SafetensorsReader r(path);
  std::map<std::string, torch::Tensor> out;
  for (auto& e : r.entries()) out[e.name] = r.read_all(e.name).reshape(e.shape);
  return out;
}

// Largest ||a - b|| / ||b|| over the tensors (names must match), and where.
double max_rel_diff(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b,
                    std::string* worst) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (auto& [name, tb] : b) {
    auto it = a.find(name);
    if (it == a.end()) {
      ADD_FAILURE() << "missing tensor " << name;
      continue;
    }
    const auto x = it->second.to(torch::kDouble), y = tb.to(torch::kDouble);
    const double d = (x - y).norm().item<double>() / std::max(y.norm().item<double>(), 1e-30);
    if (d > m) m = d, *worst = name;
  }
  return m;
}

#define SKIP_WITHOUT_GPUS(n)                                                                                  \
  do {                                                                                                        \
    const int have_ = fsdp::cuda_device_count();                                                              \
    if (have_ == 0) GTEST_SKIP() << "no CUDA device: " << fsdp::cuda_unavailable_reason();                    \
    if (have_ < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA devices (NCCL: one per rank), this machine has " \
                                  << have_;                                                                   \
  } while (0)

}  // namespace

// CPU jobs never map libtorch_cuda or NCCL: the programs link libtorch's
// CPU libraries only. (libtorch_cpu itself needs the CUDA runtime, for its
// profiler: the torch install's copy, the one runtime of the process.)
TEST(Device, CpuProgramsLinkNoCudaLibrary) {
  const std::string site = torch_site();
  for (const std::string prog : {"gpt", "fsdp_test_worker", "fsdp"}) {
    auto r = run_command({"/usr/bin/ldd", bin_path(prog)});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(contains(r.output, "libtorch_cpu.so")) << prog << ":\n" << r.output;
    for (const char* lib : {"libtorch_cuda", "libc10_cuda", "libnccl"})
      EXPECT_FALSE(contains(r.output, lib)) << prog << " links " << lib << ":\n" << r.output;
    const std::string rt = ldd_line(r.output, "libcudart");
    if (!rt.empty()) EXPECT_TRUE(contains(rt, site)) << prog << ": a CUDA runtime outside the torch install: " << rt;
  }
}

// The plugin's CUDA runtime and NCCL are the ones of the torch install
// (libtorch_cuda's own), not a second copy from the system's toolkit.
TEST(Device, ThePluginUsesTheTorchInstallsCudaRuntimeAndNccl) {
  if (!fs::exists(plugin_path())) GTEST_SKIP() << "this build has no CUDA plugin (FSDP_CUDA=OFF)";
  auto r = run_command({"/usr/bin/ldd", plugin_path()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "not found")) << r.output;
  const std::string site = torch_site();
  for (const char* lib : {"libtorch_cuda.so", "libnccl.so.2", "libcudart.so."}) {
    const std::string line = ldd_line(r.output, lib);
    ASSERT_FALSE(line.empty()) << lib << " is not a dependency of the plugin:\n" << r.output;
    const std::string resolved = line.substr(line.find("=> ") + 3);
    EXPECT_EQ(fs::weakly_canonical(resolved.substr(0, resolved.find(' '))).string().rfind(site, 0), 0u)
        << lib << " resolves outside the torch install " << site << ": " << line;
  }
  // The plugin itself links no CUDA library directly but libtorch's.
  auto d = run_command({"/usr/bin/readelf", "-d", plugin_path()});
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_FALSE(contains(d.output, "[libnccl")) << d.output;
  EXPECT_FALSE(contains(d.output, "[libcudart")) << d.output;
}

// Loading CUDA is the one process-wide change, and only on request.
TEST(Device, CudaIsLoadedOnlyWhenAsked) {
  if (!fs::exists(plugin_path())) GTEST_SKIP() << "this build has no CUDA plugin (FSDP_CUDA=OFF)";
  auto comm = fsdp::make_local_communicator();
  auto model = fsdp::fully_shard(torch::nn::Linear(4, 3).ptr(), comm, {});
  model.forward(torch::ones({2, 4})).sum().backward();
  EXPECT_FALSE(contains(maps(), "libtorch_cuda.so")) << "a CPU job mapped libtorch_cuda";

  const std::string libs = fsdp::cuda_libraries();
  EXPECT_TRUE(contains(maps(), "libtorch_cuda.so"));
  EXPECT_TRUE(contains(libs, "NCCL 2.")) << libs;
  EXPECT_TRUE(contains(libs, torch_site())) << libs;
  EXPECT_TRUE(contains(libs, "libfsdp_cuda.so")) << libs;
  if (fsdp::cuda_device_count() == 0)
    EXPECT_TRUE(contains(fsdp::cuda_unavailable_reason(), "sees no CUDA device")) << fsdp::cuda_unavailable_reason();
  else
    EXPECT_EQ(fsdp::cuda_unavailable_reason(), "");
}

// A device the process cannot use is one fsdp::Error at fully_shard, naming
// the option, what the process has and what to do.
TEST(Device, ADeviceTheProcessCannotUseIsOneError) {
  auto comm = fsdp::make_local_communicator();
  const int have = fsdp::cuda_device_count();
  fsdp::FsdpOptions o;
  o.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(have));
  try {
    fsdp::fully_shard(torch::nn::Linear(4, 3).ptr(), comm, o);
    FAIL() << "fully_shard accepted cuda:" << have;
  } catch (const fsdp::Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "FsdpOptions::device is cuda:" + std::to_string(have))) << m;
    EXPECT_TRUE(contains(m, "Fix:")) << m;
    if (have == 0 && fs::exists(plugin_path())) EXPECT_TRUE(contains(m, "sees no CUDA device")) << m;
  }
  o.device = c10::Device(c10::kMeta);
  try {
    fsdp::fully_shard(torch::nn::Linear(4, 3).ptr(), comm, o);
    FAIL() << "fully_shard accepted the meta device";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "FsdpOptions.device is meta; expected cpu or cuda:K")) << e.what();
  }
}

TEST(Device, NcclWithoutItsGpuIsOneError) {
  fsdp::CommOptions o;
  o.backend = fsdp::CommBackend::NCCL;
  o.device_index = fsdp::cuda_device_count();  // one past the last
  try {
    fsdp::make_communicator_from_env(o);
    FAIL() << "NCCL on a missing GPU was accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "CommOptions::backend = NCCL (or FSDP_BACKEND=nccl)")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cuda:" + std::to_string(o.device_index))) << e.what();
  }
}

// gpt's flags: --device and --backend are checked like the others (exit 2).
TEST(Device, GptRefusesAnUnknownDevice) {
  auto r = run_command({bin_path("gpt"), "--device", "tpu:0"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--device")) << r.output;
  EXPECT_TRUE(contains(r.output, "expected cpu, cuda or cuda:K")) << r.output;
  r = run_command({bin_path("gpt"), "--backend", "mpi"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--backend")) << r.output;
}

// ---- On a GPU ---------------------------------------------------------------

// GPT-mini on cuda:0 for 20 steps (fp32) equals plain libtorch on cuda:0:
// one rank, and two ranks sharing the GPU (Gloo, staged through pinned
// host memory; NCCL refuses two ranks on one GPU).
TEST(Gpu, GptOnOneGpuMatchesPlainLibtorchAtOneAndTwoRanks) {
  SKIP_WITHOUT_GPUS(1);
  const auto dir = fs::temp_directory_path() / ("fsdp_gpu_parity_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string ref_file = (dir / "reference.safetensors").string();
  auto ref = run_command({bin_path("fsdp_test_worker"), "gpt_reference", ref_file, "device=cuda:0", "steps=20"}, {},
                         300);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto reference = read_all(ref_file);
  for (int n : {1, 2}) {
    const std::string file = (dir / ("n" + std::to_string(n) + ".safetensors")).string();
    auto r = fsdp::testing::run_ranks(n, "gpt_parity", {"full", file, "device=cuda:0", "steps=20"},
                                      {"FSDP_BACKEND=gloo"}, 300);
    ASSERT_EQ(r.exit_code, 0) << "N=" << n << "\n" << r.output;
    std::string worst;
    EXPECT_LT(max_rel_diff(read_all(file), reference, &worst), 1e-5) << "N=" << n << ", worst " << worst;
  }
  fs::remove_all(dir);
}

// NCCL, one GPU per rank: the same run at N = 2 equals plain libtorch.
TEST(Gpu, NcclAtTwoRanksMatchesPlainLibtorch) {
  SKIP_WITHOUT_GPUS(2);
  const auto dir = fs::temp_directory_path() / ("fsdp_gpu_nccl_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string ref_file = (dir / "reference.safetensors").string();
  auto ref = run_command({bin_path("fsdp_test_worker"), "gpt_reference", ref_file, "device=cuda:0", "steps=20"}, {},
                         300);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::string file = (dir / "n2.safetensors").string();
  // "cuda": each rank's own GPU (cuda:LOCAL_RANK).
  auto r = fsdp::testing::run_ranks(2, "gpt_parity", {"full", file, "device=cuda", "steps=20"},
                                    {"FSDP_BACKEND=nccl"}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string worst;
  EXPECT_LT(max_rel_diff(read_all(file), read_all(ref_file), &worst), 1e-5) << "worst " << worst;
  fs::remove_all(dir);
}

// gpt on a GPU with bf16 parameters, fp32 reduction and every block
// recomputed: it trains, and reports the device's memory beside the ledger.
TEST(Gpu, GptTrainsInBf16WithRecomputationAndReportsDeviceMemory) {
  SKIP_WITHOUT_GPUS(1);
  const auto dir = fs::temp_directory_path() / ("fsdp_gpu_gpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "t.txt") << std::string(20000, 'a') + "the cat sat on the mat\n";
  auto r = run_command({bin_path("gpt"), "--text", (dir / "t.txt").string(), "--device", "cuda", "--dtype", "bf16",
                        "--ac", "block", "--steps", "10", "--layers", "2", "--dim", "64", "--heads", "4", "--seq",
                        "64", "--batch", "4", "--eval-every", "0", "--no-progress"},
                       {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = fsdp::testing::lines_with(r.output, "device memory (rank 0, cuda:0): peak allocated");
  ASSERT_EQ(lines.size(), 1u) << r.output;
  const auto at = lines[0].find("peak_allocated=");
  ASSERT_NE(at, std::string::npos) << lines[0];
  EXPECT_GT(std::stoll(lines[0].substr(at + 15)), 0) << lines[0];
  fs::remove_all(dir);
}
