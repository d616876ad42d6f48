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

using fsdp::testing::bin_path;
using fsdp::testing::run_command;

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

bool mentions(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

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
    if (mentions(line, soname)) return line;
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

// CPU jobs never map libtorch_cuda or NCCL: the programs link libtorch's
// CPU libraries only. (libtorch_cpu itself needs the CUDA runtime, for its
// profiler: the torch install's copy, the one runtime of the process.)
TEST(Device, CpuProgramsLinkNoCudaLibrary) {
  const std::string site = torch_site();
  for (const std::string prog : {"gpt", "fsdp_test_worker", "fsdp"}) {
    auto r = run_command({"/usr/bin/ldd", bin_path(prog)});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(mentions(r.output, "libtorch_cpu.so")) << prog << ":\n" << r.output;
    for (const char* lib : {"libtorch_cuda", "libc10_cuda", "libnccl"})
      EXPECT_FALSE(mentions(r.output, lib)) << prog << " links " << lib << ":\n" << r.output;
    const std::string rt = ldd_line(r.output, "libcudart");
    if (!rt.empty()) EXPECT_TRUE(mentions(rt, site)) << prog << ": a CUDA runtime outside the torch install: " << rt;
  }
}

// The plugin's CUDA runtime and NCCL are the ones of the torch install
// (libtorch_cuda's own), not a second copy from the system's toolkit.
TEST(Device, ThePluginUsesTheTorchInstallsCudaRuntimeAndNccl) {
  if (!fs::exists(plugin_path())) GTEST_SKIP() << "this build has no CUDA plugin (FSDP_CUDA=OFF)";
  auto r = run_command({"/usr/bin/ldd", plugin_path()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(mentions(r.output, "not found")) << r.output;
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
  EXPECT_FALSE(mentions(d.output, "[libnccl")) << d.output;
  EXPECT_FALSE(mentions(d.output, "[libcudart")) << d.output;
}

// Loading CUDA is the one process-wide change, and only on request: a CPU
// job maps none of it. (Asked afterwards in the same process, after a CPU
// backward fixed libtorch's choice, loading fails saying so: see
// Device.EveryEntryPointLoadsCudaBeforeLibtorchDecides for the right order.)
TEST(Device, CudaIsLoadedOnlyWhenAsked) {
  if (!fs::exists(plugin_path())) GTEST_SKIP() << "this build has no CUDA plugin (FSDP_CUDA=OFF)";
  // In a process of its own: its CPU backward fixes libtorch's choice for
  // the rest of the process (the other tests may share this one).
  FSDP_IN_RANKS(1);
  auto comm = fsdp::make_local_communicator();
  auto model = fsdp::fully_shard(torch::nn::Linear(4, 3).ptr(), comm, {});
  model.forward(torch::ones({2, 4})).sum().backward();
  EXPECT_FALSE(mentions(maps(), "libtorch_cuda.so")) << "a CPU job mapped libtorch_cuda";
  const std::string why = fsdp::cuda_libraries();
  EXPECT_TRUE(mentions(why, "settled on having no CUDA before fsdp-cpp loaded its CUDA plugin")) << why;
  EXPECT_TRUE(mentions(why, "fsdp::parse_device")) << why;
  EXPECT_EQ(fsdp::cuda_device_count(), 0);
}

// Asked first, CUDA support loads with the torch install's own NCCL and
// CUDA runtime, and says what a timed-out NCCL collective does.
TEST(Device, CudaLoadedFirstNamesItsLibraries) {
  if (!fs::exists(plugin_path())) GTEST_SKIP() << "this build has no CUDA plugin (FSDP_CUDA=OFF)";
  // "First" holds only in a process of its own: a test run before this one
  // in the same process (one gtest run of many tests) may have asked
  // libtorch about CUDA already.
  FSDP_IN_RANKS(1);
  const std::string libs = fsdp::cuda_libraries();
  EXPECT_TRUE(mentions(maps(), "libtorch_cuda.so"));
  EXPECT_TRUE(mentions(libs, "NCCL 2.")) << libs;
  EXPECT_TRUE(mentions(libs, torch_site())) << libs;
  EXPECT_TRUE(mentions(libs, "libfsdp_cuda.so")) << libs;
  EXPECT_TRUE(mentions(libs, "TORCH_NCCL_ASYNC_ERROR_HANDLING=3: a timed-out NCCL collective aborts the process"))
      << libs;
  if (fsdp::cuda_device_count() == 0)
    EXPECT_TRUE(mentions(fsdp::cuda_unavailable_reason(), "sees no CUDA device")) << fsdp::cuda_unavailable_reason();
  else
    EXPECT_EQ(fsdp::cuda_unavailable_reason(), "");
}

// libtorch decides once per process whether it has CUDA, the first time
// anything asks (a seed, a backward, torch::cuda::device_count). Every
// library entry point that names a CUDA device loads CUDA support first, so
// the real hooks are registered after it, with or without a GPU; asked too
// early, loading fails with one message naming the culprits.
TEST(Device, EveryEntryPointLoadsCudaBeforeLibtorchDecides) {
  if (!fs::exists(plugin_path())) GTEST_SKIP() << "this build has no CUDA plugin (FSDP_CUDA=OFF)";
  for (const char* entry :
       {"parse_device", "require_device", "fully_shard", "nccl_communicator", "memory_limit", "device_memory"}) {
    auto r = run_command({bin_path("fsdp_test_worker"), "cuda_hooks", entry, "none"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto lines = fsdp::testing::lines_with(r.output, "CUDAHOOKS");
    ASSERT_EQ(lines.size(), 1u) << r.output;
    EXPECT_TRUE(mentions(lines[0], "hooks_built=1")) << lines[0];
    EXPECT_FALSE(mentions(lines[0], "settled on having no CUDA")) << lines[0];
  }
  for (const char* first : {"seed", "backward", "device_count"}) {
    auto r = run_command({bin_path("fsdp_test_worker"), "cuda_hooks", "parse_device", first});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto lines = fsdp::testing::lines_with(r.output, "CUDAHOOKS");
    ASSERT_EQ(lines.size(), 1u) << r.output;
    EXPECT_TRUE(mentions(lines[0], "hooks_built=0")) << lines[0];
    EXPECT_TRUE(mentions(lines[0], "settled on having no CUDA before fsdp-cpp loaded its CUDA plugin")) << lines[0];
    EXPECT_TRUE(mentions(lines[0], "Fix: call fsdp::parse_device(\"cuda\")")) << lines[0];
  }
}

// The programs name their device first, in the order they run: gpt, tiny
// (over NCCL, and over Gloo where nothing else would load CUDA before its
// seed), bench_train, and the parity workers of tests/gpu/run.sh. Without a
// GPU each ends in "sees no CUDA device", which it can only reach after the
// plugin loaded with libtorch's real CUDA hooks; a program that asked
// libtorch first would end in the load-order message instead.
TEST(Device, ProgramsNameTheirDeviceBeforeAskingLibtorch) {
  if (!fs::exists(plugin_path())) GTEST_SKIP() << "this build has no CUDA plugin (FSDP_CUDA=OFF)";
  if (fsdp::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present: the Gpu.* tests run these programs there";
  const auto dir = fs::path(fsdp::testing::temp_dir("fsdp_device_order"));
  std::ofstream(dir / "t.txt") << std::string(4000, 'a') + "the cat sat\n";
  const std::string text = (dir / "t.txt").string(), out = (dir / "w.safetensors").string();
  struct Case {
    std::vector<std::string> argv;
    std::vector<std::string> env;
  };
  const std::vector<Case> cases = {
      {{bin_path("gpt"), "--text", text, "--device", "cuda", "--steps", "1", "--no-progress"}, {}},
      {{bin_path("gpt"), "--text", text, "--device", "cuda:0", "--max-memory", "1GiB", "--steps", "1"}, {}},
      {{bin_path("tiny"), "--device", "cuda", "--epochs", "1", "--save", ""}, {"FSDP_BACKEND=gloo"}},
      {{bin_path("tiny"), "--device", "cuda", "--epochs", "1", "--save", ""}, {}},
      {{bin_path("bench_train"), "--device", "cuda", "--steps", "1"}, {}},
      {{bin_path("fsdp_test_worker"), "gpt_reference", out, "device=cuda:0"}, {}},
      {{bin_path("fsdp"), "run", "-n", "1", "--", bin_path("fsdp_test_worker"), "gpt_parity", "full", out,
        "device=cuda"},
       {"FSDP_BACKEND=nccl"}},
      {{bin_path("fsdp_test_worker"), "ac_parity", "full", "plain", "fp32", "none", "device=cuda:0"}, {}},
  };
  for (const Case& c : cases) {
    if (!fs::exists(c.argv[0])) {
      ADD_FAILURE() << c.argv[0] << " is not built";
      continue;
    }
    auto r = run_command(c.argv, c.env, 120);
    std::string cmd;
    for (auto& a : c.argv) cmd += fs::path(a).filename().string() + " ";
    EXPECT_NE(r.exit_code, 0) << cmd << "ran on a machine without a GPU:\n" << r.output;
    EXPECT_TRUE(mentions(r.output, "sees no CUDA device")) << cmd << "\n" << r.output;
    EXPECT_FALSE(mentions(r.output, "settled on having no CUDA")) << cmd << "\n" << r.output;
  }
  fs::remove_all(dir);
}

// A device the process cannot use is one fsdp::Error at fully_shard, naming
// the option, what the process has and what to do.
TEST(Device, ADeviceTheProcessCannotUseIsOneError) {
  FSDP_IN_RANKS(1);  // the message names what this process has: one where nothing asked about CUDA before
  auto comm = fsdp::make_local_communicator();
  const int have = fsdp::cuda_device_count();
  fsdp::FsdpOptions o;
  o.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(have));
  try {
    fsdp::fully_shard(torch::nn::Linear(4, 3).ptr(), comm, o);
    FAIL() << "fully_shard accepted cuda:" << have;
  } catch (const fsdp::Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(mentions(m, "FsdpOptions::device is cuda:" + std::to_string(have))) << m;
    EXPECT_TRUE(mentions(m, "Fix:")) << m;
    if (have == 0 && fs::exists(plugin_path())) EXPECT_TRUE(mentions(m, "sees no CUDA device")) << m;
  }
  o.device = c10::Device(c10::kMeta);
  try {
    fsdp::fully_shard(torch::nn::Linear(4, 3).ptr(), comm, o);
    FAIL() << "fully_shard accepted the meta device";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(mentions(e.what(), "FsdpOptions.device is meta; expected cpu or cuda:K")) << e.what();
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
    EXPECT_TRUE(mentions(e.what(), "CommOptions::backend = NCCL (or FSDP_BACKEND=nccl)")) << e.what();
    EXPECT_TRUE(mentions(e.what(), "cuda:" + std::to_string(o.device_index))) << e.what();
  }
}

// gpt's flags: --device and --backend are checked like the others (exit 2).
TEST(Device, GptRefusesAnUnknownDevice) {
  auto r = run_command({bin_path("gpt"), "--device", "tpu:0"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(mentions(r.output, "--device")) << r.output;
  EXPECT_TRUE(mentions(r.output, "expected cpu, cuda or cuda:K")) << r.output;
  r = run_command({bin_path("gpt"), "--backend", "mpi"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(mentions(r.output, "--backend")) << r.output;
}

// ---- On a GPU ---------------------------------------------------------------

// GPT-mini on cuda:0 for 20 steps (fp32) equals plain libtorch on cuda:0:
// one rank, and two ranks sharing the GPU (Gloo, staged through pinned
// host memory; NCCL refuses two ranks on one GPU).
TEST(Gpu, GptOnOneGpuMatchesPlainLibtorchAtOneAndTwoRanks) {
  SKIP_WITHOUT_GPUS(1);
  const fs::path dir = fsdp::testing::temp_dir("gpu-parity");
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

// NCCL at N = 1 is NCCL: a one-rank ProcessGroupNCCL (not the world of one's
// copies), and the run equals plain libtorch.
TEST(Gpu, NcclAtOneRankRunsNcclAndMatchesPlainLibtorch) {
  SKIP_WITHOUT_GPUS(1);
  const auto dir = fs::path(fsdp::testing::temp_dir("fsdp_gpu_nccl1"));
  const std::string ref_file = (dir / "reference.safetensors").string(), file = (dir / "n1.safetensors").string();
  auto ref = run_command({bin_path("fsdp_test_worker"), "gpt_reference", ref_file, "device=cuda:0", "steps=20"}, {},
                         300);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  auto r = fsdp::testing::run_ranks(1, "gpt_parity", {"full", file, "device=cuda", "steps=20"}, {"FSDP_BACKEND=nccl"},
                                    300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(fsdp::testing::lines_with(r.output, "comm nccl world=1 on cuda:0").size(), 1u) << r.output;
  std::string worst;
  EXPECT_LT(max_rel_diff(read_all(file), read_all(ref_file), &worst), 1e-5) << "worst " << worst;
  fs::remove_all(dir);
}

// Recomputation restores the GPU's generator as well as the CPU's: with
// dropout in every block, training with and without it on cuda:0 is the same
// bit for bit (a recompute drawing fresh masks would not be).
TEST(Gpu, RecomputeDrawsTheSameDropoutMasksOnTheGpu) {
  SKIP_WITHOUT_GPUS(1);
  auto r = fsdp::testing::run_ranks(1, "ac_parity", {"full", "plain", "fp32", "none", "device=cuda:0"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = fsdp::testing::lines_with(r.output, "ACPARITY");
  ASSERT_EQ(lines.size(), 1u) << r.output;
  fsdp::testing::Fields f(lines[0]);
  EXPECT_EQ(f["loss_equal"], 1) << lines[0];
  EXPECT_EQ(f["grads_equal"], 1) << lines[0];
  EXPECT_EQ(f["params_equal"], 1) << lines[0];
}

// NCCL, one GPU per rank: the same run at N = 2 equals plain libtorch.
TEST(Gpu, NcclAtTwoRanksMatchesPlainLibtorch) {
  SKIP_WITHOUT_GPUS(2);
  const fs::path dir = fsdp::testing::temp_dir("gpu-nccl");
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
  const fs::path dir = fsdp::testing::temp_dir("gpu-gpt");
  std::ofstream(dir / "t.txt") << std::string(20000, 'a') + "the cat sat on the mat\n";
  auto r = run_command({bin_path("gpt"), "--text", (dir / "t.txt").string(), "--device", "cuda", "--dtype", "bf16",
                        "--ac", "block", "--steps", "10", "--layers", "2", "--dim", "64", "--heads", "4", "--seq",
                        "64", "--batch", "4", "--eval-every", "0", "--no-progress"},
                       {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = fsdp::testing::lines_with(r.output, "device memory (rank 0, cuda:0): peak allocated");
  ASSERT_EQ(lines.size(), 1u) << r.output;
  // The ledger measured on the GPU's allocator, not the host's.
  EXPECT_EQ(fsdp::testing::lines_with(r.output, "measured peak (caching allocator of cuda:0)").size(), 1u) << r.output;
  const auto at = lines[0].find("peak_allocated=");
  ASSERT_NE(at, std::string::npos) << lines[0];
  EXPECT_GT(std::stoll(lines[0].substr(at + 15)), 0) << lines[0];
  fs::remove_all(dir);
}

}  // namespace FSDP_TEST_ID
