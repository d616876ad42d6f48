// fsdp-cpp: `fsdp run -n N [...] -- PROGRAM ARGS...` (see launcher.h).
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cli_checks.h"
#include "usage.h"
#include "command.h"
#include "config/cluster_env.h"
#include "fsdp/config.h"
#include "fsdp/errors.h"
#include "launcher.h"

namespace fsdp::tools {
namespace {

// Which of the node's flags the user gave.
struct Given {
  bool nnodes, node_rank, master_addr, master_port;
};

// Inside a Slurm step (one task per node) or a Kubeflow pod, the node's
// place comes from the cluster's variables (config/cluster_env.h) where no
// flag says it: --master-addr and --master-port win; --nnodes, --node-rank
// and -n must agree with them. Says which launcher placed it.
void place_node(LaunchOptions& o, const Given& given) {
  config::NodeLaunch n;
  try {
    n = config::detect_node_launch([](const char* name) -> const char* {
      const char* v = std::getenv(name);  // the `fsdp` command is an edge; unset or empty: not said
      return v && *v ? v : nullptr;
    });
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (n.launcher.empty()) return;
  const bool slurm = n.launcher == "slurm";
  const char* by = slurm ? "Slurm (this srun step)" : "Kubeflow (this PyTorchJob's pod)";
  // A value no flag gave comes from the cluster; one a flag gave must match it.
  auto take_from_cluster = [&](bool flag, int& value, int cluster, const char* name, const char* var,
                               const std::string& fix) {
    if (!flag) {
      value = cluster;
    } else if (value != cluster) {
      throw UsageError(detail::cat(name, " ", value, " contradicts ", var, "=", cluster, " set by ", by, ": ", fix));
    }
  };
  auto drop = [](const char* name, const char* var) {
    return detail::cat("drop ", name, " (fsdp run reads ", var, ", which the cluster sets for each node)");
  };
  take_from_cluster(given.nnodes, o.nnodes, n.nnodes, "--nnodes", slurm ? "SLURM_NNODES" : "PET_NNODES",
                    drop("--nnodes", slurm ? "SLURM_NNODES" : "PET_NNODES"));
  take_from_cluster(given.node_rank, o.node_rank, n.node_rank, "--node-rank",
                    slurm ? "SLURM_NODEID" : "PET_NODE_RANK",
                    drop("--node-rank", slurm ? "SLURM_NODEID" : "PET_NODE_RANK"));
  if (n.nproc_per_node)
    take_from_cluster(true, o.nproc, n.nproc_per_node, "-n", "PET_NPROC_PER_NODE",
                      detail::cat("pass -n ", n.nproc_per_node,
                                  " (the PyTorchJob's nprocPerNode), or set nprocPerNode to ", o.nproc));
  // One node picks its own free port, as without a cluster.
  if (n.nnodes > 1) {
    if (!given.master_addr && !n.master_addr.empty()) o.master_addr = n.master_addr;
    if (!given.master_port && n.master_port) o.master_port = n.master_port;
  }
  std::fprintf(stderr, "fsdp run: launcher: %s\n", n.describe().c_str());
}

// --nnodes: N, or MIN:MAX (torchrun's form); the ranges: launch().
CLI::Validator nnodes_check() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        auto is_int = [](const std::string& t) {
          errno = 0;
          char* end = nullptr;
          const long long v = std::strtoll(t.c_str(), &end, 10);
          return !t.empty() && end != t.c_str() && *end == '\0' && errno != ERANGE && v >= INT32_MIN &&
                 v <= INT32_MAX;
        };
        const size_t colon = s.find(':');
        if (colon == std::string::npos) return is_int(s) ? "" : "expected an integer, found '" + s + "'";
        if (is_int(s.substr(0, colon)) && is_int(s.substr(colon + 1))) return "";
        return "expected N or MIN:MAX with two integers (e.g. 1:2), found '" + s + "'";
      },
      "N|MIN:MAX");
}

