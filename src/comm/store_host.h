// fsdp-cpp: the rendezvous store served from a launcher (`fsdp run` on node
// 0), and its reads of the records the ranks publish there. Not installed:
// only the launcher (tools/) and the tests use it.
// defines: watchdog::StoreHost
//
// The launcher hosts the store itself (the ranks get FSDP_STORE_HOSTED=1
// and connect to it as clients), so the heartbeats stay readable when rank
// 0 is the rank that froze.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/watchdog.h"

namespace fsdp::watchdog {

// The rendezvous store, served from this process (a launcher). Binds like
// rank 0's store would (MASTER_ADDR only, or every interface with
// `bind_all`: FSDP_STORE_BIND=all; see docs/RELIABILITY.md). Reads go
// through a bounded store client (comm/store_client.h): 2 s each, and none
// after one that timed out while the daemon stays blocked (e.g. by a
// request a cut link broke off; such a daemon is left to the process's
// exit, never joined).
class StoreHost {
 public:
  // Throws fsdp::Error when the port cannot be bound.
  StoreHost(const std::string& addr, int port, std::chrono::milliseconds timeout, bool bind_all = false);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

  // The port it serves.
  int port() const;
  bool answering() const;  // false once a read timed out
  std::optional<std::string> get(const std::string& key);  // nullopt: absent or unreadable
  // The rank's last heartbeat; nullopt when there is none or it is unreadable.
  std::optional<Heartbeat> heartbeat(const std::string& base, int rank);
  // The newest collective the rank entered over its communicators.
  std::optional<Entered> entered(const std::string& base, int rank);
  // The rank's verdict on a failed collective; nullopt when it wrote none.
  std::optional<Verdict> verdict(const std::string& base, int rank);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::watchdog
