// fsdp-cpp tests: `fsdp run --nnodes MIN:MAX` (tools/elastic.h). Two or three
// launchers on this machine run build/bin/gpt (tiny dimensions, one rank per
// node, --global-batch 12); one launcher's whole process group is killed
// mid-training; the others agree on a smaller round and resume from the
// newest checkpoint at the new world size. The final weights must equal
// those of a reference that trains to the same checkpoint at the old size
// and resumes at the new size by hand (fsdp run -n M -- gpt --resume).
// Each test prints "elastic: ..." with its sizes and max |dw|.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "test_util.h"

namespace FSDP_TEST_ID {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using fsdp::testing::bin_path;
using fsdp::testing::slurp;

constexpr int kSteps = 40, kEvery = 4;
// Every wait below is for an event (a line in a log, a launcher's end); this
// bound only turns a job that hangs into a failure. It is far above what the
// events take, on a loaded machine and under the sanitizers alike.
constexpr double kHang = 600;

// A launcher in a process group of its own (so the test can kill the whole
// group, as a lost node), stdout and stderr into `log`.
struct Launcher {
  pid_t pid = -1;
  std::string log;
  int code = -1;  // exit code once waited for (128 + signal when killed)
};

Launcher start(const std::vector<std::string>& argv, const std::string& log, const std::vector<std::string>& env) {
  Launcher l;
  l.log = log;
  l.pid = fork();
  if (l.pid == 0) {
    setpgid(0, 0);
    FILE* f = std::fopen(log.c_str(), "w");
    if (!f) _exit(126);
    dup2(fileno(f), 1);
    dup2(fileno(f), 2);
    for (auto& e : env) putenv(const_cast<char*>(e.c_str()));
    fsdp::testing::exec_or_exit(argv);
  }
  setpgid(l.pid, l.pid);
  return l;
}

// Waits for the launcher (killing its group after timeout_s); returns its exit code.
int finish(Launcher& l, double timeout_s = kHang) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  int status = 0;
  while (waitpid(l.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(-l.pid, SIGKILL);
      waitpid(l.pid, &status, 0);
      return l.code = -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return l.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Whether the launcher has ended (not reaped: finish() still reads its code).
bool ended(const Launcher& l) {
  siginfo_t si{};
  return waitid(P_PID, l.pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != 0;
}

// Waits until the launcher's log shows `needle` after the first `after`
// (from the start when empty). False when the launcher ended without it
// (or after kHang).
bool wait_for(const Launcher& l, const std::string& needle, const std::string& after = "") {
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(kHang * 1000));
  auto seen = [&] {
    const std::string log = slurp(l.log);
    const size_t from = after.empty() ? 0 : log.find(after);
    return from != std::string::npos && log.find(needle, from) != std::string::npos;
  };
  while (Clock::now() < deadline) {
    const bool over = ended(l);  // read before the log: a line written before the end is seen
    if (seen()) return true;
    if (over) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The F32 tensors of a .safetensors file by name.
std::map<std::string, std::vector<float>> read_weights(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  const std::string bytes = slurp(path);
  if (bytes.size() < 8) return out;
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (8 + n > bytes.size()) return out;
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  for (auto& [name, t] : header.items()) {
    if (name == "__metadata__" || t.value("dtype", "") != "F32") continue;
    const size_t b = t["data_offsets"][0].get<size_t>(), e = t["data_offsets"][1].get<size_t>();
    std::vector<float> v((e - b) / 4);
    std::memcpy(v.data(), bytes.data() + 8 + n + b, e - b);
    out[name] = std::move(v);
  }
  return out;
}

// max |a - b| over every tensor; infinity when the names or sizes differ.
double max_diff(const std::map<std::string, std::vector<float>>& a, const std::map<std::string, std::vector<float>>& b) {
  if (a.empty() || a.size() != b.size()) return INFINITY;
  double m = 0;
  for (auto& [name, va] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.size() != va.size()) return INFINITY;
    for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::fabs(double(va[i]) - double(it->second[i])));
  }
  return m;
}

class Elastic : public ::testing::Test {
 protected:
  void SetUp() override {
    gpt_ = bin_path("gpt");
    if (!fs::exists(gpt_)) GTEST_SKIP() << "build/bin/gpt is not built (cmake --build BUILD --target gpt)";
    root_ = fsdp::testing::temp_dir("fsdp-elastic");
    std::ofstream t(root_ + "/text.txt");
    for (int i = 0; i < 400; ++i) t << "the quick brown fox " << i << " jumps over the lazy dog.\n";
  }

  // gpt's flags: tiny, one thread, 12 rows per step whatever the world size.
  std::vector<std::string> gpt_args(const std::string& dir, int steps = kSteps) const {
    return {gpt_,           "--text",       root_ + "/text.txt",  "--seq",        "32",   "--dim",
            "48",           "--layers",     "2",                  "--heads",      "2",    "--batch",
            "2",            "--global-batch", "12",               "--steps",      std::to_string(steps),
            "--warmup",     "4",            "--lr",               "3e-3",         "--eval-every", "0",
            "--log-every",  "1",            "--threads",          "1",            "--no-progress",
            "--straggler-factor", "0",      "--ckpt-dir",         dir + "/ckpt",  "--ckpt-every",
            std::to_string(kEvery), "--resume", "--save",         dir + "/final.safetensors"};
  }

  // `fsdp run -n 1 --nnodes MIN:MAX --node-rank id ...` of node `id`.
  Launcher node(int id, const std::string& nnodes, int port, const std::string& dir,
                const std::vector<std::string>& extra = {}, int steps = kSteps, const std::string& tag = "") {
    std::vector<std::string> argv{bin_path("fsdp"), "run", "-n", "1", "--nnodes", nnodes, "--node-rank",
                                  std::to_string(id), "--master-addr", "127.0.0.1", "--master-port",
                                  std::to_string(port), "--max-restarts", "3", "--rdzv-settle", "2", "--grace", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("--");
    auto g = gpt_args(dir, steps);
    argv.insert(argv.end(), g.begin(), g.end());
    return start(argv, root_ + "/node" + std::to_string(id) + tag + ".log",
                 {"FSDP_JOB_TOKEN=elastic_test_token_0123456789", "FSDP_TIMEOUT=20"});
  }

  // The reference: `fsdp run -n N` to the end with checkpoints, then a copy
  // of its step-S checkpoint resumed by hand at M ranks. Returns its final weights' path.
  std::string reference(int old_world, int new_world, int step) {
    const std::string a = root_ + "/ref_old", b = root_ + "/ref_new";
    fs::create_directories(a);
    fs::create_directories(b + "/ckpt");
    auto run = [&](int n, const std::string& dir) {
      std::vector<std::string> argv{bin_path("fsdp"), "run", "-n", std::to_string(n), "--"};
      auto g = gpt_args(dir);
      argv.insert(argv.end(), g.begin(), g.end());
      return fsdp::testing::run_command(argv, {}, kHang);
    };
    auto r = run(old_world, a);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    char name[32];
    std::snprintf(name, sizeof name, "step-%06d", step);
    if (!fs::exists(a + "/ckpt/" + name)) {
      ADD_FAILURE() << "the reference run at world size " << old_world << " left no " << name << ":\n" << r.output;
      return "";
    }
    fs::copy(a + "/ckpt/" + name, b + "/ckpt/" + name, fs::copy_options::recursive);
    std::ofstream(b + "/ckpt/latest") << name << "\n";
    r = run(new_world, b);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed step " + std::to_string(step) + " at world size " + std::to_string(new_world) +
                            " (was " + std::to_string(old_world) + ")"),
              std::string::npos)
        << r.output;
    return b + "/final.safetensors";
  }

  // Nodes 0..k-1 of `nnodes`; node `victim`'s group is killed once node 0
  // logged the checkpoint of step 8. Checks the job ends at k-1 nodes with
  // the reference's weights.
  void shrink(int k, const std::string& nnodes, int victim) {
    const int port = fsdp::testing::free_port();
    std::vector<Launcher> nodes;
    for (int id = 0; id < k; ++id) {
      const std::string dir = root_ + "/node" + std::to_string(id);
      fs::create_directories(dir);
      // Every node writes its checkpoints into the same folder (one shared
      // file system, as on a cluster): node 0's folder.
      nodes.push_back(node(id, nnodes, port, root_ + "/node0"));
    }
    const bool saw = wait_for(nodes[0], "step-000008");
    kill(-nodes[victim].pid, SIGKILL);
    finish(nodes[victim]);
    ASSERT_TRUE(saw) << "no checkpoint of step 8:\n" << slurp(nodes[0].log);
    for (int id = 0; id < k; ++id)
      if (id != victim) EXPECT_EQ(finish(nodes[id]), 0) << "node " << id << ":\n" << slurp(nodes[id].log);
    const std::string log0 = slurp(nodes[0].log);
    // The launcher's restart line, then the ranks' resume line.
    const std::string old_w = std::to_string(k), new_w = std::to_string(k - 1);
    std::smatch m;
    const std::regex restart("fsdp run: elastic restart (\\d+): world size " + old_w + " -> " + new_w +
                             ", nodes ([0-9,]+) -> ([0-9,]+)");
    ASSERT_TRUE(std::regex_search(log0, m, restart)) << log0;
    const std::regex resumed("\\[rank 0\\] resumed step (\\d+) at world size " + new_w + " \\(was " + old_w +
                             "\\); accumulation (\\d+)");
    ASSERT_TRUE(std::regex_search(log0, m, resumed)) << log0;
    const int step = std::stoi(m[1]);
    const int accum = std::stoi(m[2]);
    EXPECT_EQ(accum, 12 / (2 * (k - 1)));
    EXPECT_GE(step, 8);
    EXPECT_EQ(step % kEvery, 0);
    const auto got = read_weights(root_ + "/node0/final.safetensors");
    ASSERT_FALSE(got.empty()) << log0;
    const std::string ref = reference(k, k - 1, step);
    const double d = max_diff(got, read_weights(ref));
    std::printf("elastic: %d -> %d nodes (--nnodes %s, killed node %d), resumed step %d, accumulation %d, "
                "max |dw| vs reference %.3g\n",
                k, k - 1, nnodes.c_str(), victim, step, accum, d);
    EXPECT_LE(d, 1e-5);
  }

  std::string gpt_, root_;
};

TEST_F(Elastic, TwoLaunchersLoseOneAndFinishAtTheSmallerSize) { shrink(2, "1:2", 1); }

TEST_F(Elastic, ThreeLaunchersLoseOneAndFinishOnTwo) { shrink(3, "2:3", 2); }

TEST_F(Elastic, LosingNodeZeroEndsTheJobNamingTheStore) {
  const int port = fsdp::testing::free_port();
  Launcher n0 = node(0, "1:2", port, root_ + "/job", {}, 4000);
  Launcher n1 = node(1, "1:2", port, root_ + "/job", {}, 4000);
  const bool saw = wait_for(n0, "[rank 0] step     2");
  kill(-n0.pid, SIGKILL);
  finish(n0);
  ASSERT_TRUE(saw) << slurp(n0.log);
  EXPECT_EQ(finish(n1), 1) << slurp(n1.log);
  const std::string log1 = slurp(n1.log);
  EXPECT_NE(log1.find("fsdp run: node 0 is gone: the launcher that hosts the rendezvous store at 127.0.0.1:" +
                      std::to_string(port)),
            std::string::npos)
      << log1;
  EXPECT_NE(log1.find("the job cannot continue without it"), std::string::npos) << log1;
}

TEST_F(Elastic, FewerThanMinNodesEndsTheJobClearly) {
  const int port = fsdp::testing::free_port();
  Launcher n0 = node(0, "2:3", port, root_ + "/job", {"--rdzv-timeout", "3"}, 4000);
  Launcher n1 = node(1, "2:3", port, root_ + "/job", {"--rdzv-timeout", "3"}, 4000);
  const bool saw = wait_for(n0, "[rank 0] step     2");
  kill(-n1.pid, SIGKILL);
  finish(n1);
  ASSERT_TRUE(saw) << slurp(n0.log);
  EXPECT_EQ(finish(n0), 1) << slurp(n0.log);
  const std::string log0 = slurp(n0.log);
  EXPECT_NE(log0.find("fsdp run: the job needs at least 2 nodes (--nnodes 2:3) but only 1 joined round 1 within "
                      "3.0 s (node 0); ending the job"),
            std::string::npos)
      << log0;
}

// A node started again joins at the next round: node 0 sees it waiting and
// ends the running round (no restart spent), the job grows back to two nodes.
// It returns once the round of one node has saved a checkpoint, so the job
// grows back from a step saved at world size 1.
TEST_F(Elastic, AReturningLauncherGrowsTheJobBack) {
  const int port = fsdp::testing::free_port();
  const int steps = 80;
  Launcher n0 = node(0, "1:2", port, root_ + "/job", {}, steps);
  Launcher n1 = node(1, "1:2", port, root_ + "/job", {}, steps);
  const bool saw = wait_for(n0, "step-000008");
  kill(-n1.pid, SIGKILL);
  finish(n1);
  ASSERT_TRUE(saw) << slurp(n0.log);
  const std::string shrunk = ": world size 2 -> 1, nodes 0,1 -> 0";
  ASSERT_TRUE(wait_for(n0, "[rank 0] checkpoint ", shrunk)) << "no checkpoint after the round shrank:\n"
                                                                << slurp(n0.log);
  Launcher back = node(1, "1:2", port, root_ + "/job", {}, steps, "-back");
  EXPECT_EQ(finish(n0), 0) << slurp(n0.log);
  EXPECT_EQ(finish(back), 0) << slurp(back.log);
  const std::string log0 = slurp(n0.log), log1 = slurp(back.log);
  EXPECT_NE(log0.find("node 1 is waiting to join: the next round grows to 2 nodes"), std::string::npos) << log0;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log0, m, std::regex("fsdp run: elastic restart (\\d+): world size 1 -> 2, nodes 0 -> 0,1")))
      << log0;
  EXPECT_TRUE(std::regex_search(log0, m, std::regex("\\[rank 0\\] resumed step (\\d+) at world size 2 \\(was 1\\); "
                                                    "accumulation 3")))
      << log0;
  EXPECT_NE(log1.find("fsdp run: elastic round"), std::string::npos) << log1;
  EXPECT_NE(log0.find("[rank 0] step    " + std::to_string(steps - 1)), std::string::npos) << log0;
  std::printf("elastic: 2 -> 1 -> 2 nodes (--nnodes 1:2), grew back at %s\n", m.str(0).c_str());
}

