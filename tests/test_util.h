// fsdp-cpp tests: start ranks as processes and collect what they print.
// defines: ProcResult, run_command, run_ranks, bin_path, lines_with, parse_kv
#pragma once

#include <map>
#include <string>
#include <vector>

namespace fsdp::testing {

struct ProcResult {
  int exit_code = -1;  // 128+signal when killed
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

std::string bin_path(const std::string& name);  // build/bin/<name>
std::string source_path(const std::string& rel);

// Runs `argv` (no shell), with extra "K=V" environment entries, killing it
// after timeout_s. Captures stdout+stderr.
ProcResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
                       double timeout_s = 120);

// `fsdp run -n N -- fsdp_test_worker <scenario> args...`
ProcResult run_ranks(int n, const std::string& scenario, const std::vector<std::string>& args = {},
                     const std::vector<std::string>& env = {}, double timeout_s = 120);

// Whether ranks on this host may move bytes by cross-memory attach: two
// ranks with FSDP_TRANSPORT=auto chose it (run once, then cached).
bool cma_available();

// Lines of `text` that contain `needle`.
std::vector<std::string> lines_with(const std::string& text, const std::string& needle);

// The integer fields "key=value" of one printed line (e.g. "peak=123 rest=45").
std::map<std::string, long long> parse_kv(const std::string& line);

}  // namespace fsdp::testing
