// fsdp-cpp: the listening socket of a rendezvous store (see store_listen.h).
#include "comm/store_listen.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

// A socket bound to `a` (port set) and listening, or -1 with errno.
int bind_listen(const sockaddr* a, socklen_t len) {
  int fd = socket(a->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (a->sa_family == AF_INET6) {
    int v6only = 0;  // the wildcard form also takes IPv4 peers
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
  }
  if (bind(fd, a, len) != 0 || listen(fd, SOMAXCONN) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

void set_port(sockaddr_storage* ss, int port) {
  if (ss->ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(ss)->sin_port = htons(static_cast<uint16_t>(port));
  if (ss->ss_family == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(ss)->sin6_port = htons(static_cast<uint16_t>(port));
}

}  // namespace

int listen_for_store(const std::string& master_addr, int port, bool bind_all) {
  int in_use = 0;
  if (!bind_all) {
    // The first of MASTER_ADDR's addresses that this host can bind.
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(master_addr.c_str(), nullptr, &hints, &res) == 0) {
      for (addrinfo* a = res; a; a = a->ai_next) {
        if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
        sockaddr_storage ss{};
        std::memcpy(&ss, a->ai_addr, a->ai_addrlen);
        set_port(&ss, port);
        int fd = bind_listen(reinterpret_cast<sockaddr*>(&ss), a->ai_addrlen);
        if (fd >= 0) {
          freeaddrinfo(res);
          return fd;
        }
        if (errno == EADDRINUSE) in_use = errno;
      }
      freeaddrinfo(res);
    }
    if (in_use)
      throw Error(detail::cat("port ", port, " of ", master_addr, " is in use (", std::strerror(in_use), ")"));
    std::fprintf(stderr,
                 "fsdp: warning: MASTER_ADDR '%s' is not an address of this host, so the rendezvous store "
                 "listens on every interface at port %d; on a shared network see docs/RELIABILITY.md\n",
                 master_addr.c_str(), port);
  }
  sockaddr_in6 any{};
  any.sin6_family = AF_INET6;
  any.sin6_addr = in6addr_any;
  any.sin6_port = htons(static_cast<uint16_t>(port));
  int fd = bind_listen(reinterpret_cast<sockaddr*>(&any), sizeof any);
  if (fd >= 0) return fd;
  sockaddr_in any4{};
  any4.sin_family = AF_INET;
  any4.sin_addr.s_addr = htonl(INADDR_ANY);
  any4.sin_port = htons(static_cast<uint16_t>(port));
  fd = bind_listen(reinterpret_cast<sockaddr*>(&any4), sizeof any4);
  if (fd >= 0) return fd;
  throw Error(detail::cat("cannot listen on port ", port, " of every interface (", std::strerror(errno), ")"));
}

std::string token_fingerprint(const std::string& token) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : "fsdp-job:" + token) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace fsdp::comm
