// fsdp-cpp tests: process helpers (see test_util.h).
#include "test_util.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>
#include <utility>

// Torch-free: the install test (tests/install) compiles this file without
// the library. fsdp_tests' fsdp::init is in test_init.cpp.

namespace fsdp::testing {

// FSDP_TEST_BIN_DIR overrides the build's bin/ (e.g. the sanitizer build's
// binaries as the ranks of a plain fsdp_tests: make test-asan ASAN_QUICK=1).
std::string bin_path(const std::string& name) {
  const char* dir = std::getenv("FSDP_TEST_BIN_DIR");
  return std::string(dir && *dir ? dir : FSDP_BIN_DIR) + "/" + name;
}
std::string torch_python() {
  if (const char* p = std::getenv("FSDP_PYTHON"); p && *p) return p;
#ifdef FSDP_TORCH_PYTHON
  return FSDP_TORCH_PYTHON;
#else
  return "python3";
#endif
}

std::string source_path(const std::string& rel) { return std::string(FSDP_SOURCE_DIR) + "/" + rel; }

void exec_or_exit(const std::vector<std::string>& argv) {
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  execv(a[0], a.data());
  std::fprintf(stderr, "exec %s: %s\n", a[0], std::strerror(errno));
  _exit(127);
}

ProcResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                       double timeout_s) {
  ProcResult r;
  int fds[2];
  if (pipe(fds) != 0) return r;
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    setpgid(0, 0);
    for (auto& kv : env) putenv(strdup(kv.c_str()));
    exec_or_exit(argv);
  }
  close(fds[1]);
  char buf[65536];
  bool killed = false;
  for (;;) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!killed && elapsed > timeout_s) {
      kill(-pid, SIGKILL);
      killed = true;
      r.output += "\n[test_util: killed after timeout]\n";
    }
    pollfd p{fds[0], POLLIN, 0};
    int k = poll(&p, 1, 100);
    if (k > 0) {
      ssize_t n = read(fds[0], buf, sizeof buf);
      if (n <= 0) break;
      r.output.append(buf, n);
    }
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

ProcResult run_ranks(int n, const std::string& scenario, const std::vector<std::string>& args,
                     const std::vector<std::string>& env, double timeout_s) {
  std::vector<std::string> argv = {bin_path("fsdp"), "run", "-n", std::to_string(n), "--",
                                   bin_path("fsdp_test_worker"), scenario};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, env, timeout_s);
}

ProcResult run_two_nodes(const std::vector<std::string>& worker_args, double timeout_s,
                         const std::vector<std::string>& env) {
  std::vector<std::string> program{bin_path("fsdp_test_worker")};
  program.insert(program.end(), worker_args.begin(), worker_args.end());
  return run_two_launchers(program, timeout_s, env);
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::pair<ProcResult, ProcResult> run_launcher_pair(const std::vector<std::string>& program,
                                                    const std::vector<std::string>& env0,
                                                    const std::vector<std::string>& env1, double timeout_s) {
  const std::string port = std::to_string(free_port());
  auto argv = [&](int node) {
    std::vector<std::string> v{bin_path("fsdp"), "run", "-n", "2", "--nnodes", "2", "--node-rank",
                               std::to_string(node), "--master-addr", "127.0.0.1", "--master-port", port, "--"};
    v.insert(v.end(), program.begin(), program.end());
    return v;
  };
  auto with_token = [](std::vector<std::string> e) {
    e.push_back("FSDP_JOB_TOKEN=two_nodes_test_token_0123456789");
    return e;
  };
  ProcResult r1;
  std::thread t([&] { r1 = run_command(argv(1), with_token(env1), timeout_s); });
  ProcResult r0 = run_command(argv(0), with_token(env0), timeout_s);
  t.join();
  return {r0, r1};
}

ProcResult run_two_launchers(const std::vector<std::string>& program, double timeout_s,
                             const std::vector<std::string>& env) {
  auto on = [&](int node) {
    auto e = env;
    e.push_back("FSDP_HOST_ID=node-" + std::to_string(node));
    return e;
  };
  auto [r0, r1] = run_launcher_pair(program, on(0), on(1), timeout_s);
  ProcResult both = r0;
  if (both.exit_code == 0) both.exit_code = r1.exit_code;
  both.output = r0.output + r1.output;
  both.seconds = std::max(r0.seconds, r1.seconds);
  return both;
}

bool run_in_ranks(int n, double timeout_s) {
  if (std::getenv("FSDP_RANK_TEST")) return false;
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(t->test_suite_name()) + "." + t->name();
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    ADD_FAILURE() << "cannot find this test binary (/proc/self/exe) to run " << name << " in ranks";
    return true;
  }
  self[len] = '\0';
  ProcResult r = run_command({bin_path("fsdp"), "run", "-n", std::to_string(n), "--", self, "--gtest_filter=" + name},
                             {"FSDP_RANK_TEST=1"}, timeout_s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Each rank must have run the test (not skipped or filtered it) and passed it.
  for (int rank = 0; rank < n; ++rank)
    EXPECT_NE(r.output.find("[rank " + std::to_string(rank) + "] [       OK ] " + name), std::string::npos)
        << "rank " << rank << " did not report " << name << " OK:\n"
        << r.output;
  return true;
}

bool cma_available() {
  static const bool yes = [] {
    auto r = run_ranks(2, "comm_hello", {}, {"FSDP_TRANSPORT=auto"}, 60);
    return r.exit_code == 0 && lines_with(r.output, "hello from cma+gloo").size() == 2;
  }();
  return yes;
}

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line))
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

