// fsdp-cpp: the collective path (see collective_path.h).
#include "common/collective_path.h"

#include "fsdp/errors.h"

namespace fsdp::path {

const char* words(Path p) {
  switch (p) {
    case Path::TCP: return "gloo/tcp";
    case Path::CMA: return "cma (cross-memory attach)";
    case Path::TIERS: return "tiers (cma inside each host + gloo/tcp between hosts)";
  }
  return "?";
}

namespace {

// Memory readable inside a host (the CMA path, or the tiers' inside each
// host): whether its ranks also share the units' memory, and why not.
void share_or_not(const Facts& f, Choice& c) {
  if (!f.share_host) {
    c.reason += "; each rank keeps its own copy of the parameters (FSDP_SHARE_HOST=off)";
  } else if (!f.share_blocked.empty()) {
    c.reason += "; each rank keeps its own copy of the parameters: " + f.share_blocked;
  } else {
    c.host_shared = true;
    c.reason += "; units keep one copy of their parameters per host and reduce gradients where they lie";
  }
}

// The path alone, before compression is considered.
Choice choose_path_alone(const Facts& f) {
  Choice c;
  if (f.transport == "tcp") {
    c.reason = "FSDP_TRANSPORT=tcp";
    return c;
  }
  if (f.hosts_differ.empty()) {
    if (f.cma_blocked.empty()) {
      c.path = Path::CMA;
      c.reason = detail::cat("all ", f.ranks, " ranks are on this host and may read each other's memory");
      share_or_not(f, c);
      return c;
    }
    c.reason = f.cma_blocked;
    if (f.transport == "cma") c.refused = f.cma_blocked;
    return c;
  }
  if (!f.tiers) {
    c.reason = f.hosts_differ + "; tiers not composed: FSDP_TIERS=off";
    return c;
  }
  const std::string& blocked = !f.layout_blocked.empty() ? f.layout_blocked : f.tiers_blocked;
  if (blocked.empty()) {
    c.path = Path::TIERS;
    c.reason = detail::cat(f.tiers_shape.empty() ? "the hosts have equal numbers (> 1) of ranks" : f.tiers_shape,
                           ": cross-memory attach inside each host, gloo/tcp between the ranks of the same local "
                           "index");
    share_or_not(f, c);
    return c;
  }
  c.reason = detail::cat(f.hosts_differ, "; tiers not composed: ", blocked);
  if (f.transport == "cma" && f.ranks_sharing_a_host > 0)
    c.refused = detail::cat(f.hosts_differ,
                            " and the tiers (cross-memory attach inside each host, TCP between) cannot compose: ",
                            blocked);
  return c;
}

}  // namespace

std::string compression_words(const std::string& compress) {
  const char* weights = compress == "fp8" ? "float8 e4m3" : "int8";
  const char* grads = compress == "int4" ? "int4" : "int8";
  return detail::cat("parameters ", weights, ", gradients ", grads,
                     " with error feedback, blocks of 256 with fp32 scales");
}

Choice choose(const Facts& f) {
  Choice c = choose_path_alone(f);
  if (f.compress.empty() || f.compress == "off") return c;
  const std::string formats = detail::cat("(FSDP_COMPRESS=", f.compress, ": ", compression_words(f.compress), ")");
  if (c.path == Path::TIERS) {
    c.compressed = true;
    c.reason += "; between hosts compressible collectives travel quantized " + formats;
  } else if (f.hosts_differ.empty()) {
    c.reason += detail::cat("; FSDP_COMPRESS=", f.compress, " ignored: every rank is on one host, no byte crosses a host");
  } else if (c.path == Path::TCP && f.ranks_sharing_a_host == 0) {
    // One rank per host (HYBRID's replica groups, FULL_SHARD with one rank
    // a host): every byte of the flat ring crosses a host.
    c.compressed = true;
    c.reason += "; every rank is on a host of its own, so every byte of the flat ring crosses a host: compressible "
                "collectives travel quantized " + formats;
  } else {
    c.reason += detail::cat("; FSDP_COMPRESS=", f.compress, " ignored: ", f.ranks_sharing_a_host,
                            " ranks share a host with another, so the flat TCP ring mixes links inside and across "
                            "hosts; only the tiers' inter-host ring and a flat ring of one rank per host are "
                            "compressed");
  }
  return c;
}

}  // namespace fsdp::path
