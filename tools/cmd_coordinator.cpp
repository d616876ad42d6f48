// `fsdp coordinator`: keeps the quorum of replica groups that come and go
// (fsdp/replicas.h). Runs on a host that holds no rank of the job (or beside
// them), until SIGINT or SIGTERM; prints one line per event (a group joins,
// is lost, comes back or restarts; a quorum's members change; a step is
// dropped; a group heals).
#include <CLI/CLI.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>

#include "cli_checks.h"
#include "command.h"
#include "fsdp/config.h"
#include "replicas/coordinator.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

int cmd_coordinator(int argc, char** argv) {
  fsdp::replicas::CoordinatorOptions o;
  double timeout_s = 10;
  bool all = false;
  CLI::App app{"Keep the quorum of replica groups: each group is one `fsdp run` (FSDP_REPLICA_GROUP=g, "
               "FSDP_COORDINATOR=host:port); a lost group costs one step, and it heals from a peer when it comes back",
               "fsdp coordinator"};
  app.add_option("--host", o.host, "the address to listen on (default 127.0.0.1; the groups' FSDP_COORDINATOR)");
  app.add_option("--port", o.port, "the port to listen on (default 29400)")->check(CLI::Range(1, 65535));
  app.add_flag("--bind-all", all, "listen on every interface");
  app.add_option("--heartbeat-timeout", timeout_s,
                 "seconds a rank may be silent before its group is dropped from the quorum; also how long a "
                 "collective across groups may take (default 10)")
      ->check(CLI::Range(0.05, 3600.0));
  app.add_option("--min-groups", o.min_groups, "groups the first quorum waits for (default 1)")
      ->check(CLI::Range(1, 1 << 20));
  if (const std::optional<int> rc = fsdp::cli::parse(app, argc, argv)) return *rc;
  o.bind_all = all;
  o.heartbeat_timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  o.log = [](const std::string& line) {
    std::printf("fsdp coordinator: %s\n", line.c_str());
    std::fflush(stdout);
  };
  try {
    o.job_token = fsdp::config::read_env().job_token;
    fsdp::replicas::Coordinator c(o);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    c.run(g_stop);
    o.log("stopped");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp coordinator: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

FSDP_COMMAND(coordinator, "keep the quorum of replica groups (per-step fault tolerance)", cmd_coordinator);