Fields::Fields(std::string line) : line_(std::move(line)) {
  std::regex re("(\\w+)=(-?\\d+)");
  for (std::sregex_iterator it(line_.begin(), line_.end(), re), end; it != end; ++it)
    kv_[(*it)[1]] = std::stoll((*it)[2]);
}

long long Fields::operator[](const std::string& key) const {
  auto it = kv_.find(key);
  if (it != kv_.end()) return it->second;
  ADD_FAILURE() << "no integer field '" << key << "=' in the line: " << (line_.empty() ? "(empty)" : line_);
  return 0;
}

Fields parse_kv(const std::string& line) { return Fields(line); }

namespace {

// The directories temp_dir made, removed when the test (or, made outside a
// test, the test suite) that made them ends. A gtest listener, installed
// before main() runs the tests.
class TempDirs : public ::testing::EmptyTestEventListener {
 public:
  static TempDirs& get() {
    static TempDirs* dirs = [] {
      auto* d = new TempDirs;  // owned by gtest's listener list
      ::testing::UnitTest::GetInstance()->listeners().Append(d);
      return d;
    }();
    return *dirs;
  }
  void add(const std::string& path) {
    std::lock_guard<std::mutex> g(mu_);
    (in_test_ ? test_ : suite_).push_back(path);
  }
  void OnTestStart(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> g(mu_);
    in_test_ = true;
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    std::lock_guard<std::mutex> g(mu_);
    in_test_ = false;
    remove(test_, t.result()->Failed(), std::string(t.test_suite_name()) + "." + t.name());
  }
  void OnTestSuiteEnd(const ::testing::TestSuite& s) override {
    std::lock_guard<std::mutex> g(mu_);
    remove(suite_, s.failed_test_count() > 0, s.name());
  }
  void OnTestProgramEnd(const ::testing::UnitTest& u) override {
    std::lock_guard<std::mutex> g(mu_);
    remove(test_, u.failed_test_count() > 0, "the test program");
    remove(suite_, u.failed_test_count() > 0, "the test program");
  }

 private:
  static void remove(std::vector<std::string>& dirs, bool failed, const std::string& who) {
    const char* keep = std::getenv("FSDP_TEST_KEEP");
    const bool keep_failed = failed && keep && std::string(keep) == "1";
    for (const auto& d : dirs) {
      std::error_code ec;
      if (!std::filesystem::exists(d, ec)) continue;
      if (keep_failed) {
        std::printf("[ KEPT     ] %s: %s (FSDP_TEST_KEEP=1; remove it when done)\n", who.c_str(), d.c_str());
        continue;
      }
      std::filesystem::remove_all(d, ec);
    }
    dirs.clear();
  }
  std::mutex mu_;
  bool in_test_ = false;
  std::vector<std::string> test_, suite_;
};

// Installed at start-up, so it sees the first test start.
[[maybe_unused]] const bool temp_dirs_installed = (TempDirs::get(), true);

}  // namespace

std::string temp_dir(const std::string& tag) {
  namespace fs = std::filesystem;
  auto d = fs::temp_directory_path() / ("fsdp-test-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  TempDirs::get().add(d.string());
  return d.string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace fsdp::testing
