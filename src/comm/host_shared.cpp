// fsdp-cpp: memory the ranks of one host share (see host_shared.h).
#include "comm/host_shared.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <stdexcept>

#include "comm/local_sum.h"
#include "comm/mesh.h"
#include "comm/post_exchange.h"
#include "comm/slots.h"
#include "fsdp/errors.h"
#include "observe/flight_hooks.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace fsdp::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(int e) { return detail::cat(std::strerror(e), " (errno ", e, ")"); }

int64_t page_round(int64_t bytes) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  return std::max<int64_t>(page, (bytes + page - 1) / page * page);
}

// A memfd of `bytes` (page-rounded), mapped; throws naming what failed.
std::pair<int, char*> make_memfd(int64_t bytes, const char* what) {
  const int fd = ::memfd_create("fsdp-host-shared", MFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error(detail::cat("memfd_create for ", what, ": ", errno_text(errno)));
  if (::ftruncate(fd, page_round(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error(detail::cat("ftruncate of ", bytes, " bytes for ", what, ": ", errno_text(e),
                                         ". Expected: room for it in memory (the host's shared memory is its RAM)"));
  }
  void* p = ::mmap(nullptr, page_round(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error(detail::cat("mmap of ", bytes, " bytes for ", what, ": ", errno_text(e)));
  }
  return {fd, static_cast<char*>(p)};
}

// Process `pid`'s descriptor `fd`, duplicated into this process, mapped; the
// duplicate is closed. `pidfd` from pidfd_open.
char* map_peer_fd(int pidfd, int fd, int64_t bytes, std::string* why) {
  const int mine = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  if (mine < 0) {
    *why = detail::cat("pidfd_getfd: ", errno_text(errno));
    return nullptr;
  }
  void* p = ::mmap(nullptr, page_round(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, mine, 0);
  const int e = errno;
  ::close(mine);
  if (p == MAP_FAILED) {
    *why = detail::cat("mmap: ", errno_text(e));
    return nullptr;
  }
  return static_cast<char*>(p);
}

// What a rank tells every peer in one exchange.
struct Post {
  uint64_t seq;
  int64_t msg;     // the step, against a peer that runs another exchange
  int64_t pid;
  int64_t fd;
  uint64_t serial;
  int64_t offset;  // of the buffer in its block
  int64_t bytes;   // of the block (the mapping)
  int64_t value;   // the probe's value; "mapped" 1 or 0
};

// Every rank sends `mine` to every peer on step `step` of `steps` and gets
// theirs (table[r] = mine), peer by peer from r+1 (post_exchange.h).
std::vector<Post> exchange(const Wire& w, slots::Range steps, int step, const Post& mine, const char* what) {
  PostExchange<Post> x(w, slots::slot(w.seq, steps.begin + step), step);
  x.send(mine);
  std::vector<Post> table = x.wait(what, [] { return std::string(" (host-shared memory)"); });
  x.wait_sent();
  return table;
}

int open_pidfd(pid_t pid, std::string* why) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) *why = detail::cat("pidfd_open(", pid, "): ", errno_text(errno));
  return fd;
}

}  // namespace

std::string probe_host_sharing(Mesh* mesh, const std::vector<pid_t>& pid, Clock::time_point deadline,
                               const std::vector<int>* names) {
  const int n = mesh->size, r = mesh->rank;
  Wire w{mesh, 0, deadline, nullptr, names};
  Post mine{};
  mine.pid = ::getpid();
  mine.fd = -1;
  std::string why;
  char* page = nullptr;
  const int64_t value = static_cast<int64_t>(std::random_device{}()) | 1;
  try {
    auto [fd, p] = make_memfd(8, "the probe");
    mine.fd = fd;
    page = p;
    std::memcpy(page, &value, sizeof value);
    mine.value = value;
  } catch (const std::exception& e) {
    why = e.what();
  }
  auto table = exchange(w, slots::kShareProbe, 0, mine, "the host-shared probe");
  // Read every peer's page.
  for (int q = 0; q < n && why.empty(); ++q) {
    if (q == r) continue;
    if (table[q].fd < 0) {
      why = detail::cat("rank ", w.name(q), " could not make shared memory");
      break;
    }
    std::string w2;
    const int pfd = open_pidfd(pid.empty() ? static_cast<pid_t>(table[q].pid) : pid[q], &w2);
    char* m = pfd >= 0 ? map_peer_fd(pfd, static_cast<int>(table[q].fd), 8, &w2) : nullptr;
    if (pfd >= 0) ::close(pfd);
    if (!m) {
      why = detail::cat("rank ", w.name(r), " could not map rank ", w.name(q), "'s memory (", w2, ")");
      break;
    }
    int64_t got = 0;
    std::memcpy(&got, m, sizeof got);
    ::munmap(m, page_round(8));
    if (got != table[q].value)
      why = detail::cat("rank ", w.name(r), " read another value from rank ", w.name(q), "'s memory");
  }
  // Every rank's outcome; the first failure, by rank, is everyone's answer.
  Post outcome{};
  outcome.value = why.empty() ? 1 : 0;
  auto all = exchange(w, slots::kShareProbe, 1, outcome, "the host-shared probe's outcome");
  if (page) ::munmap(page, page_round(8));
  if (mine.fd >= 0) ::close(static_cast<int>(mine.fd));
  for (int q = 0; q < n; ++q)
    if (!all[q].value) return q == r ? why : detail::cat("rank ", w.name(q), " could not map a peer's memory");
  return "";
}

HostShared::HostShared(std::vector<pid_t> pid, int rank) : pid_(std::move(pid)), rank_(rank), pidfd_(pid_.size(), -1) {}

HostShared::~HostShared() {
  for (auto& b : blocks_) {
    ::munmap(b.base, page_round(b.bytes));
    ::close(b.fd);
  }
  for (auto& [k, m] : peer_blocks_) ::munmap(m.base, page_round(m.bytes));
  for (int fd : pidfd_)
    if (fd >= 0) ::close(fd);
  // Common mappings belong to their tensors, which hold this object alive.
}

int HostShared::pidfd(int q) {
  if (pidfd_[q] < 0) {
    std::string why;
    pidfd_[q] = open_pidfd(pid_[q], &why);
    if (pidfd_[q] < 0) throw std::runtime_error(detail::cat("rank ", q, " (pid ", pid_[q], "): ", why));
  }
  return pidfd_[q];
}

void* HostShared::map_common(const Wire& w, int64_t bytes) {
  const int n = w.mesh->size, r = w.mesh->rank;
  Post mine{};
  mine.pid = ::getpid();
  mine.fd = -1;
  mine.bytes = bytes;
  char* base = nullptr;
  int made = -1;
  if (r == 0) {
    auto [fd, p] = make_memfd(bytes, "a unit's shared parameters");
    made = fd;
    base = p;
    mine.fd = fd;
  }
  auto table = exchange(w, slots::kHostShared, 0, mine, "the shared memory's descriptor");
  for (int q = 1; q < n; ++q)
    if (table[q].bytes != bytes)
      throw std::runtime_error(detail::cat("rank ", w.name(q), " asked for ", table[q].bytes,
                                           " bytes of shared memory where this rank asked for ", bytes,
                                           ": the ranks issued different calls"));
  std::string why;
  if (r != 0) base = map_peer_fd(pidfd(0), static_cast<int>(table[0].fd), bytes, &why);
  Post mapped{};
  mapped.value = base ? 1 : 0;
  auto all = exchange(w, slots::kHostShared, 1, mapped, "every rank's \"mapped\"");
  if (made >= 0) ::close(made);  // every rank has its own mapping (or failed)
  for (int q = 0; q < n; ++q)
    if (!all[q].value) {
      if (base) ::munmap(base, page_round(bytes));
      throw std::runtime_error(q == r ? detail::cat("mapping rank 0's shared memory: ", why)
                                      : detail::cat("rank ", w.name(q), " could not map rank 0's shared memory"));
    }
  std::lock_guard<std::mutex> lock(mu_);
  commons_.push_back({base, bytes});
  return base;
}

void* HostShared::take_block(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  // The smallest free block that fits; a unit's gradients come back to the
  // same size every step, so the pool stays as large as the most gradient
  // buffers ever in flight at once.
  Block* best = nullptr;
  for (auto& b : blocks_)
    if (!b.busy && b.bytes >= bytes && (!best || b.bytes < best->bytes)) best = &b;
  if (!best) {
    auto [fd, p] = make_memfd(bytes, "gradients to reduce");
    blocks_.push_back({next_serial_++, fd, p, page_round(bytes), false});
    best = &blocks_.back();
  }
  best->busy = true;
  return best->base;
}

void HostShared::release(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& b : blocks_)
    if (b.base == p) {
      b.busy = false;
      return;
    }
  for (size_t i = 0; i < commons_.size(); ++i)
    if (commons_[i].base == p) {
      ::munmap(p, page_round(commons_[i].bytes));
      commons_.erase(commons_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
}

bool HostShared::is_common(const void* p, int64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const char* c = static_cast<const char*>(p);
  for (auto& m : commons_)
    if (c >= m.base && c + bytes <= m.base + m.bytes) return true;
  return false;
}

const HostShared::Block* HostShared::block_of(const void* p, int64_t bytes) const {
  const char* c = static_cast<const char*>(p);
  for (auto& b : blocks_)
    if (c >= b.base && c + bytes <= b.base + b.bytes) return &b;
  return nullptr;
}

bool HostShared::is_block(const void* p, int64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return block_of(p, bytes) != nullptr;
}

int64_t HostShared::common_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t s = 0;
  for (auto& m : commons_) s += m.bytes;
  return s;
}

int64_t HostShared::block_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t s = 0;
  for (auto& b : blocks_) s += b.bytes;
  return s;
}

const char* HostShared::peer_block(const Wire& w, int q, uint64_t serial, int fd, int64_t bytes) {
  auto key = std::make_pair(q, serial);
  auto it = peer_blocks_.find(key);
  if (it != peer_blocks_.end() && it->second.bytes >= bytes) return it->second.base;
  std::string why;
  char* base = map_peer_fd(pidfd(q), fd, bytes, &why);
  if (!base) throw std::runtime_error(detail::cat("mapping rank ", w.name(q), "'s gradients: ", why));
  if (it != peer_blocks_.end()) ::munmap(it->second.base, page_round(it->second.bytes));
  peer_blocks_[key] = {base, bytes};
  return base;
}

Traffic HostShared::all_gather(const Wire& w, const void* in, void* out, int64_t block_bytes) {
  const int n = w.mesh->size, r = w.mesh->rank;
  char* mine = static_cast<char*>(out) + r * block_bytes;
  // In place (fp32: the shard is this slice) nothing moves; otherwise (a
  // low-precision copy of the shard) this rank writes its own slice.
  if (in != mine && block_bytes > 0) std::memcpy(mine, in, block_bytes);
  dissemination_barrier(w);
  Traffic t((n - 1) * block_bytes);
  t.host_shared = true;
  return t;
}

Traffic HostShared::reduce_scatter(const Wire& w, const void* in, void* out, int64_t count, c10::ScalarType dtype,
                                   int divisor) {
  const int n = w.mesh->size, r = w.mesh->rank;
  const int64_t es = c10::elementSize(dtype);
  return sum_chunks(w, in, n * count * es, {r * count}, count, out, dtype, divisor);
}

Traffic HostShared::sum_chunks(const Wire& w, const void* in, int64_t in_bytes, const std::vector<int64_t>& chunks,
                               int64_t count, void* out, c10::ScalarType dtype, int divisor) {
  const int n = w.mesh->size, r = w.mesh->rank;
  const int64_t es = c10::elementSize(dtype);
  Post mine{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Block* b = block_of(in, in_bytes);
    if (!b) throw std::runtime_error("host-shared reduce_scatter: the input is not this rank's peer memory");
    mine.fd = b->fd;
    mine.serial = b->serial;
    mine.offset = static_cast<const char*>(in) - b->base;
    mine.bytes = b->bytes;
  }
  mine.value = in_bytes;
  auto table = exchange(w, slots::kHostShared, 0, mine, "the gradients' address");
  std::vector<const char*> base(n);
  for (int q = 0; q < n; ++q) {
    if (table[q].value != in_bytes)
      throw std::runtime_error(detail::cat("rank ", w.name(q), " posted ", table[q].value,
                                           " bytes of gradients where this rank posted ", in_bytes,
                                           ": the ranks issued different collectives"));
    base[q] = (q == r ? static_cast<const char*>(in) - mine.offset
                      : peer_block(w, q, table[q].serial, static_cast<int>(table[q].fd), table[q].bytes)) +
              table[q].offset;
  }
  const int64_t from_peers = (n - 1) * static_cast<int64_t>(chunks.size()) * count * es;
  if (w.progress) w.progress->recv_total.fetch_add(from_peers, std::memory_order_relaxed);
  std::vector<const void*> src(n);
  for (size_t k = 0; k < chunks.size(); ++k) {
    for (int q = 0; q < n; ++q) src[q] = base[q] + chunks[k] * es;
    sum_in_rank_order(static_cast<char*>(out) + static_cast<int64_t>(k) * count * es, src.data(), n, count, dtype,
                      divisor);
  }
  if (w.progress) w.progress->arrived(from_peers);
  // Nobody reads this rank's block any more once every rank said so.
  Post done{};
  exchange(w, slots::kHostShared, 1, done, "\"done\"");
  Traffic t(from_peers);
  t.host_shared = true;
  return t;
}

}  // namespace fsdp::comm
