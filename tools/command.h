// fsdp-cpp: the `fsdp` command's subcommand registry.
// defines: Command, CommandRegistrar, FSDP_COMMAND
//
// Each tools/cmd_*.cpp registers one subcommand:
//   FSDP_COMMAND(run, "start N ranks of a program (torchrun conventions)", cmd_run);
// main() dispatches on argv[1]; the subcommand sees argv shifted by one
// (argv[0] == "fsdp run").
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace fsdp::tools {

struct Command {
  std::string name;
  std::string summary;
  std::function<int(int, char**)> main;
};

std::vector<Command>& commands();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string summary, std::function<int(int, char**)> fn) {
    commands().push_back({std::move(name), std::move(summary), std::move(fn)});
  }
};

}  // namespace fsdp::tools

#define FSDP_COMMAND(name, summary, fn) \
  static ::fsdp::tools::CommandRegistrar fsdp_command_registrar_##name(#name, summary, fn)
