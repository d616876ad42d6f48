// fsdp-cpp tests: restarts that lose nothing. `fsdp run --max-restarts` runs
// build/bin/tiny with sharded checkpoints; a random rank is SIGKILLed at a
// random moment (sometimes during a checkpoint save); the final weights must
// equal, byte for byte, those of an uninterrupted run.
//
// FSDP_FAULT_RUNS (default 3) sets how many faulty runs; each prints one line
// "fault run i: killed rank r after t ms, detected in d ms, restarts k,
// resumed at step s (redone n), weights equal|DIFFER".
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Direct children of `pid` (the launcher's ranks).
std::vector<pid_t> children(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t c;
  while (f >> c) out.push_back(c);
  return out;
}

// Starts `argv` with stdout+stderr into `log`; returns its pid.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log, const std::string& cwd) {
  pid_t pid = fork();
  if (pid == 0) {
    if (chdir(cwd.c_str()) != 0) _exit(126);
    FILE* f = std::fopen(log.c_str(), "w");
    dup2(fileno(f), 1);
    dup2(fileno(f), 2);
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid, double timeout_s) {
  auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(ReliabilityRestart, SigkillOfARandomRankLosesNothing) {
  const std::string tiny = fsdp::testing::bin_path("tiny"), fsdp_bin = fsdp::testing::bin_path("fsdp");
  if (!fs::exists(tiny)) GTEST_SKIP() << "build/bin/tiny is not built (cmake --build BUILD --target tiny)";
  const char* runs_env = std::getenv("FSDP_FAULT_RUNS");
  const int runs = runs_env ? std::atoi(runs_env) : 3;
  const int steps = 12;
  auto root = fs::temp_directory_path() / ("fsdp-fault-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  auto cmd = [&](const std::string& dir, int restarts) {
    return std::vector<std::string>{fsdp_bin, "run", "-n", "2", "--max-restarts", std::to_string(restarts), "--",
                                    tiny, "--epochs", std::to_string(steps), "--accum", "1", "--ckpt-dir",
                                    dir + "/ckpt", "--ckpt-every", "2", "--resume", "--save",
                                    dir + "/final.safetensors"};
  };

  // The uninterrupted reference, timed to choose kill moments inside it.
  fs::create_directories(root / "ref");
  auto t0 = Clock::now();
  pid_t ref = spawn(cmd((root / "ref").string(), 0), (root / "ref.log").string(), (root / "ref").string());
  ASSERT_EQ(wait_exit(ref, 600), 0) << slurp((root / "ref.log").string());
  const double ref_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const std::string want = slurp((root / "ref/final.safetensors").string());
  ASSERT_FALSE(want.empty());

  std::mt19937 rng(std::random_device{}());
  int mismatches = 0, total_restarts = 0, killed_runs = 0;
  for (int i = 0; i < runs; ++i) {
    auto dir = root / ("run" + std::to_string(i));
    fs::create_directories(dir);
    const std::string log = (dir / "log").string();
    pid_t launcher = spawn(cmd(dir.string(), 3), log, dir.string());
    // Kill between 30% and 90% of the reference run (startup included).
    const int kill_ms = static_cast<int>(ref_ms * std::uniform_real_distribution<>(0.3, 0.9)(rng));
    const int victim = std::uniform_int_distribution<>(0, 1)(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(kill_ms));
    auto ranks = children(launcher);
    double detect_ms = -1;
    if (static_cast<int>(ranks.size()) > victim) {
      kill(ranks[victim], SIGKILL);
      ++killed_runs;
      auto tk = Clock::now();
      while (Clock::now() - tk < std::chrono::seconds(30)) {
        if (slurp(log).find("restarting all") != std::string::npos) {
          detect_ms = std::chrono::duration<double, std::milli>(Clock::now() - tk).count();
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    int rc = wait_exit(launcher, 600);
    std::string out = slurp(log);
    EXPECT_EQ(rc, 0) << out;
    int restarts = count(out, "restarting all");
    total_restarts += restarts;
    int resumed_at = -1;
    auto at = out.rfind("resumed from ");
    if (at != std::string::npos) {
      auto s = out.find("at step ", at);
      if (s != std::string::npos) resumed_at = std::atoi(out.c_str() + s + 8);
    }
    bool equal = slurp((dir / "final.safetensors").string()) == want;
    mismatches += !equal;
    std::printf("fault run %d: killed rank %d after %d ms (reference run %.0f ms), detected in %.1f ms, restarts %d, "
                "resumed at step %d, weights %s\n",
                i, victim, kill_ms, ref_ms, detect_ms, restarts, resumed_at, equal ? "equal" : "DIFFER");
    std::fflush(stdout);
    EXPECT_TRUE(equal) << out;
  }
  std::printf("fault summary: runs %d, killed %d, restarts %d, weight mismatches %d\n", runs, killed_runs,
              total_restarts, mismatches);
  if (mismatches == 0 && !HasFailure()) fs::remove_all(root);
}

}  // namespace
