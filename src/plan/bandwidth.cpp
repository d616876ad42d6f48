// fsdp-cpp planner: how fast this host moves bytes between two processes.
//
// A loopback TCP stream is what Gloo's TCP transport uses between ranks on
// one machine, so its rate bounds the collectives' rate here.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <thread>
#include <vector>

#include "fsdp/errors.h"
#include "fsdp/plan.h"

namespace fsdp::plan {
namespace {

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

[[noreturn]] void sys_fail(const char* what) {
  throw Error(std::string("plan --measure: ") + what + " failed: " + std::strerror(errno) +
              ". Use --bandwidth RATE (e.g. 2GB/s) instead.");
}

}  // namespace

double measure_loopback_bandwidth(int64_t bytes) {
  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  if (listener.fd < 0) sys_fail("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // any free port
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) sys_fail("bind");
  if (::listen(listener.fd, 1) != 0) sys_fail("listen");
  socklen_t len = sizeof addr;
  if (::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) sys_fail("getsockname");

  Fd client(::socket(AF_INET, SOCK_STREAM, 0));
  if (client.fd < 0) sys_fail("socket");
  if (::connect(client.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) sys_fail("connect");
  Fd server(::accept(listener.fd, nullptr, nullptr));
  if (server.fd < 0) sys_fail("accept");

  const size_t chunk = 1 << 20;
  std::vector<char> out(chunk, 1), in(chunk);
  int64_t received = 0;
  bool recv_failed = false;
  auto t0 = std::chrono::steady_clock::now();
  std::thread reader([&] {
    while (received < bytes) {
      ssize_t n = ::recv(server.fd, in.data(), in.size(), 0);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        recv_failed = true;
        return;
      }
      received += n;
    }
  });
  int64_t sent = 0;
  while (sent < bytes) {
    ssize_t n = ::send(client.fd, out.data(), std::min<int64_t>(chunk, bytes - sent), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::shutdown(client.fd, SHUT_RDWR);
      reader.join();
      sys_fail("send");
    }
    sent += n;
  }
  reader.join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FSDP_USER_CHECK(!recv_failed, "plan --measure: the loopback connection closed early. Use --bandwidth RATE instead.");
  return bytes / std::max(s, 1e-9);
}

namespace {

struct Unit {
  const char* name;
  double multiplier;
};

// "<number><unit>" with the unit one of `units` (after any of `suffixes` is
// cut off the end): the number times the unit's multiplier, or nothing when
// the text is not that or the rate is not a finite positive number.
std::optional<double> parse_rate(std::string t, std::initializer_list<const char*> suffixes,
                                 std::initializer_list<Unit> units) {
  t.erase(std::remove(t.begin(), t.end(), ' '), t.end());
  for (const char* suffix : suffixes) {
    const size_t n = std::strlen(suffix);
    if (t.size() > n && t.compare(t.size() - n, n, suffix) == 0) {
      t.resize(t.size() - n);
      break;
    }
  }
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(t, &pos);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  for (const Unit& u : units)
    if (t.compare(pos, std::string::npos, u.name) == 0) {
      const double rate = v * u.multiplier;
      if (!(v > 0) || !std::isfinite(rate)) return std::nullopt;
      return rate;
    }
  return std::nullopt;
}

}  // namespace

double parse_bandwidth(const std::string& text) {
  if (auto rate = parse_rate(text, {"/s", "ps"},
                             {{"", 1},           {"B", 1},          {"KB", 1e3},       {"MB", 1e6},       {"GB", 1e9},
                              {"KiB", 1024.0},   {"MiB", 1 << 20},  {"GiB", 1 << 30},  {"Kbit", 1e3 / 8}, {"Mbit", 1e6 / 8},
                              {"Gbit", 1e9 / 8}, {"Gb", 1e9 / 8},   {"Mb", 1e6 / 8}}))
    return *rate;
  throw Error("--bandwidth: expected a rate such as 2GB/s, 500MiB/s, 10Gbit/s or 1e9 (bytes/s), found '" + text + "'");
}

double parse_flop_rate(const std::string& text) {
  if (auto rate = parse_rate(text, {"FLOP/s", "FLOPS", "flop/s", "flops"},
                             {{"", 1}, {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}}))
    return *rate;
  throw Error("--compute: expected an achieved rate per rank such as 400TFLOP/s, 400TFLOPS, 50GFLOP/s or 4e14 "
              "(FLOP/s), found '" + text + "'");
}

std::string format_bandwidth(double bps) {
  char buf[64];
  if (bps >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB/s", bps / 1e9);
  else if (bps >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f MB/s", bps / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.0f B/s", bps);
  return buf;
}

}  // namespace fsdp::plan
