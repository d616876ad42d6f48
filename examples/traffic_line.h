// fsdp-cpp examples: the end-of-run traffic line by host tier that the
// trainers (gpt, tiny) print on rank 0. Not library code.
// defines: examples::traffic_by_tier_line
//
//   traffic by tier (rank 0, per step): intra-host 18.92 MiB, inter-host 6.31 MiB | intra_bytes=...
//     inter_bytes=... inter_logical_bytes=... steps=... (totals)
//
// With compression (FSDP_COMPRESS), the inter-host size is what crossed
// quantized, followed by "(X uncompressed)": what would have crossed
// (CommCounters::total_bytes_inter_host_logical); inter_logical_bytes is
// that total, equal to inter_bytes when nothing crossed quantized.
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
// across hosts, which would have been `inter_logical` uncompressed. Ends
// with a newline.
inline std::string traffic_by_tier_line(int64_t sent, int64_t inter, int64_t inter_logical, int64_t steps) {
  auto per_step = [&](int64_t b) { return fsdp::memory::format_bytes(steps > 0 ? b / steps : 0); };
  const std::string logical = inter_logical != inter ? " (" + per_step(inter_logical) + " uncompressed)" : "";
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "traffic by tier (rank 0, per step): intra-host %s, inter-host %s%s | intra_bytes=%lld "
                "inter_bytes=%lld inter_logical_bytes=%lld steps=%lld (totals)\n",
                per_step(sent - inter).c_str(), per_step(inter).c_str(), logical.c_str(), (long long)(sent - inter),
                (long long)inter, (long long)inter_logical, (long long)steps);
  return buf;
}

}  // namespace examples
