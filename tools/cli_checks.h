// fsdp-cpp: CLI11 value checks with one clear message for a bad value.
// defines: fsdp::cli::integer, fsdp::cli::real
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

}  // namespace fsdp::cli
