// fsdp-cpp examples: the end-of-run traffic line by host tier that the
// trainers (gpt, tiny) print on rank 0. Not library code.
// defines: examples::traffic_by_tier_line
//
//   traffic by tier (rank 0, per step): intra-host 18.92 MiB, inter-host 6.31 MiB | intra_bytes=...
//     inter_bytes=... steps=... (totals)
//
// The sizes are per training step, the integers the totals over the steps
// (exact, for the tests: tests/test_hybrid.cpp checks them against the
// formulas). Tiers as the communicator counts them
// (CommCounters::total_bytes_inter_host: a collective's bytes to a rank of
// another host).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "fsdp/memory.h"

namespace examples {

// `sent` bytes this rank sent in `steps` training steps, `inter` of them
// across hosts. Ends with a newline.
inline std::string traffic_by_tier_line(int64_t sent, int64_t inter, int64_t steps) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "traffic by tier (rank 0, per step): intra-host %s, inter-host %s | intra_bytes=%lld "
                "inter_bytes=%lld steps=%lld (totals)\n",
                fsdp::memory::format_bytes(steps > 0 ? (sent - inter) / steps : 0).c_str(),
                fsdp::memory::format_bytes(steps > 0 ? inter / steps : 0).c_str(), (long long)(sent - inter),
                (long long)inter, (long long)steps);
  return buf;
}

}  // namespace examples
