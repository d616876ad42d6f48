// fsdp-cpp: the world read from the environment (see world_env.h).
#include "comm/world_env.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi)
    throw Error(detail::cat(name, "='", v, "' is not an integer in [", lo, ", ", hi,
                            "]; start ranks with `fsdp run` or set it correctly"));
  return static_cast<int>(x);
}

std::chrono::milliseconds env_seconds(const char* name, std::chrono::milliseconds fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  if (*end || !std::isfinite(s) || s <= 0 || s > 86400 * 7)
    throw Error(detail::cat(name, "='", v, "' is not a positive number of seconds (e.g. 30 or 2.5)"));
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(s * 1000)));
}

}  // namespace

WorldEnv read_world_env() {
  WorldEnv w;
  w.from_env = env("RANK") && env("WORLD_SIZE");
  w.world_size = env_int("WORLD_SIZE", 1, 1, 1 << 20);
  w.rank = env_int("RANK", 0, 0, 1 << 20);
  if (w.rank >= w.world_size)
    throw Error(detail::cat("RANK=", w.rank, " is not below WORLD_SIZE=", w.world_size,
                            "; every rank must be in [0, WORLD_SIZE)"));
  w.local_world_size = env_int("LOCAL_WORLD_SIZE", w.from_env ? w.world_size : 1, 1, w.world_size);
  w.local_rank = env_int("LOCAL_RANK", w.rank % w.local_world_size, 0, 1 << 20);
  if (w.local_rank >= w.local_world_size)
    throw Error(detail::cat("LOCAL_RANK=", w.local_rank, " is not below LOCAL_WORLD_SIZE=",
                            w.local_world_size));
  if (const char* a = env("MASTER_ADDR")) w.master_addr = a;
  w.master_port = env_int("MASTER_PORT", w.master_port, 1, 65535);
  return w;
}

ResolvedOptions resolve_options(const CommOptions& opts) {
  ResolvedOptions r;
  r.timeout = env_seconds("FSDP_TIMEOUT", opts.timeout);
  if (r.timeout.count() <= 0)
    throw Error(detail::cat("CommOptions::timeout must be positive, found ", r.timeout.count(), " ms"));
  r.rendezvous_timeout = env_seconds("FSDP_RENDEZVOUS_TIMEOUT", std::chrono::seconds(60));
  r.ifname = opts.ifname;
  if (const char* i = env("GLOO_SOCKET_IFNAME")) r.ifname = i;
  if (const char* d = env("FSDP_DEBUG")) {
    std::string v = d;
    for (auto& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (v == "detail")
      r.debug_detail = r.debug_info = true;
    else if (v == "info")
      r.debug_info = true;
    else if (v != "off" && v != "0")
      throw Error(detail::cat("FSDP_DEBUG='", d, "' is not a known level; expected off or detail "
                              "(detail checks that every rank issues the same collective)"));
  }
  if (const char* t = env("FSDP_TRANSPORT")) {
    r.transport = t;
    for (auto& ch : r.transport) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (r.transport != "auto" && r.transport != "tcp" && r.transport != "cma")
      throw Error(detail::cat("FSDP_TRANSPORT='", t, "' is not a known transport; expected auto (the default: "
                              "cma when every rank is on this host and may read its peers' memory, else tcp), "
                              "tcp (Gloo over TCP) or cma (cross-memory attach between ranks of one host)"));
  }
  if (const char* t = env("FSDP_TIERS")) {
    std::string v = t;
    for (auto& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (v == "off" || v == "0")
      r.tiers = false;
    else if (v != "on" && v != "1")
      throw Error(detail::cat("FSDP_TIERS='", t, "' is not known; expected on (the default: across hosts, "
                              "cross-memory attach inside each host and TCP between) or off (TCP for everything "
                              "across hosts)"));
  }
  if (const char* t = env("FSDP_JOB_TOKEN")) {
    r.job_token = t;
    bool ok = r.job_token.size() >= 16 && r.job_token.size() <= 128;
    for (char ch : r.job_token) ok &= std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_';
    if (!ok)
      throw Error(detail::cat("FSDP_JOB_TOKEN has ", r.job_token.size(),
                              " characters; expected 16 to 128 of [A-Za-z0-9_-] (e.g. `openssl rand -hex 16`), "
                              "the same on every node of the job"));
  }
  return r;
}

}  // namespace fsdp::comm
