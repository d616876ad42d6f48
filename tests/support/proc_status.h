// fsdp-cpp tests: one field of this process's /proc/self/status.
// defines: status_bytes
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace fsdp::testing {

// The "Field:   N kB" line of /proc/self/status in bytes (e.g. "VmRSS",
// "RssShmem"); -1 when the kernel gives no such line, so a check on it fails.
inline int64_t status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  const std::string key = field + ":";
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return -1;
}

}  // namespace fsdp::testing