int cmd_run(int argc, char** argv) {
  // Everything after the first "--" is the program's, never ours.
  LaunchOptions o;
  int ours = argc;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--")) {
      ours = i;
      break;
    }
  for (int i = ours + 1; i < argc; ++i) o.argv.push_back(argv[i]);

  CLI::App app("Start N ranks of PROGRAM on this node with torchrun's environment "
               "(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).",
               "fsdp run");
  app.add_option("-n,--nproc-per-node", o.nproc, "ranks to start on this node")
      ->required()
      ->check(cli::integer());  // the range: launch() (-n must be at least 1 ...)
  std::string nnodes;
  app.add_option("--nnodes", nnodes,
                 "nodes in the job: N, or MIN:MAX for an elastic job that shrinks to MIN nodes when nodes are lost "
                 "and grows back to MAX at a restart (default 1; in a Slurm step or a Kubeflow pod: the cluster's)")
      ->check(nnodes_check());
  app.add_option("--node-rank", o.node_rank,
                 "this node's index in [0, nnodes) (default 0; in a Slurm step or a Kubeflow pod: the cluster's)")
      ->check(cli::integer());  // range checked by launch()
  app.add_option("--master-addr", o.master_addr,
                 "host of rank 0 (default 127.0.0.1; on several nodes of a Slurm step: the first host of its list; "
                 "in a Kubeflow pod: MASTER_ADDR)");
  app.add_option("--master-port", o.master_port,
                 "port of the rendezvous store (default: a free port; on several nodes of a Slurm step: 20000 + job "
                 "id mod 20000; in a Kubeflow pod: MASTER_PORT)")
      ->check(cli::integer(1, 65535));
  app.add_option("--threads", o.threads, "threads per rank (default: cores / ranks)")
      ->check(cli::integer(1, 4096));
  app.add_option("--max-restarts", o.max_restarts,
                 "restart every rank this many times when one fails (FSDP_RESTART_COUNT=k)")
      ->check(cli::integer(0, 1000000));
  app.add_option("--rdzv-settle", o.rdzv_settle_s,
                 "elastic: once MIN nodes joined a round, seconds to wait for more before it starts (default 2)")
      ->check(cli::real(0, 3600));
  app.add_option("--rdzv-timeout", o.rdzv_timeout_s,
                 "elastic: seconds a round waits for MIN nodes before the job ends (default 60)")
      ->check(cli::real(0.1, 86400));
  app.add_option("--grace", o.grace_s, "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->check(cli::real(0, 3600));
  app.add_option("--flight-dir", o.flight_dir,
                 "where the ranks dump their flight recorders (FSDP_FLIGHT_DIR): on a failure, or on SIGUSR1 to "
                 "this launcher, and where the launcher writes what it found (launcher-node<k>.json; default: "
                 "FSDP_FLIGHT_DIR, else the program's choice: the trainers use <ckpt-dir>/flight)");
  app.footer("Example: fsdp run -n 4 -- build/bin/tiny --steps 10");
  app.prefix_command();  // without "--", the first positional starts the program
  try {
    app.parse(ours, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "fsdp run: error: %s\nRun 'fsdp run --help' for the options.\n", e.what());
    return 2;
  }
  // Without --flight-dir, FSDP_FLIGHT_DIR (which the ranks inherit) names
  // their folder, and the launcher's finding goes there too. Only that
  // variable is read here: the others are the ranks' to check.
  if (o.flight_dir.empty())
    o.flight_dir = fsdp::config::parse_env([](const char* name) -> const char* {
                     return std::strcmp(name, "FSDP_FLIGHT_DIR") == 0 ? std::getenv(name) : nullptr;
                   }).flight_dir;
  // Before "--" only our options; an unknown one is a mistake, not the program.
  const std::vector<std::string> extra = app.remaining();
  if (!extra.empty() && (ours < argc || extra[0].rfind("-", 0) == 0)) {
    std::fprintf(stderr,
                 "fsdp run: error: unexpected '%s' before the program; fsdp run takes -n, --nnodes, "
                 "--node-rank, --master-addr, --master-port, --threads, --max-restarts, --rdzv-settle, --rdzv-timeout, "
                 "--grace and --flight-dir, then "
                 "-- PROGRAM ARGS...\nRun 'fsdp run --help' for the options.\n",
                 extra[0].c_str());
    return 2;
  }
  if (o.argv.empty()) o.argv = extra;
  if (!nnodes.empty()) {
    const size_t colon = nnodes.find(':');
    o.nnodes = std::atoi(nnodes.c_str() + (colon == std::string::npos ? 0 : colon + 1));
    if (colon != std::string::npos) {
      const int lo = std::atoi(nnodes.substr(0, colon).c_str());
      if (lo < 1) {
        std::fprintf(stderr, "fsdp run: error: --nnodes %s: MIN must be at least 1, found %d; expected MIN:MAX with "
                             "1 <= MIN <= MAX (e.g. 1:2)\n", nnodes.c_str(), lo);
        return 2;
      }
      o.min_nodes = lo;
    }
  }
  try {
    place_node(o, {app.count("--nnodes") > 0, app.count("--node-rank") > 0, app.count("--master-addr") > 0,
                   app.count("--master-port") > 0});
    return launch(std::move(o));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "fsdp run: error: %s\n", e.what());
    return 2;
  }
}

}  // namespace
}  // namespace fsdp::tools

FSDP_COMMAND(run, "start N ranks of a program (torchrun conventions)", fsdp::tools::cmd_run);
