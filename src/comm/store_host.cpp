// fsdp-cpp: the store a launcher hosts (see store_host.h).
#include "comm/store_host.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/heartbeat.h"
#include "comm/rendezvous.h"
#include "comm/store_client.h"
#include "fsdp/errors.h"

namespace fsdp::watchdog {
namespace {

// Each read waits at most this long. libtorch's store daemon reads each
// request whole with blocking reads (no timeout on the server's sockets), so
// a client cut off halfway through a request (a cut link) blocks it for
// good; the reader's client then stays stuck and later reads fail at once.
constexpr std::chrono::milliseconds kHostReadTimeout{2000};

}  // namespace

struct StoreHost::Impl {
  c10d::TCPStore* store = nullptr;  // the server; left to the process's exit once stuck
  int port = 0;
  std::unique_ptr<comm::StoreClient> reader;
};

StoreHost::StoreHost(const std::string& addr, int port, std::chrono::milliseconds timeout, bool bind_all)
    : impl_(std::make_unique<Impl>()) {
  impl_->store = comm::host_store(addr, port, timeout, bind_all);
  impl_->port = port;
  impl_->reader = std::make_unique<comm::StoreClient>(
      [addr, port] { return comm::connect_store_client(addr, port, kHostReadTimeout); }, kHostReadTimeout);
}

StoreHost::~StoreHost() {
  // Closing the server joins its daemon: only when it still answers. A
  // daemon that no longer does cannot be stopped: it is left to the
  // process's exit.
  if (!impl_->reader->stuck()) get("fsdp/store-host-probe");
  const bool stuck = impl_->reader->stuck();
  impl_->reader.reset();  // joined, or left behind inside its stuck call
  if (!stuck) comm::close_hosted_store(impl_->store);
}

int StoreHost::port() const { return impl_->port; }
bool StoreHost::answering() const { return !impl_->reader->stuck(); }

std::optional<std::string> StoreHost::get(const std::string& key) {
  auto v = impl_->reader->read({key}, kHostReadTimeout);
  return v ? (*v)[0] : std::nullopt;
}

std::optional<Heartbeat> StoreHost::heartbeat(const std::string& base, int rank) {
  auto v = get(base + "hb/" + std::to_string(rank));
  return v ? Heartbeat::parse(*v) : std::nullopt;
}

std::optional<Entered> StoreHost::entered(const std::string& base, int rank) {
  std::optional<Entered> best;
  for (int g = 0; g < 16; ++g) {
    auto v = get(detail::cat(base, "c", g, "/seq/", rank));
    if (!v) {
      if (!get(detail::cat(base, "c", g, "/world_size"))) break;  // no such communicator
      continue;
    }
    auto e = comm::parse_entered(*v, g);
    if (e && e->seq > 0 && (!best || e->time > best->time)) best = e;
  }
  return best;
}

std::optional<Verdict> StoreHost::verdict(const std::string& base, int rank) {
  auto v = get(base + "verdict/" + std::to_string(rank));
  return v ? Verdict::parse(*v) : std::nullopt;
}

}  // namespace fsdp::watchdog
