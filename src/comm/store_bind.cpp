// fsdp-cpp: bind rank 0's rendezvous store to MASTER_ADDR (see store_bind.h).
#include "comm/store_bind.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace fsdp::comm {
namespace {

// The one armed rewrite. Written under g_mu before g_armed is set; read by
// bind() only after seeing g_armed (acquire).
std::mutex g_mu;
std::atomic<bool> g_armed{false};
int g_port = 0;
sockaddr_in g_v4{};
sockaddr_in6 g_v6{};
bool g_has_v4 = false, g_has_v6 = false;
std::atomic<int> g_rewritten{0};

// Can this host bind `a` (is it one of our addresses)?
bool is_local(const sockaddr* a, socklen_t len) {
  int fd = socket(a->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_storage probe{};
  std::memcpy(&probe, a, len);
  if (a->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(&probe)->sin_port = 0;
  if (a->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&probe)->sin6_port = 0;
  using BindFn = int (*)(int, const sockaddr*, socklen_t);
  static BindFn real = reinterpret_cast<BindFn>(dlsym(RTLD_NEXT, "bind"));
  bool ok = real && real(fd, reinterpret_cast<sockaddr*>(&probe), len) == 0;
  close(fd);
  return ok;
}

}  // namespace

StoreBindGuard::StoreBindGuard(const std::string& master_addr, int port) {
  g_mu.lock();  // one store server starts at a time; unlocked by the destructor
  const char* mode = std::getenv("FSDP_STORE_BIND");
  if (mode && std::strcmp(mode, "all") == 0) return;
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  g_has_v4 = g_has_v6 = false;
  if (getaddrinfo(master_addr.c_str(), nullptr, &hints, &res) == 0) {
    for (addrinfo* a = res; a; a = a->ai_next) {
      if (a->ai_family == AF_INET && !g_has_v4 && is_local(a->ai_addr, a->ai_addrlen)) {
        std::memcpy(&g_v4, a->ai_addr, sizeof g_v4);
        g_has_v4 = true;
      } else if (a->ai_family == AF_INET6 && !g_has_v6 && is_local(a->ai_addr, a->ai_addrlen)) {
        std::memcpy(&g_v6, a->ai_addr, sizeof g_v6);
        g_has_v6 = true;
      }
    }
    freeaddrinfo(res);
  }
  if (!g_has_v4 && !g_has_v6) {
    std::fprintf(stderr,
                 "fsdp: warning: MASTER_ADDR '%s' is not an address of this host, so the rendezvous store "
                 "listens on every interface at port %d; on a shared network see docs/RELIABILITY.md\n",
                 master_addr.c_str(), port);
    return;
  }
  // An IPv6 wildcard socket (TCPStore tries IPv6 first, dual-stack) can take
  // the IPv4 master address in its mapped form ::ffff:a.b.c.d.
  if (g_has_v4 && !g_has_v6) {
    g_v6 = sockaddr_in6{};
    g_v6.sin6_family = AF_INET6;
    g_v6.sin6_addr.s6_addr[10] = 0xff;
    g_v6.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&g_v6.sin6_addr.s6_addr[12], &g_v4.sin_addr, 4);
    g_has_v6 = true;
  }
  g_port = port;
  g_armed.store(true, std::memory_order_release);
}

StoreBindGuard::~StoreBindGuard() {
  g_armed.store(false, std::memory_order_release);
  g_mu.unlock();
}

int StoreBindGuard::rewritten() { return g_rewritten.load(); }

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

// Called from the interposed bind(): the address to bind instead, or null.
const sockaddr* store_bind_rewrite(const sockaddr* addr, socklen_t len, socklen_t* out_len) {
  if (!g_armed.load(std::memory_order_acquire) || !addr) return nullptr;
  if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    if (!g_has_v4 || in->sin_addr.s_addr != htonl(INADDR_ANY) || ntohs(in->sin_port) != g_port) return nullptr;
    static thread_local sockaddr_in out;
    out = g_v4;
    out.sin_port = in->sin_port;
    *out_len = sizeof out;
    ++g_rewritten;
    return reinterpret_cast<const sockaddr*>(&out);
  }
  if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    if (!g_has_v6 || std::memcmp(&in6->sin6_addr, &in6addr_any, sizeof in6addr_any) != 0 ||
        ntohs(in6->sin6_port) != g_port)
      return nullptr;
    static thread_local sockaddr_in6 out;
    out = g_v6;
    out.sin6_port = in6->sin6_port;
    *out_len = sizeof out;
    ++g_rewritten;
    return reinterpret_cast<const sockaddr*>(&out);
  }
  return nullptr;
}

}  // namespace fsdp::comm

// The interposed bind(): an executable's definition precedes libc's for every
// shared library of the process (libtorch's TCPStore included). It passes
// every call through unless a StoreBindGuard is armed for that port.
extern "C" int bind(int fd, const sockaddr* addr, socklen_t len) noexcept {
  using BindFn = int (*)(int, const sockaddr*, socklen_t);
  static BindFn real = reinterpret_cast<BindFn>(dlsym(RTLD_NEXT, "bind"));
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  socklen_t new_len = len;
  if (const sockaddr* a = fsdp::comm::store_bind_rewrite(addr, len, &new_len)) return real(fd, a, new_len);
  return real(fd, addr, len);
}
