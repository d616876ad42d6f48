// fsdp-cpp as a user's project gets it (tests/consumer):
//   cmake --install <build> --prefix P
//   cmake -S tests/consumer -B P/consumer-build -DCMAKE_PREFIX_PATH=P && cmake --build P/consumer-build
//   P/bin/fsdp run -n 2 -- P/consumer-build/consumer
// and the same consumer with add_subdirectory (FSDP_CONSUMER_SUBDIR=ON).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace fs = std::filesystem;
using fsdp::testing::lines_with;
using fsdp::testing::ProcResult;
using fsdp::testing::run_command;
using fsdp::testing::source_path;

namespace {

// A fresh directory per test under $TMPDIR, removed when the test ends
// (fsdp::testing::temp_dir; FSDP_TEST_KEEP=1 keeps a failed test's).
struct TempDir {
  std::string path = fsdp::testing::temp_dir("install");
};

// Runs one step; fails the test with the step's output when it fails.
ProcResult step(const std::string& what, const std::vector<std::string>& argv, double timeout_s) {
  ProcResult r = run_command(argv, {}, timeout_s);
  EXPECT_EQ(r.exit_code, 0) << what << " failed (" << r.seconds << " s):\n" << r.output;
  return r;
}

// The torch package this build uses (Torch_DIR is <root>/share/cmake/Torch).
std::string torch_root() { return fs::weakly_canonical(fs::path(FSDP_TORCH_DIR) / ".." / ".." / "..").string(); }

std::vector<std::string> configure(const std::string& build, const std::vector<std::string>& defs) {
  std::vector<std::string> a = {FSDP_CMAKE, "-S", source_path("tests/consumer"), "-B", build,
                                "-DCMAKE_BUILD_TYPE=RelWithDebInfo", std::string("-DCMAKE_CXX_COMPILER=") + FSDP_CXX,
                                "-DTORCH_CUDA_ARCH_LIST=9.0"};
  a.insert(a.end(), defs.begin(), defs.end());
  return a;
}

// Both ranks trained, learned and matched the unsharded reference.
void expect_two_ranks_ok(const ProcResult& r) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 2; rank++) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] consumer rank=" + std::to_string(rank) + " world=2 ";
    auto lines = lines_with(r.output, prefix);
    ASSERT_EQ(lines.size(), 1u) << "expected one line starting '" << prefix << "':\n" << r.output;
    EXPECT_NE(lines[0].find("units=3 "), std::string::npos) << lines[0];
    EXPECT_EQ(lines[0].substr(lines[0].size() - 3), " ok") << lines[0];
  }
}

TEST(Install, FindPackage) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path.empty());
  const std::string prefix = tmp.path + "/prefix", build = tmp.path + "/consumer-build";
  step("cmake --install", {FSDP_CMAKE, "--install", FSDP_BUILD_DIR, "--prefix", prefix}, 300);
  for (const char* f : {"bin/fsdp", "include/fsdp/fsdp.h", "include/fsdp/fully_shard.h", "lib/libfsdp_engine.a",
                        "lib/libfsdp_comm.a", "lib/cmake/fsdp/fsdpConfig.cmake",
                        "lib/cmake/fsdp/fsdpConfigVersion.cmake", "lib/cmake/fsdp/fsdpTargets.cmake"})
    EXPECT_TRUE(fs::exists(prefix + "/" + f)) << "not installed: " << f;
  // Only the public headers and the fsdp/detail/ headers they include: no
  // header of src/ travels.
  for (auto& e : fs::recursive_directory_iterator(prefix + "/include"))
    if (e.is_regular_file()) {
      const fs::path dir = e.path().parent_path().lexically_relative(prefix + "/include");
      EXPECT_TRUE(dir == "fsdp" || dir == "fsdp/detail") << e.path();
    }
  // Relocatable: the exported targets name libraries by target, none by a
  // path of the machine that built them (libtorch's libc10 included).
  for (auto& e : fs::directory_iterator(prefix + "/lib/cmake/fsdp")) {
    const std::string text = fsdp::testing::slurp(e.path().string());
    for (const char* bad : {"libc10", "/usr/lib", "/usr/local/lib"})
      EXPECT_EQ(text.find(bad), std::string::npos) << e.path() << " names " << bad << ":\n" << text;
  }
  if (HasFailure()) GTEST_SKIP() << "the installed tree is wrong: not building the consumer";

  // As the README tells an outside project: the package's prefix, and the
  // torch wheel's root (its cmake files and, first, its libraries).
  auto conf = step("configure the consumer", configure(build, {"-DCMAKE_PREFIX_PATH=" + prefix + ";" + torch_root()}), 600);
  ASSERT_EQ(lines_with(conf.output, "fsdp package: " + prefix + "/lib/cmake/fsdp").size(), 1u)
      << "the consumer did not find the installed package:\n" << conf.output;
  step("build the consumer", {FSDP_CMAKE, "--build", build, "-j", "2"}, 1200);
  if (HasFailure()) return;
  expect_two_ranks_ok(run_command({prefix + "/bin/fsdp", "run", "-n", "2", "--", build + "/consumer"}, {}, 300));
}

