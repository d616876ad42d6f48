// fsdp-cpp: whether CPU ranks on this host may read and map each other's
// memory, found as a run finds it, for `fsdp plan --share-host auto`.
// defines: fsdp::tools::SiblingProbe, fsdp::tools::probe_siblings
//
// A run's communicator asks its ranks (src/comm/cma_transport.cpp,
// host_shared.cpp): each reads a peer's memory with process_vm_readv (the
// cross-memory-attach path) and maps a peer's memfd taken with pidfd_getfd
// (host-shared units); both need ptrace permission over the peer, which
// Yama, seccomp or a container may refuse. `fsdp plan` has no ranks, so it
// starts two sibling processes, as `fsdp run` starts ranks, and lets one do
// both to the other.
#pragma once

#include <string>

namespace fsdp::tools {

struct SiblingProbe {
  std::string cma_blocked;    // why a rank cannot read another's memory ("" it can)
  std::string share_blocked;  // why a rank cannot map another's memory ("" it can)
};

// Forks two children of this process (each does a few system calls and
// exits) and waits for them, at most a few seconds.
SiblingProbe probe_siblings();

}  // namespace fsdp::tools
