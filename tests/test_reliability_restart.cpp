// fsdp-cpp tests: restarts that lose nothing. `fsdp run --max-restarts` runs
// build/bin/tiny with sharded checkpoints; a random rank is SIGKILLed at a
// random moment (sometimes during a checkpoint save); the final weights must
// equal, byte for byte, those of an uninterrupted run.
//
// FSDP_FAULT_RUNS (default 2) sets how many faulty runs; each prints one line
// "fault run i: killed rank r after t ms, detected in d ms, restarts k,
// resumed at step s (redone n), weights equal|DIFFER".
//
// The GPT-mini test (GptMiniSigkillAnywhereLosesNothing) does the same with
// build/bin/gpt (tiny dimensions, --ckpt-every 5 --resume): its runs alternate:
// kill a random rank the moment a checkpoint save starts (inotify sees rank
// 0 create the save's .tmp-step-N directory), then one at a random
// time. FSDP_GPT_FAULT_RUNS (default 3) sets how many.
#include <gtest/gtest.h>
#include <signal.h>
#include <poll.h>
#include <sys/inotify.h>
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

namespace FSDP_TEST_ID {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using fsdp::testing::slurp;

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

// Every wait below is for an event (a process's end, a line in a log, a
// directory appearing); this bound only turns a job that hangs into a
// failure, far above what the events take on a loaded machine and under the
// sanitizers alike.
constexpr double kHang = 900;

// Whether `pid` (a child) has ended; not reaped (wait_exit reads its code).
bool ended(pid_t pid) {
  siginfo_t si{};
  return waitid(P_PID, pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != 0;
}

// Waits for the job's end (killing it after timeout_s, a hang); returns its
// exit code, -1 after a kill.
int wait_exit(pid_t pid, double timeout_s = kHang) {
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
  const int runs = runs_env ? std::atoi(runs_env) : 2;
  const int steps = 12;
  const fs::path root = fsdp::testing::temp_dir("fault");
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
  ASSERT_EQ(wait_exit(ref), 0) << slurp((root / "ref.log").string());
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
      while (Clock::now() - tk < std::chrono::seconds(int64_t(kHang)) && !ended(launcher)) {
        if (slurp(log).find("restarting all") != std::string::npos) {
          detect_ms = std::chrono::duration<double, std::milli>(Clock::now() - tk).count();
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    int rc = wait_exit(launcher);
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

// ---------------------------------------------------------------------------
// GPT-mini: SIGKILL anywhere, including inside a checkpoint save.

// "[rank 0] step    12 | loss ..." -> the largest step number rank 0 logged
// in `text` (-1 when none).
int last_logged_step(const std::string& text) {
  int last = -1;
  for (size_t at = text.find("[rank 0] step "); at != std::string::npos; at = text.find("[rank 0] step ", at + 1)) {
    const char* p = text.c_str() + at + 14;
    while (*p == ' ') ++p;
    if (*p >= '0' && *p <= '9') last = std::max(last, std::atoi(p));
  }
  return last;
}

TEST(ReliabilityRestart, GptMiniSigkillAnywhereLosesNothing) {
  const std::string gpt = fsdp::testing::bin_path("gpt"), fsdp_bin = fsdp::testing::bin_path("fsdp");
  if (!fs::exists(gpt)) GTEST_SKIP() << "build/bin/gpt is not built (cmake --build BUILD --target gpt)";
  const char* runs_env = std::getenv("FSDP_GPT_FAULT_RUNS");
  const int runs = runs_env ? std::atoi(runs_env) : 3;
  const int steps = 40, every = 5;
  const fs::path root = fsdp::testing::temp_dir("gpt-fault");
  {
    std::ofstream t(root / "text.txt");
    for (int i = 0; i < 400; ++i) t << "the quick brown fox " << i << " jumps over the lazy dog.\n";
  }
  auto cmd = [&](const std::string& dir, int restarts) {
    return std::vector<std::string>{
        fsdp_bin, "run", "-n", "2", "--max-restarts", std::to_string(restarts), "--", gpt,
        "--text", (root / "text.txt").string(), "--seq", "32", "--dim", "48", "--layers", "2", "--heads", "2",
        "--batch", "4", "--steps", std::to_string(steps), "--warmup", "4", "--lr", "3e-3", "--eval-every", "0",
        "--log-every", "1", "--threads", "1", "--ckpt-dir", dir + "/ckpt", "--ckpt-every", std::to_string(every),
        "--resume", "--save", dir + "/final.safetensors"};
  };

  fs::create_directories(root / "ref");
  auto t0 = Clock::now();
  pid_t ref = spawn(cmd((root / "ref").string(), 0), (root / "ref.log").string(), (root / "ref").string());
  ASSERT_EQ(wait_exit(ref), 0) << slurp((root / "ref.log").string());
  const double ref_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const std::string want = slurp((root / "ref/final.safetensors").string());
  ASSERT_FALSE(want.empty());
  const std::string ref_log = slurp((root / "ref.log").string());
  ASSERT_EQ(last_logged_step(ref_log), steps - 1) << ref_log;

  std::mt19937 rng(std::random_device{}());
  int mismatches = 0, total_restarts = 0, killed = 0, killed_in_save = 0, lost_total = 0, redone_total = 0;
  double detect_max = 0;
  for (int i = 0; i < runs; ++i) {
    const bool in_save = i % 2 == 0;
    auto dir = root / ("run" + std::to_string(i));
    fs::create_directories(dir / "ckpt");
    const std::string log = (dir / "log").string();
    const int ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    ASSERT_GE(ino, 0);
    ASSERT_GE(inotify_add_watch(ino, (dir / "ckpt").c_str(), IN_CREATE), 0);
    const int victim = std::uniform_int_distribution<>(0, 1)(rng);
    // in_save: the k-th save (of steps/every - 1 periodic ones); else a
    // step, once the log shows it (an event: a time could fall after the
    // job's last step on a faster run, and then nothing would restart).
    const int target_save = std::uniform_int_distribution<>(1, steps / every - 2)(rng);
    const int kill_step = std::uniform_int_distribution<>(steps * 3 / 10, steps * 8 / 10)(rng);
    auto start = Clock::now();
    pid_t launcher = spawn(cmd(dir.string(), 3), log, dir.string());
    int saves_seen = 0;
    bool fired = false, tmp_left = false;
    std::string tmp_name;
    int before_kill = -1;
    while (!fired && Clock::now() - start < std::chrono::seconds(int64_t(kHang))) {
      if (ended(launcher)) break;
      bool now = false;
      if (in_save) {
        pollfd p{ino, POLLIN, 0};
        if (poll(&p, 1, 5) > 0) {
          alignas(inotify_event) char buf[4096];
          ssize_t n = read(ino, buf, sizeof buf);
          for (ssize_t at = 0; at < n;) {
            auto* ev = reinterpret_cast<inotify_event*>(buf + at);
            std::string name = ev->len ? ev->name : "";
            if (name.rfind(".tmp-step-", 0) == 0 && ++saves_seen == target_save) {
              now = true;
              tmp_name = name;
            }
            at += sizeof(inotify_event) + ev->len;
          }
        }
      } else {
        now = last_logged_step(slurp(log)) >= kill_step;
        if (!now) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (!now) continue;
      auto ranks = children(launcher);
      if (static_cast<int>(ranks.size()) <= victim) break;
      kill(ranks[victim], SIGKILL);
      fired = true;
    }
    close(ino);
    double detect_ms = -1;
    if (fired) {
      ++killed;
      auto tk = Clock::now();
      while (Clock::now() - tk < std::chrono::seconds(int64_t(kHang))) {
        const bool over = ended(launcher);  // read before the log: its last lines are in it
        std::string out = slurp(log);
        if (out.find("restarting all") != std::string::npos) {
          detect_ms = std::chrono::duration<double, std::milli>(Clock::now() - tk).count();
          before_kill = last_logged_step(out.substr(0, out.find("restarting all")));
          break;
        }
        if (over) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      // Was the save really cut short? Its temp dir is still there (the next
      // save removes it), and the restart resumes from the one before.
      if (in_save) tmp_left = fs::exists(dir / "ckpt" / tmp_name);
      killed_in_save += in_save && tmp_left;
      detect_max = std::max(detect_max, detect_ms);
    }
    const int rc = wait_exit(launcher);
    const std::string out = slurp(log);
    EXPECT_EQ(rc, 0) << out;
    const int restarts = count(out, "restarting all");
    total_restarts += restarts;
    // The last attempt: where it resumed and how many steps it trained.
    const size_t last_attempt = out.rfind("restarting all");
    const std::string tail = last_attempt == std::string::npos ? out : out.substr(last_attempt);
    int resumed_at = 0;
    auto at = tail.find("resumed from ");
    if (at != std::string::npos) {
      auto s = tail.find(": step ", at);
      if (s != std::string::npos) resumed_at = std::atoi(tail.c_str() + s + 7);
    }
    int trained = -1;
    at = tail.find("trained ");
    if (at != std::string::npos) trained = std::atoi(tail.c_str() + at + 8);
    const int lost = steps - (resumed_at + trained);  // steps no attempt carried to the end
    const int redone = before_kill >= 0 ? before_kill + 1 - resumed_at : 0;
    lost_total += std::max(0, lost);
    redone_total += std::max(0, redone);
    if (in_save && fired && tmp_left) {
      // The interrupted save was step (target_save * every); the restart took the one before.
      EXPECT_EQ(resumed_at, (target_save - 1) * every) << out;
    }
    const bool equal = slurp((dir / "final.safetensors").string()) == want;
    mismatches += !equal;
    std::printf("gpt fault run %d: %s, killed rank %d %s, detected in %.1f ms, restarts %d, resumed at step %d "
                "(%d step(s) redone, %d lost), weights %s\n",
                i, in_save ? "kill inside a save" : "kill at a random step", victim,
                !fired ? "(run ended before the kill)"
                       : in_save ? (std::string("when ") + tmp_name + " appeared (save " +
                                    (tmp_left ? "cut short" : "had already finished") + ")").c_str()
                                 : ("at step " + std::to_string(kill_step)).c_str(),
                detect_ms, restarts, resumed_at, std::max(0, redone), lost, equal ? "equal" : "DIFFER");
    std::fflush(stdout);
    EXPECT_EQ(lost, 0) << out;
    EXPECT_TRUE(equal) << out;
    EXPECT_EQ(restarts, fired ? 1 : 0) << out;
  }
  std::printf("gpt fault summary: reference run %.0f ms; runs %d, killed %d (%d inside a checkpoint save), "
              "restarts %d, steps redone %d, lost steps %d, weight mismatches %d, slowest detection %.1f ms\n",
              ref_ms, runs, killed, killed_in_save, total_restarts, redone_total, lost_total, mismatches, detect_max);
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(lost_total, 0);
  EXPECT_GT(killed_in_save, 0) << "no kill landed inside a save";
  if (!HasFailure()) fs::remove_all(root);
}

}  // namespace FSDP_TEST_ID
