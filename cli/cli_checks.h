// fsdp-cpp: what every command-line program (the fsdp command, the
// examples) does with CLI11: value checks with one clear message for a bad
// value, and the one parse that turns --help and usage errors into exit codes.
// defines: fsdp::cli::integer, fsdp::cli::real, fsdp::cli::usage_error,
//          fsdp::cli::parse
//
// CLI11's own PositiveNumber / Range(double) print the range as a 300-digit
// number and let "nan" through. These name what is allowed and what was
// found, e.g. "--steps: expected an integer in [0, 1000000000000], found '-1'",
// reject nan / inf and any trailing text, and run before the conversion, so a
// number too large for the option's type gets the same message.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace fsdp::cli {

// An integer in [lo, hi] (decimal).
inline CLI::Validator integer(int64_t lo, int64_t hi) {
  const std::string allowed = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, allowed](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || end == s.c_str() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
          return "expected " + allowed + ", found '" + s + "'";
        return std::string();
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

// Any integer that fits an int (the caller checks the range with its own
// message): "expected an integer, found 'x'".
inline CLI::Validator integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || end == s.c_str() || *end != '\0' || errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
          return "expected an integer, found '" + s + "'";
        return std::string();
      },
      "INT");
}

// A finite number in [lo, hi].
inline CLI::Validator real(double lo, double hi) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "[%g, %g]", lo, hi);
  const std::string range = buf;
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end == s.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < lo ||
            v > hi)
          return "expected a number in " + range + ", found '" + s + "'";
        return std::string();
      },
      "NUMBER in " + range);
}

// A usage error of program `name` (a bad flag or value), said on stderr the
// way every fsdp-cpp program says it:
//   <name>: usage error: <what>
//   run '<name> --help' for the flags
// Returns 2, the exit code of a usage error.
inline int usage_error(const std::string& name, const std::string& what) {
  std::fprintf(stderr, "%s: usage error: %s\nrun '%s --help' for the flags\n", name.c_str(), what.c_str(),
               name.c_str());
  return 2;
}

// Parses argv into `app` (named: CLI::App{"...", "fsdp plan"}). Returns the
// exit code to return now, or nullopt to go on: after --help (printed) 0,
// after a usage error (said as usage_error says it; a command with
// subcommands points at theirs too) 2.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help-all, --version
    const std::string name = app.get_name();
    if (app.get_subcommands([](CLI::App*) { return true; }).empty()) return usage_error(name, e.what());
    std::fprintf(stderr, "%s: usage error: %s\nrun '%s --help' (or '%s SUBCOMMAND --help') for the flags\n",
                 name.c_str(), e.what(), name.c_str(), name.c_str());
    return 2;
  }
}

}  // namespace fsdp::cli
