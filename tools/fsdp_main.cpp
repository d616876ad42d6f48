// fsdp-cpp: the `fsdp` command. Subcommands live in tools/cmd_*.cpp.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "command.h"
#include "program.h"
#include "usage.h"
#include "fsdp/errors.h"
#include "fsdp/init.h"

namespace fsdp::tools {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}
}  // namespace fsdp::tools

static void usage(FILE* out) {
  auto cmds = fsdp::tools::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(out, "usage: fsdp <command> [args...]\n\ncommands:\n");
  for (auto& c : cmds) std::fprintf(out, "  %-10s %s\n", c.name.c_str(), c.summary.c_str());
  std::fprintf(out, "\n'fsdp <command> --help' describes one command.\n");
}

int main(int argc, char** argv) {
  // The launcher keeps the default SIGPIPE (its ranks get it back anyway).
  fsdp::InitOptions init;
  init.ignore_sigpipe = false;
  // `fsdp env` shows the environment even when a variable is wrong. `fsdp
  // run` is no rank: it reads the environment itself, the cluster's
  // variables placing its node (inside a Kubeflow pod of several processes
  // they would not place a rank), and needs nothing of init.
  const bool env_command = argc >= 2 && !std::strcmp(argv[1], "env");
  const bool run_command = argc >= 2 && !std::strcmp(argv[1], "run");
  try {
    // Reads the environment: a variable set wrong ends here, named.
    if (!env_command && !run_command) fsdp::init(init);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp: error: %s\n('fsdp env' lists every variable fsdp-cpp reads and what it allows)\n",
                 e.what());
    return 1;
  }
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (auto& c : fsdp::tools::commands()) {
    if (c.name == argv[1]) {
      std::string name = std::string("fsdp ") + argv[1];
      argv[1] = name.data();
      return fsdp::cli::run_program(name, [&] { return c.main(argc - 1, argv + 1); }, /*is_rank=*/false);
    }
  }
  std::fprintf(stderr, "fsdp: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