// Two hosts (network namespaces joined by a veth pair, tests/netns/
// two_hosts.sh): the link is cut; node 0 goes on alone, node 1 ends saying
// node 0 is gone. Skipped with the script's reason where namespaces cannot
// be made.
TEST_F(Elastic, ACutLinkBetweenTwoHostsShrinksTheJobToNodeZero) {
  auto r = fsdp::testing::run_command(
      {"/bin/bash", fsdp::testing::source_path("tests/netns/two_hosts.sh"), bin_path("")},
      {"TWO_HOSTS_FAULT=elastic", "TWO_HOSTS_TIMEOUT=150"}, 200);
  if (r.exit_code == 77) {
    auto why = fsdp::testing::lines_with(r.output, "two_hosts: SKIP:");
    GTEST_SKIP() << (why.empty() ? r.output : why[0]);
  }
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fsdp::testing::lines_with(r.output, "two_hosts: PASS").empty()) << r.output;
  for (auto& l : fsdp::testing::lines_with(r.output, "two_hosts: ")) std::printf("%s\n", l.c_str());
}

TEST_F(Elastic, GptRefusesAGlobalBatchItCannotKeep) {
  std::vector<std::string> argv{bin_path("fsdp"), "run", "-n", "2", "--"};
  auto g = gpt_args(root_ + "/job");
  argv.insert(argv.end(), g.begin(), g.end());
  argv.push_back("--batch");
  argv.push_back("4");  // 12 rows = 2 ranks x 4 rows x 1.5
  const auto r = fsdp::testing::run_command(argv, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("gpt: usage error: --global-batch 12 cannot be kept at world size 2: it must be a multiple "
                          "of --batch 4 x 2 ranks = 8 rows (the accumulation would be 12/8). Use --global-batch 8 "
                          "or --global-batch 16"),
            std::string::npos)
      << r.output;
}

TEST_F(Elastic, NnodesMinMaxIsCheckedWithOneClearMessage) {
  const std::string t = "/bin/true";
  struct Row {
    std::string nnodes, message;
  };
  for (const Row& row : std::vector<Row>{
           {"3:2", "fsdp run: error: --nnodes 3:2: MIN is above MAX; expected --nnodes N or MIN:MAX with 1 <= MIN "
                   "<= MAX (e.g. 1:2)"},
           {"0:2", "fsdp run: error: --nnodes 0:2: MIN must be at least 1, found 0"},
           {"1:x", "--nnodes: expected N or MIN:MAX with two integers (e.g. 1:2), found '1:x'"},
           {"1:2", "--master-addr"},
       }) {
    const auto r = fsdp::testing::run_command({bin_path("fsdp"), "run", "-n", "1", "--nnodes", row.nnodes, "--", t});
    EXPECT_EQ(r.exit_code, 2) << row.nnodes << ": " << r.output;
    EXPECT_NE(r.output.find(row.message), std::string::npos) << row.nnodes << ": " << r.output;
  }
}

}  // namespace FSDP_TEST_ID