// A TorchConfig of another libtorch first on CMAKE_PREFIX_PATH (as
// Debian's libtorch-dev 1.13 is on CMake's default paths): the package
// refuses it at configure time, naming what it found, what it needs and the
// line that fixes it, instead of failing the link with undefined symbols.
void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  ASSERT_TRUE(f.good()) << "could not write " << path;
}

std::string decoy_torch(const std::string& root, const std::string& version, int abi) {
  const std::string dir = root + "/share/cmake/Torch";
  fs::create_directories(dir);
  write_text(dir + "/TorchConfigVersion.cmake",
                            "set(PACKAGE_VERSION \"" + version + "\")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n");
  write_text(dir + "/TorchConfig.cmake",
                            "set(TORCH_CXX_FLAGS \"-D_GLIBCXX_USE_CXX11_ABI=" + std::to_string(abi) +
                                "\")\nset(TORCH_LIBRARIES torch)\nset(Torch_FOUND TRUE)\n");
  return dir;
}

// The version of the libtorch this build used (its TorchConfigVersion.cmake).
std::string built_torch_version() {
  const std::string text = fsdp::testing::slurp(std::string(FSDP_TORCH_DIR) + "/TorchConfigVersion.cmake");
  const std::string key = "set(PACKAGE_VERSION \"";
  const size_t at = text.find(key);
  if (at == std::string::npos) return "";
  return text.substr(at + key.size(), text.find('"', at + key.size()) - at - key.size());
}

TEST(Install, RefusesATorchItWasNotBuiltWith) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path.empty());
  const std::string prefix = tmp.path + "/prefix", version = built_torch_version();
  ASSERT_FALSE(version.empty()) << "no PACKAGE_VERSION in " << FSDP_TORCH_DIR << "/TorchConfigVersion.cmake";
  step("cmake --install", {FSDP_CMAKE, "--install", FSDP_BUILD_DIR, "--prefix", prefix}, 300);
  if (HasFailure()) return;
  struct Case {
    std::string name, version;
    int abi;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"older", "1.13.0", 1, "but find_package(Torch) found libtorch 1.13.0 at "},
      {"other-abi", version, 0, "is built for _GLIBCXX_USE_CXX11_ABI=0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string decoy_root = tmp.path + "/decoy-" + c.name, build = tmp.path + "/build-" + c.name;
    const std::string decoy_dir = decoy_torch(decoy_root, c.version, c.abi);
    ProcResult r = run_command(configure(build, {"-DCMAKE_PREFIX_PATH=" + prefix + ";" + decoy_root + ";" + torch_root()}),
                               {}, 300);
    EXPECT_NE(r.exit_code, 0) << "the consumer configured against a decoy libtorch " << c.version << ":\n" << r.output;
    // One message, whole: CMake may wrap it, so compare it with the lines joined.
    std::string joined;
    for (char ch : r.output) {
      if (ch == '\n') continue;
      joined += ch;
    }
    std::string squeezed;
    for (char ch : joined)
      if (!(ch == ' ' && !squeezed.empty() && squeezed.back() == ' ')) squeezed += ch;
    for (const std::string& want : {"fsdp-cpp was built with libtorch " + version, c.says, decoy_dir,
                                    std::string("Fix: put the torch it was built with first: -DCMAKE_PREFIX_PATH="),
                                    torch_root()})
      EXPECT_NE(squeezed.find(want), std::string::npos) << "expected '" << want << "' in:\n" << r.output;
  }
}

TEST(Install, AddSubdirectory) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path.empty());
  const std::string build = tmp.path + "/consumer-build";
  step("configure the consumer", configure(build, {"-DFSDP_CONSUMER_SUBDIR=ON", "-DCMAKE_PREFIX_PATH=" + torch_root()}), 600);
  step("build the consumer", {FSDP_CMAKE, "--build", build, "-j", "2"}, 3000);
  if (HasFailure()) return;
  expect_two_ranks_ok(
      run_command({std::string(FSDP_BIN_DIR) + "/fsdp", "run", "-n", "2", "--", build + "/consumer"}, {}, 300));
}

}  // namespace
