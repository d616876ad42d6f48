// fsdp-cpp tests: start ranks as processes and collect what they print.
// defines: ProcResult, exec_or_exit, run_command, run_ranks, run_two_nodes, run_two_launchers, run_launcher_pair, free_port, run_in_ranks,
//          FSDP_IN_RANKS, bin_path, lines_with, Fields, parse_kv
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::testing {

struct ProcResult {
  int exit_code = -1;  // 128+signal when killed
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

std::string bin_path(const std::string& name);  // build/bin/<name>
std::string source_path(const std::string& rel);
// The Python of the torch this build links (the project's environment,
// `make deps`), for the cross-checks; $FSDP_PYTHON overrides it.
std::string torch_python();

// In a forked child: execs `argv` (no shell); if that fails, says why on
// stderr and exits 127.
[[noreturn]] void exec_or_exit(const std::vector<std::string>& argv);

// Runs `argv` (no shell), with extra "K=V" environment entries, killing it
// after timeout_s. Captures stdout+stderr.
ProcResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
                       double timeout_s = 120);

// `fsdp run -n N -- fsdp_test_worker <scenario> args...`
ProcResult run_ranks(int n, const std::string& scenario, const std::vector<std::string>& args = {},
                     const std::vector<std::string>& env = {}, double timeout_s = 120);

// Two `fsdp run -n 2 --nnodes 2` launchers at once on this machine (a world
// of 4), node k with FSDP_HOST_ID=node-k so the two count as two hosts, both
// running `fsdp_test_worker <worker_args>`. exit_code: node 0's, or node
// 1's when node 0's is 0; output: node 0's then node 1's.
// `env` is added to both launchers'.
ProcResult run_two_nodes(const std::vector<std::string>& worker_args, double timeout_s = 240,
                         const std::vector<std::string>& env = {});
// The same with any program: `program` is its argv (e.g. {bin_path("tiny"), "--strategy", "hybrid"}).
ProcResult run_two_launchers(const std::vector<std::string>& program, double timeout_s = 240,
                             const std::vector<std::string>& env = {});
// The two launchers with an environment each (node 0's, node 1's; no
// FSDP_HOST_ID added) and a result each.
std::pair<ProcResult, ProcResult> run_launcher_pair(const std::vector<std::string>& program,
                                                    const std::vector<std::string>& env0,
                                                    const std::vector<std::string>& env1, double timeout_s = 240);
// A TCP port of 127.0.0.1 that was free a moment ago (bound to port 0, read
// back, closed): nothing listens there.
int free_port();

// A test whose body runs in every rank, with gtest assertions there:
//   TEST(Suite, Name) {
//     FSDP_IN_RANKS(3);                            // the parent stops here
//     auto comm = fsdp::make_communicator_from_env();
//     EXPECT_EQ(...);                              // checked in each rank
//   }
// In the test process, run_in_ranks starts `fsdp run -n N -- <this binary>
// --gtest_filter=<this test>` and fails the test unless every rank exited 0
// and reported this test OK; it returns true (the parent's part is done).
// Inside a rank (FSDP_RANK_TEST set) it returns false: run the body.
bool run_in_ranks(int n, double timeout_s = 120);
#define FSDP_IN_RANKS(n)                          \
  do {                                             \
    if (::fsdp::testing::run_in_ranks(n)) return; \
  } while (0)

// Whether ranks on this host may move bytes by cross-memory attach: two
// ranks with FSDP_TRANSPORT=auto chose it (run once, then cached).
bool cma_available();

// A fresh, empty directory under the system's temp directory ($TMPDIR, else
// /tmp), named after `tag` and this process (removed first if a previous
// run left it). A test leaves no files behind: the directory is removed
// when the test that made it ends, pass or fail (one made outside a test,
// e.g. in SetUpTestSuite, when its test suite ends). FSDP_TEST_KEEP=1 keeps
// the directories of a test that failed and prints where they are.
std::string temp_dir(const std::string& tag);
// A file's bytes ("" when it cannot be read).
std::string slurp(const std::string& path);

// Lines of `text` that contain `needle`.
std::vector<std::string> lines_with(const std::string& text, const std::string& needle);

// The integer fields "key=value" of one printed line (e.g. "peak=123 rest=45").
// Reading a key the line does not have fails the current test (naming the
// key and the line) and gives 0: a missing line or field never passes as 0.
class Fields {
 public:
  explicit Fields(std::string line);
  long long operator[](const std::string& key) const;
  bool has(const std::string& key) const { return kv_.count(key) > 0; }
  const std::string& line() const { return line_; }

 private:
  std::string line_;
  std::map<std::string, long long> kv_;
};
Fields parse_kv(const std::string& line);

}  // namespace fsdp::testing
