// fsdp-cpp: `fsdp run -n N [...] -- PROGRAM ARGS...` (see launcher.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>

#include "command.h"
#include "fsdp/errors.h"
#include "launcher.h"

namespace fsdp::tools {
namespace {

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
  app.add_option("-n,--nproc-per-node", o.nproc, "ranks to start on this node")->required();
  app.add_option("--nnodes", o.nnodes, "nodes in the job (default 1)");
  app.add_option("--node-rank", o.node_rank, "this node's index in [0, nnodes) (default 0)");
  app.add_option("--master-addr", o.master_addr, "host of rank 0 (default 127.0.0.1)");
  app.add_option("--master-port", o.master_port, "port of the rendezvous store (default: a free port)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--threads", o.threads, "threads per rank (default: cores / ranks)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-restarts", o.max_restarts,
                 "restart every rank this many times when one fails (FSDP_RESTART_COUNT=k)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace", o.grace_s, "seconds between SIGTERM and SIGKILL when stopping ranks");
  app.footer("Example: fsdp run -n 4 -- build/bin/tiny --steps 10");
  app.prefix_command();  // without "--", the first positional starts the program
  try {
    app.parse(ours, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "fsdp run: error: %s\nRun 'fsdp run --help' for the options.\n", e.what());
    return 2;
  }
  if (o.argv.empty()) o.argv = app.remaining();
  try {
    return launch(std::move(o));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "fsdp run: error: %s\n", e.what());
    return 2;
  }
}

}  // namespace
}  // namespace fsdp::tools

FSDP_COMMAND(run, "start N ranks of a program (torchrun conventions)", fsdp::tools::cmd_run);
