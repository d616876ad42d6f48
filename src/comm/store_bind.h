// fsdp-cpp: bind rank 0's rendezvous store to MASTER_ADDR.
// defines: StoreBindGuard, token_fingerprint
//
// libtorch 1.13's c10d::TCPStore has no bind-address option: its server binds
// the wildcard address (every interface), so anyone who can reach the host can
// talk to the store. While a StoreBindGuard lives, this process's bind() of a
// wildcard address on exactly that port is rewritten to the master's address
// (an IPv6 wildcard socket gets the IPv4-mapped form, which the dual-stack
// socket TCPStore opens accepts). We interpose bind() (see store_bind.cpp):
// every other bind() passes through untouched.
//
// When MASTER_ADDR is not an address of this host (a NAT, a name that
// resolves elsewhere) or FSDP_STORE_BIND=all, nothing is rewritten and a
// warning says the store listens on every interface.
#pragma once

#include <string>

namespace fsdp::comm {

class StoreBindGuard {
 public:
  StoreBindGuard(const std::string& master_addr, int port);
  ~StoreBindGuard();
  StoreBindGuard(const StoreBindGuard&) = delete;
  StoreBindGuard& operator=(const StoreBindGuard&) = delete;

  // The bind() calls this guard rewrote so far (tests, messages).
  static int rewritten();
};

// A short public fingerprint of a secret token (FNV-1a 64, hex); it lets ranks
// compare tokens through the store without publishing them.
std::string token_fingerprint(const std::string& token);

}  // namespace fsdp::comm
