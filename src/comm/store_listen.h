// fsdp-cpp: the listening socket of a rendezvous store, bound by us.
// defines: listen_for_store, token_fingerprint
//
// c10d::TCPStore binds the wildcard address (every interface) unless it is
// handed a socket that listens already (TCPStoreOptions::masterListenFd).
// The store's host binds MASTER_ADDR itself when that address is one of this
// host's, so only that network reaches the store. When it is not (a NAT, a
// name that resolves elsewhere) or FSDP_STORE_BIND=all, the socket listens on
// every interface and a warning says so. docs/RELIABILITY.md says what else
// to do on shared networks.
#pragma once

#include <string>

namespace fsdp::comm {

// A listening TCP socket on `port` (SOCK_CLOEXEC); the TCPStore server that
// takes it closes it. Throws fsdp::Error naming the address and errno.
// `bind_all`: FSDP_STORE_BIND=all (ResolvedOptions), every interface.
int listen_for_store(const std::string& master_addr, int port, bool bind_all);

// A short public fingerprint of a secret token (FNV-1a 64, hex); it lets ranks
// compare tokens through the store without publishing them.
std::string token_fingerprint(const std::string& token);

}  // namespace fsdp::comm
