// fsdp-cpp: choosing the same-host transport, and reading a peer's memory
// (see cma.h).
//
// Host identity: FSDP_HOST_ID when set (tests use it to make one machine
// look like several hosts), else the host name, the kernel's boot id and
// this process's pid and network namespaces. Ranks in two containers of
// one machine share a boot id but not a pid namespace, and a pid means
// nothing across namespaces, so they count as two hosts; so do network
// namespaces (tests/netns/two_hosts.sh simulates two hosts with them). The probe then proves what the
// identity only suggests: each rank reads a random value from each peer's
// memory; the value must come back (a pid that names some other process
// gives a wrong value or an error, never a false success).
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

#include "comm/cma.h"
#include "common/env.h"
#include "comm/slots.h"
#include "comm/mesh.h"
#include "common/proc_state.h"
#include "fsdp/errors.h"
#include "observe/flight_hooks.h"

namespace fsdp::comm {
namespace {

// Pieces of one read: big enough that the syscall is noise, small enough
// that the deadline is looked at every few milliseconds.
constexpr int64_t kReadPiece = int64_t(4) << 20;

// One rank's hello at sequence number 0 (fixed layout, raw bytes).
struct Hello {
  char mode[8];
  char host[160];
  int64_t pid;
  uint64_t probe_addr;
  uint64_t probe_value;
};
static_assert(sizeof(Hello) == 192, "Hello must have no hidden padding");

// One rank's probe outcome: ok, or the first peer it could not read.
struct ProbeResult {
  int32_t ok;
  int32_t peer;
  int32_t err;  // errno, or 0 when the read succeeded with a wrong value
  int32_t pad;
};

template <class T>
std::vector<T> exchange(Mesh* mesh, const T& mine, slots::Range steps, Clock::time_point deadline) {
  const int n = mesh->size;
  std::vector<T> all(n);
  all[mesh->rank] = mine;
  std::vector<int64_t> offset(n), count(n, sizeof(T));
  for (int q = 0; q < n; ++q) offset[q] = q * static_cast<int64_t>(sizeof(T));
  ring_all_gather(Wire{mesh, 0, deadline}, all.data(), offset, count, steps);
  return all;
}

template <class Name>
std::string why_unreadable(const Name& name, int reader, const ProbeResult& p, const std::vector<Hello>& hello) {
  std::string what = p.err == 0 ? std::string("the read succeeded but returned a wrong value (the ranks live in "
                                              "different pid namespaces)")
                                : detail::cat("process_vm_readv failed: ", std::strerror(p.err));
  return detail::cat(name(reader), " could not read the memory of ", name(p.peer), " (pid ", hello[p.peer].pid,
                     "): ", what,
                     ". Reading a peer's memory needs ptrace permission over it: the same user, and with Yama "
                     "(/proc/sys/kernel/yama/ptrace_scope) at 1 or more a permission the ranks do not grant; "
                     "containers may forbid it (seccomp, no CAP_SYS_PTRACE)");
}

}  // namespace

namespace {
std::string read_line(const char* path) {
  std::string s = ::fsdp::detail::read_proc_text(path, 4096);
  if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

std::string ns_of(const char* path) {
  const std::string ns = ::fsdp::detail::env().read_link(path);
  return ns.empty() ? std::string("?") : ns;
}

}  // namespace

std::string host_identity(const std::string& host_id) {
  if (!host_id.empty()) return "FSDP_HOST_ID=" + host_id;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return detail::cat(host, " boot ", read_line("/proc/sys/kernel/random/boot_id"), " ", ns_of("/proc/self/ns/pid"),
                     " ", ns_of("/proc/self/ns/net"));
}


void read_peer(const Wire& w, int q, pid_t pid, void* dst, uint64_t remote, int64_t nbytes) {
  char* d = static_cast<char*>(dst);
  if (w.progress) w.progress->wait_on(w.name(q), flight::Progress::READ);
  const int who = w.name(q);
  for (int64_t done = 0; done < nbytes;) {
    if (Clock::now() > w.deadline)
      throw std::runtime_error(detail::cat("timed out reading the buffer of rank ", who, " (pid ", pid, ") after ",
                                           done, " of ", nbytes, " bytes"));
    const int64_t m = std::min(kReadPiece, nbytes - done);
    iovec local{d + done, static_cast<size_t>(m)};
    iovec far{reinterpret_cast<void*>(remote + static_cast<uint64_t>(done)), static_cast<size_t>(m)};
    const ssize_t got = process_vm_readv(pid, &local, 1, &far, 1, 0);
    if (got > 0) {
      done += got;  // a partial read continues where it stopped
      if (w.progress) w.progress->arrived(got);
      continue;
    }
    const int e = got < 0 ? errno : EFAULT;
    if (e == EINTR) continue;
    if (e == ESRCH)
      throw std::runtime_error(detail::cat("rank ", who, " (pid ", pid, ") is gone: it died while this rank read ",
                                           "its buffer (process_vm_readv: ", std::strerror(e), ")"));
    throw std::runtime_error(detail::cat("reading the buffer of rank ", who, " (pid ", pid, ") failed after ", done,
                                         " of ", nbytes, " bytes: process_vm_readv: ", std::strerror(e),
                                         e == EFAULT ? " (rank died and its pid was reused, or posted a bad address)"
                                                     : ""));
  }
  if (w.progress) w.progress->idle();
}

namespace {
bool memory_gone(pid_t pid) {
  char byte = 0;
  iovec local{&byte, 1}, far{nullptr, 1};
  return process_vm_readv(pid, &local, 1, &far, 1, 0) < 0 && errno == ESRCH;
}
}  // namespace

std::string cma_gone_peers(const CmaPeers& p, int self, const std::vector<int>* names) {
  std::string out;
  for (size_t q = 0; q < p.pid.size(); ++q) {
    if (static_cast<int>(q) == self) continue;
    if (memory_gone(p.pid[q]))
      out += detail::cat(out.empty() ? "" : ", ", "rank ", names ? (*names)[q] : static_cast<int>(q), " (pid ", p.pid[q], ")");
  }
  return out;
}

bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  if (proc::is_gone(proc::read_state(pid))) return true;
  return memory_gone(pid);
}

TransportChoice choose_transport(Mesh* mesh, const std::string& mode, const std::string& host_id,
                                 Clock::time_point deadline, const std::vector<int>& global,
                                 const std::string& group) {
  const int n = mesh->size, r = mesh->rank;
  // Messages name global ranks; a group's name its own rank beside them.
  auto name = [&](int q) {
    if (group.empty() || static_cast<int>(global.size()) != n) return detail::cat("rank ", q);
    return detail::cat("rank ", global[q], " (group rank ", q, ")");
  };
  std::string where;
  if (!group.empty()) {
    where = detail::cat(" in group '", group, "' (global ranks ");
    for (int q = 0; q < n && q < static_cast<int>(global.size()); ++q) where += detail::cat(q ? ", " : "", global[q]);
    where += ")";
  }
  // Lives on this stack until every rank has reported its probe below, so
  // no peer reads it after it is gone.
  volatile uint64_t probe_value = std::random_device{}() | (uint64_t(std::random_device{}()) << 32) | 1;
  Hello mine;
  std::memset(&mine, 0, sizeof mine);
  std::strncpy(mine.mode, mode.c_str(), sizeof mine.mode - 1);
  std::strncpy(mine.host, host_identity(host_id).c_str(), sizeof mine.host - 1);
  mine.pid = getpid();
  mine.probe_addr = reinterpret_cast<uint64_t>(&probe_value);
  mine.probe_value = probe_value;

  TransportChoice out;
  try {
    auto hello = exchange(mesh, mine, slots::kTransportHello, deadline);
    for (auto& h : hello) out.host.emplace_back(h.host, strnlen(h.host, sizeof h.host));
    for (int q = 0; q < n; ++q)
      if (std::strcmp(hello[q].mode, hello[0].mode) != 0)
        throw Error(detail::cat("ranks disagree on FSDP_TRANSPORT", where, ": ", name(0), " has '", hello[0].mode,
                                "', ", name(q), " has '", hello[q].mode,
                                "'. Start every rank with the same FSDP_TRANSPORT (or none: auto)."));
    if (mode == "tcp") {
      out.why = "FSDP_TRANSPORT=tcp";
      return out;
    }
    int other = -1;
    for (int q = 0; q < n && other < 0; ++q)
      if (std::strcmp(hello[q].host, hello[0].host) != 0) other = q;
    out.one_host = other < 0;
    if (other >= 0) {
      out.why = detail::cat("the ranks are not all on one host (", name(0), " on '", hello[0].host, "', ",
                            name(other), " on '", hello[other].host, "')");
    } else {
      ProbeResult res{1, -1, 0, 0};
      for (int i = 1; i < n && res.ok; ++i) {
        const int q = (r + i) % n;
        uint64_t got = 0;
        iovec local{&got, sizeof got};
        iovec far{reinterpret_cast<void*>(hello[q].probe_addr), sizeof got};
        const ssize_t k = process_vm_readv(static_cast<pid_t>(hello[q].pid), &local, 1, &far, 1, 0);
        if (k != static_cast<ssize_t>(sizeof got) || got != hello[q].probe_value)
          res = {0, q, k < 0 ? errno : 0, 0};
      }
      auto results = exchange(mesh, res, slots::kTransportProbe, deadline);
      for (int q = 0; q < n && out.why.empty(); ++q)
        if (!results[q].ok) out.why = why_unreadable(name, q, results[q], hello);
      if (out.why.empty()) {
        out.cma = true;
        out.why = detail::cat("all ", n, " ranks are on this host and may read each other's memory");
        for (auto& h : hello) out.peers.pid.push_back(static_cast<pid_t>(h.pid));
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (!group.empty())
      msg += detail::cat(" (ranks inside this message are group ranks of group '", group, "'", where, ")");
    throw Error(detail::cat(name(r), where, ": choosing the transport (FSDP_TRANSPORT=", mode,
                            ") failed: a rank stopped or the network stalled: ", msg));
  }
  // The communicator chooses the path from these facts (path::choose),
  // and refuses FSDP_TRANSPORT=cma when they do not allow it.
  return out;
}

}  // namespace fsdp::comm
