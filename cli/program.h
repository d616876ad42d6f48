// fsdp-cpp: how a command-line program says what stopped it, in one place
// for the fsdp command and the examples.
// defines: fsdp::cli::rank_words, fsdp::cli::run_program
//
//   int main(int argc, char** argv) {
//     return fsdp::cli::run_program("llama", [&] { return llama::run(argc, argv); });
//   }
#pragma once

#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include "cli_checks.h"
#include "fsdp/config.h"
#include "usage.h"

namespace fsdp::cli {

// " (rank R)" for a process a launcher placed (the rank as the library
// reads it: RANK, or Slurm's, MPI's, ...; fsdp/config.h), "" otherwise.
inline std::string rank_words() {
  try {
    const config::EnvConfig env = config::read_env();
    return env.world_from_env ? " (rank " + std::to_string(env.rank) + ")" : std::string();
  } catch (const std::exception&) {
    return {};  // the environment itself is wrong: that is the error being said
  }
}

// Runs `body` and returns its exit code; what it throws becomes one message
// on stderr and an exit code:
//   fsdp::UsageError   "<name>: usage error: <what>"        2 (usage_error)
//   anything else      "<name>: error (rank R): <what>"     1
//                      (libtorch's errors without their C++ backtrace;
//                      the rank only for a program that runs as a rank)
inline int run_program(const std::string& name, const std::function<int()>& body, bool is_rank = true) {
  try {
    return body();
  } catch (const UsageError& e) {
    return usage_error(name, e.what());
  } catch (const c10::Error& e) {
    const std::string rank = is_rank ? rank_words() : std::string();
    std::fprintf(stderr, "%s: error%s: %s\n", name.c_str(), rank.c_str(), e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    const std::string rank = is_rank ? rank_words() : std::string();
    std::fprintf(stderr, "%s: error%s: %s\n", name.c_str(), rank.c_str(), e.what());
    return 1;
  }
}

}  // namespace fsdp::cli
