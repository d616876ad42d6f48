// fsdp-cpp: two sibling processes try what a run's ranks do to each other's
// memory (see host_probe.h).
#include "host_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

namespace fsdp::tools {
namespace {

// What the child that offers its memory tells the one that reads it.
struct Offer {
  int64_t pid = 0;
  uint64_t addr = 0;  // a word of its memory holding `value`
  int32_t fd = -1;    // a memfd whose first word holds `value`; -1: none could be made
  int32_t fd_err = 0;
  int64_t value = 0;
};
// What the reader found: errno of each attempt, or -1 for a wrong value.
struct Verdict {
  int32_t read_err = 0;
  int32_t map_err = 0;
};

constexpr int kTimeoutMs = 5000;

// Reads exactly n bytes unless the peer is gone or timeout_ms pass.
bool read_all(int fd, void* p, size_t n, int timeout_ms) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    const int r = ::poll(&pf, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t got = ::read(fd, c, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    c += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

void write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t put = ::write(fd, c, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return;
    c += put;
    n -= static_cast<size_t>(put);
  }
}

volatile int64_t g_cell = 0;  // the word the reader reads (set in the offering child only)

// The offering child: only system calls from here to _exit.
[[noreturn]] void offer(int out, int hold, int hold_write, int64_t value) {
  ::close(hold_write);  // the parent's closing it is the signal to exit
  Offer o;
  o.pid = ::getpid();
  o.value = value;
  g_cell = value;
  o.addr = reinterpret_cast<uint64_t>(&g_cell);
  const int mfd = ::memfd_create("fsdp-plan-probe", MFD_CLOEXEC);
  void* page = MAP_FAILED;
  if (mfd >= 0 && ::ftruncate(mfd, 4096) == 0) page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  if (page != MAP_FAILED) {
    *static_cast<volatile int64_t*>(page) = value;
    o.fd = mfd;
  } else {
    o.fd_err = errno ? errno : ENOMEM;
  }
  write_all(out, &o, sizeof o);
  char c;
  while (::read(hold, &c, 1) < 0 && errno == EINTR) {
  }
  ::_exit(0);
}

// The reading child: only system calls from here to _exit.
[[noreturn]] void read_peer(int in, int out) {
  Offer o;
  if (!read_all(in, &o, sizeof o, kTimeoutMs)) ::_exit(1);
  Verdict v;
  int64_t got = 0;
  iovec local{&got, sizeof got}, far{reinterpret_cast<void*>(o.addr), sizeof got};
  errno = 0;
  if (::process_vm_readv(static_cast<pid_t>(o.pid), &local, 1, &far, 1, 0) != static_cast<ssize_t>(sizeof got))
    v.read_err = errno ? errno : EFAULT;
  else if (got != o.value)
    v.read_err = -1;
  if (o.fd < 0) {
    v.map_err = o.fd_err;
  } else {
    const int pfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(o.pid), 0));
    const int fd = pfd >= 0 ? static_cast<int>(::syscall(SYS_pidfd_getfd, pfd, o.fd, 0)) : -1;
    void* p = fd >= 0 ? ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (p == MAP_FAILED) v.map_err = errno ? errno : EPERM;
    else if (*static_cast<volatile int64_t*>(p) != o.value) v.map_err = -1;
  }
  write_all(out, &v, sizeof v);
  ::_exit(0);
}

std::string why_not(const char* what, const char* call, int err) {
  if (err == -1)
    return std::string("a rank could ") + what + " another rank's memory but found another value there (the ranks "
           "live in different pid namespaces)";
  return std::string("a rank could not ") + what + " another rank's memory (" + call + ": " + std::strerror(err) +
         "): that needs ptrace permission over it, which Yama (/proc/sys/kernel/yama/ptrace_scope at 1 or more), "
         "seccomp or a container without CAP_SYS_PTRACE refuses";
}

}  // namespace

SiblingProbe probe_siblings() {
  SiblingProbe r;
  int offer_pipe[2], verdict_pipe[2], hold_pipe[2];
  if (::pipe2(offer_pipe, O_CLOEXEC) != 0) return r;
  if (::pipe2(verdict_pipe, O_CLOEXEC) != 0) {
    ::close(offer_pipe[0]), ::close(offer_pipe[1]);
    return r;
  }
  if (::pipe2(hold_pipe, O_CLOEXEC) != 0) {
    for (int fd : {offer_pipe[0], offer_pipe[1], verdict_pipe[0], verdict_pipe[1]}) ::close(fd);
    return r;
  }
  const int64_t value = static_cast<int64_t>(std::random_device{}()) << 20 | 1;
  const pid_t b = ::fork();
  if (b == 0) offer(offer_pipe[1], hold_pipe[0], hold_pipe[1], value);
  const pid_t a = b > 0 ? ::fork() : -1;
  if (a == 0) {
    ::close(hold_pipe[1]);
    read_peer(offer_pipe[0], verdict_pipe[1]);
  }
  for (int fd : {offer_pipe[0], offer_pipe[1], verdict_pipe[1], hold_pipe[0]}) ::close(fd);
  Verdict v;
  const bool heard = a > 0 && read_all(verdict_pipe[0], &v, sizeof v, kTimeoutMs);
  ::close(verdict_pipe[0]);
  ::close(hold_pipe[1]);  // the offering child exits
  for (pid_t p : {a, b})
    if (p > 0) {
      if (!heard) ::kill(p, SIGKILL);
      int status = 0;
      while (::waitpid(p, &status, 0) < 0 && errno == EINTR) {
      }
    }
  if (!heard) {
    const std::string why = "the probe of this host (two processes reading each other's memory) did not finish";
    r.cma_blocked = why;
    r.share_blocked = why;
    return r;
  }
  if (v.read_err != 0) r.cma_blocked = why_not("read", "process_vm_readv", v.read_err);
  if (v.map_err != 0) r.share_blocked = why_not("map", "pidfd_getfd", v.map_err);
  return r;
}

}  // namespace fsdp::tools
