// fsdp-cpp command-line tools: usage errors and the byte sizes flags take.
// defines: fsdp::UsageError, fsdp::cli::parse_bytes
//
// Not part of the library: the `fsdp` command, the examples and the test
// worker share these. A UsageError is a bad flag or value; every command
// exits with code 2 for one (the library's own errors are fsdp::Error).
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>

#include "fsdp/errors.h"

namespace fsdp {

// A command-line usage error (bad flag or value): tools exit with code 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

namespace cli {

// "2GiB", "512M", "1e9" -> bytes; throws UsageError on bad input.
inline int64_t parse_bytes(const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (...) {
    throw UsageError("expected a size such as 2GiB, 512MiB or 1e9, found '" + text + "'");
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb") mult = 1024.0;
  else if (unit == "m" || unit == "mib" || unit == "mb") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib" || unit == "gb") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib" || unit == "tb") mult = 1024.0 * 1024 * 1024 * 1024;
  else
    throw UsageError("unknown size unit '" + text.substr(pos) + "' in '" + text +
                     "': use B, KiB, MiB, GiB or TiB");
  if (!(v > 0) || !std::isfinite(v))
    throw UsageError("expected a positive size, found '" + text + "'");
  // The cast below must not overflow (undefined behaviour), nor round to 0.
  if (!(v * mult < 9.0e18))
    throw UsageError("size '" + text + "' is too large; expected at most 8 EiB");
  if (v * mult < 1) throw UsageError("size '" + text + "' is less than one byte; expected a positive size");
  return static_cast<int64_t>(v * mult);
}

}  // namespace cli
}  // namespace fsdp
