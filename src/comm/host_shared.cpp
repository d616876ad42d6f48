// fsdp-cpp: memory the ranks of one host share (see host_shared.h).
#include "comm/host_shared.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <optional>
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

// The seals every memfd of this file carries once sized: its size is fixed
// for good, so a mapping of it can never fault past a shrunk end.
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// What a rank tells every peer in one exchange at set-up (over the mesh,
// at sequence number 0: the probe and the control segment).
struct SetupPost {
  uint64_t seq;
  int64_t msg;     // the step, against a peer that runs another exchange
  int64_t pid;
  int64_t fd;
  int64_t value;   // the probe's value; "mapped" 1 or 0
};

// Every rank sends `mine` to every peer on step `step` of the set-up's
// steps and gets theirs (table[r] = mine), peer by peer from r+1
// (post_exchange.h).
std::vector<SetupPost> setup_exchange(const Wire& w, int step, const SetupPost& mine, const char* what) {
  PostExchange<SetupPost> x(w, slots::slot(w.seq, slots::kShareSetup.begin + step), step);
  x.send(mine);
  std::vector<SetupPost> table = x.wait(what, [] { return std::string(" (host-shared memory)"); });
  x.wait_sent();
  return table;
}

int open_pidfd(pid_t pid, std::string* why) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) *why = detail::cat("pidfd_open(", pid, "): ", errno_text(errno));
  return fd;
}

// The descriptors a set-up holds until it hands them over.
struct OwnedFds {
  std::vector<int> fd;
  ~OwnedFds() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
};

// The futex word is a plain 32-bit integer to the kernel. Shared (no
// FUTEX_PRIVATE_FLAG): the word lies in a memfd that every rank maps at its
// own address, and the kernel matches waiters by the page, not the address.
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the control segment's words are read by other processes");

// Sleeps while *word == expected, at most `limit`; any return (woken, the
// word changed, the time passed, a signal) sends the caller to look again.
void futex_sleep(std::atomic<uint32_t>* word, uint32_t expected, Clock::duration limit) {
  const int64_t ns = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count());
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Which barrier of which collective a post belongs to. Every barrier of a
// collective has its own, so ranks in different collectives (or different
// barriers of one) under one sequence number tell each other apart.
enum HostOp : int32_t {
  kOpGathered = 1,   // all_gather: every rank wrote its part of the common mapping
  kOpBlocks = 2,     // reduce_scatter: every rank's gradient block (descriptor, offset)
  kOpRead = 3,       // reduce_scatter: every rank read every block ("done")
  kOpAsked = 4,      // shared_tensor: every rank's request (rank 0's descriptor)
  kOpMapped = 5,     // shared_tensor: every rank's "mapped"
};

const char* op_words(int op) {
  switch (op) {
    case kOpGathered: return "the all_gather's barrier";
    case kOpBlocks: return "the reduce_scatter's posting of gradient blocks";
    case kOpRead: return "the reduce_scatter's \"done\"";
    case kOpAsked: return "shared_tensor's request";
    case kOpMapped: return "shared_tensor's \"mapped\"";
    default: return "no barrier of this library";
  }
}

// One rank's part of the control segment, written only by that rank (its
// cache line(s) of its own).
struct alignas(64) RankSlot {
  std::atomic<uint64_t> arrived;  // the last barrier this rank reached (1, 2, ...; 0: none yet)
  std::atomic<uint64_t> gave_up;  // 1 + the sequence number of the collective it failed (0: none)
  HostShared::Post post[2];       // its post at barrier b lies in post[b % 2]
};

}  // namespace

char* map_peer_memfd(int pidfd, int fd, int64_t bytes, int prot, std::string* why) {
  const int mine = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  if (mine < 0) {
    *why = detail::cat("pidfd_getfd: ", errno_text(errno));
    return nullptr;
  }
  struct stat st {};
  const int seals = ::fcntl(mine, F_GET_SEALS);
  void* p = MAP_FAILED;
  if (::fstat(mine, &st) != 0) {
    *why = detail::cat("fstat: ", errno_text(errno));
  } else if (st.st_size < page_round(bytes)) {
    *why = detail::cat("its memory holds ", st.st_size, " bytes where this rank expected ", page_round(bytes),
                       " (", bytes, " rounded up to pages): the ranks disagree on its size");
  } else if (seals < 0 || (seals & kSeals) != kSeals) {
    *why = detail::cat("its memory is not sealed against resizing (seals ", seals,
                       "): it was not made by this library's HostShared");
  } else {
    p = ::mmap(nullptr, page_round(bytes), prot, MAP_SHARED, mine, 0);
    if (p == MAP_FAILED) *why = detail::cat("mmap: ", errno_text(errno));
  }
  ::close(mine);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

// The control segment (one memfd per HostShared, every rank of the host
// maps it read-write): this header, then from kSlotsAt one RankSlot per rank.
struct HostShared::Control {
  static constexpr uint64_t kMagic = 0x6673647068737431ull;  // "fsdphst1"
  static constexpr int64_t kSlotsAt = 256;
  uint64_t magic;
  int64_t ranks;
  alignas(64) std::atomic<uint32_t> bell;  // the futex word: bumped at every arrival and every giving up
  std::atomic<uint32_t> sleepers;         // ranks sleeping on `bell` now (a wake is needed only then)

  RankSlot* slots() { return reinterpret_cast<RankSlot*>(reinterpret_cast<char*>(this) + kSlotsAt); }
  static int64_t bytes(int ranks) { return kSlotsAt + static_cast<int64_t>(sizeof(RankSlot)) * ranks; }
  // Rank 0's, on the zeroed memory of a new memfd.
  static Control* make(char* at, int ranks) {
    static_assert(sizeof(Control) <= kSlotsAt && kSlotsAt % alignof(RankSlot) == 0);
    auto* c = new (at) Control{kMagic, ranks, {}, {}};
    for (int q = 0; q < ranks; ++q) new (c->slots() + q) RankSlot{};
    return c;
  }
};
Memfd::Memfd(int64_t bytes, const char* what) {
  fd_ = ::memfd_create("fsdp-host-shared", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0) throw std::runtime_error(detail::cat("memfd_create for ", what, ": ", errno_text(errno)));
  const int64_t rounded = page_round(bytes);
  if (::ftruncate(fd_, rounded) != 0) {
    const int e = errno;
    ::close(fd_);
    throw std::runtime_error(detail::cat("ftruncate of ", bytes, " bytes for ", what, ": ", errno_text(e),
                                         ". Expected: room for it in memory (the host's shared memory is its RAM)"));
  }
  if (::fcntl(fd_, F_ADD_SEALS, kSeals) != 0) {
    const int e = errno;
    ::close(fd_);
    throw std::runtime_error(detail::cat("sealing the memfd for ", what, " (F_ADD_SEALS): ", errno_text(e),
                                         ". Expected: a kernel with memfd seals (Linux 3.17 and later)"));
  }
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd_);
    throw std::runtime_error(detail::cat("mmap of ", bytes, " bytes for ", what, ": ", errno_text(e)));
  }
  base_ = static_cast<char*>(p);
  bytes_ = rounded;
}

Memfd::~Memfd() {
  if (base_) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

Memfd::Memfd(Memfd&& o) noexcept : fd_(o.fd_), base_(o.base_), bytes_(o.bytes_) {
  o.fd_ = -1;
  o.base_ = nullptr;
}

char* Memfd::take_mapping() {
  char* b = base_;
  base_ = nullptr;
  return b;
}

void Memfd::release() {
  fd_ = -1;
  base_ = nullptr;
}

std::string probe_host_sharing(Mesh* mesh, const std::vector<pid_t>& pid, Clock::time_point deadline,
                               const std::vector<int>* names) {
  const int n = mesh->size, r = mesh->rank;
  Wire w{mesh, 0, deadline, nullptr, names};
  SetupPost mine{};
  mine.pid = ::getpid();
  mine.fd = -1;
  std::string why;
  std::optional<Memfd> page;  // lives until every rank reported its reads below
  const int64_t value = static_cast<int64_t>(std::random_device{}()) | 1;
  try {
    page.emplace(8, "the probe");
    mine.fd = page->fd();
    std::memcpy(page->base(), &value, sizeof value);
    mine.value = value;
  } catch (const std::exception& e) {
    why = e.what();
  }
  auto table = setup_exchange(w, 0, mine, "the host-shared probe");
  // Read every peer's page.
  for (int q = 0; q < n && why.empty(); ++q) {
    if (q == r) continue;
    if (table[q].fd < 0) {
      why = detail::cat("rank ", w.name(q), " could not make shared memory");
      break;
    }
    std::string w2;
    const int pfd = open_pidfd(pid.empty() ? static_cast<pid_t>(table[q].pid) : pid[q], &w2);
    char* m = pfd >= 0 ? map_peer_memfd(pfd, static_cast<int>(table[q].fd), 8, PROT_READ, &w2) : nullptr;
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
  SetupPost outcome{};
  outcome.value = why.empty() ? 1 : 0;
  auto all = setup_exchange(w, 1, outcome, "the host-shared probe's outcome");
  for (int q = 0; q < n; ++q)
    if (!all[q].value) return q == r ? why : detail::cat("rank ", w.name(q), " could not map a peer's memory");
  return "";
}

std::shared_ptr<HostShared> HostShared::connect(Mesh* mesh, std::vector<pid_t> pid, Clock::time_point deadline,
                                                const std::vector<int>* names) {
  const int n = mesh->size, r = mesh->rank;
  Wire w{mesh, 0, deadline, nullptr, names};
  const int64_t bytes = Control::bytes(n);
  std::string why;
  SetupPost mine{};
  mine.fd = -1;
  std::optional<Memfd> made;  // rank 0's; its descriptor is closed once every rank mapped it
  if (r == 0) {
    try {
      made.emplace(bytes, "the host's control segment");
      Control::make(made->base(), n);
      mine.fd = made->fd();
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  auto table = setup_exchange(w, 2, mine, "the control segment's descriptor");
  // Every peer's process, to learn at once when one is gone.
  OwnedFds pidfds{std::vector<int>(n, -1)};
  for (int q = 0; q < n && why.empty(); ++q)
    if (q != r) pidfds.fd[q] = open_pidfd(pid[q], &why);
  char* base = nullptr;
  if (why.empty()) {
    if (table[0].fd < 0)
      why = "rank 0 could not make the control segment";
    else if (r == 0)
      base = made->base();
    else if (!(base = map_peer_memfd(pidfds.fd[0], static_cast<int>(table[0].fd), bytes, PROT_READ | PROT_WRITE,
                                     &why)))
      why = detail::cat("mapping rank ", w.name(0), "'s control segment: ", why);
    if (base && reinterpret_cast<Control*>(base)->magic != Control::kMagic)
      why = detail::cat("rank ", w.name(0), "'s control segment holds another layout");
  }
  SetupPost outcome{};
  outcome.value = why.empty() ? 1 : 0;
  auto all = setup_exchange(w, 3, outcome, "every rank's \"mapped\" of the control segment");
  for (int q = 0; q < n; ++q)
    if (!all[q].value) {
      if (base && r != 0) ::munmap(base, page_round(bytes));
      const std::string what =
          q == r ? why : detail::cat("rank ", w.name(q), " could not map the host's control segment");
      throw Error(detail::cat("setting up host-shared memory: ", what,
                              ". FSDP_SHARE_HOST=off keeps each rank's own copy instead"));
    }
  if (r == 0) made->take_mapping();  // its descriptor closes with `made`
  std::shared_ptr<HostShared> hs(new HostShared(std::move(pid), r, base, page_round(bytes)));
  hs->pidfd_ = std::move(pidfds.fd);
  pidfds.fd.clear();
  return hs;
}

HostShared::HostShared(std::vector<pid_t> pid, int rank, char* control, int64_t control_bytes)
    : pid_(std::move(pid)), rank_(rank), control_(reinterpret_cast<Control*>(control)),
      control_bytes_(control_bytes) {}

HostShared::~HostShared() {
  for (auto& b : blocks_) {
    ::munmap(b.base, page_round(b.bytes));
    ::close(b.fd);
  }
  for (auto& [k, m] : peer_blocks_) ::munmap(m.base, page_round(m.bytes));
  for (int fd : pidfd_)
    if (fd >= 0) ::close(fd);
  ::munmap(control_, control_bytes_);
  // Common mappings belong to their tensors, which hold this object alive.
}

std::string HostShared::lost(const Wire& w, int q) {
  const uint64_t g = control_->slots()[q].gave_up.load();
  if (g)
    return detail::cat("rank ", w.name(q), " gave up: its collective #", g - 1, " failed (its own error says why)");
  pollfd p{pidfd_[q], POLLIN, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP)))
    return detail::cat("rank ", w.name(q), " (pid ", pid_[q], ") is gone: its process ended before it got there");
  return "";
}

void HostShared::wait_for(const Wire& w, int q, uint64_t b, int op) {
  RankSlot& s = control_->slots()[q];
  if (s.arrived.load() >= b) return;
  if (w.progress) w.progress->wait_on(w.name(q), flight::Progress::RECEIVE);
  while (s.arrived.load() < b) {
    const std::string why = lost(w, q);
    if (!why.empty())
      throw std::runtime_error(detail::cat("waiting for rank ", w.name(q), " at ", op_words(op), " of collective #",
                                           w.seq, " (host-shared memory): ", why));
    const auto now = Clock::now();
    if (now >= w.deadline)
      throw std::runtime_error(detail::cat("timed out waiting for rank ", w.name(q), " at ", op_words(op),
                                           " of collective #", w.seq, " (host-shared memory): it never arrived"));
    // Sleep until a rank arrives or gives up (the bell changes), or for
    // kLook, whichever comes first. Counting this rank among the sleepers
    // before looking again means an arrival after that look rings.
    const uint32_t bell = control_->bell.load();
    control_->sleepers.fetch_add(1);
    if (s.arrived.load() < b) futex_sleep(&control_->bell, bell, std::min<Clock::duration>(kLook, w.deadline - now));
    control_->sleepers.fetch_sub(1);
  }
  if (w.progress) w.progress->idle();
}

std::vector<HostShared::Post> HostShared::meet(const Wire& w, int op, Post mine) {
  const int n = w.mesh->size;
  RankSlot* slot = control_->slots();
  const uint64_t b = ++barriers_;
  mine.seq = w.seq;
  mine.op = op;
  // The post first, then the arrival (seq_cst: a peer that sees the
  // arrival sees the post, and every write of this rank before it), then
  // the bell.
  slot[rank_].post[b % 2] = mine;
  slot[rank_].arrived.store(b);
  control_->bell.fetch_add(1);
  if (control_->sleepers.load() > 0) futex_wake_all(&control_->bell);
  // Peer by peer from rank + 1, as every exchange waits: the rank a failure
  // names is the first one missing in that order.
  for (int i = 1; i < n; ++i) wait_for(w, (rank_ + i) % n, b, op);
  // A peer writes post[b % 2] again only at barrier b + 2, which it cannot
  // reach before this rank arrives at b + 1.
  std::vector<Post> table(n);
  for (int q = 0; q < n; ++q) {
    table[q] = slot[q].post[b % 2];
    if (table[q].seq != w.seq || table[q].op != op)
      throw std::runtime_error(detail::cat("rank ", w.name(q), " reached ", op_words(table[q].op), " of collective #",
                                           table[q].seq, " where this rank reached ", op_words(op), " of #", w.seq,
                                           " (host-shared memory): the ranks issued different collectives"));
  }
  return table;
}

void HostShared::abandon(uint64_t seq) {
  RankSlot& mine = control_->slots()[rank_];
  uint64_t none = 0;
  if (!mine.gave_up.compare_exchange_strong(none, seq + 1)) return;
  control_->bell.fetch_add(1);
  futex_wake_all(&control_->bell);
}

void* HostShared::map_common(const Wire& w, int64_t bytes) {
  const int n = w.mesh->size, r = rank_;
  Post mine{};
  mine.fd = -1;
  mine.bytes = bytes;
  std::optional<Memfd> made;  // rank 0's: closed (and unmapped, on a throw) when this returns
  if (r == 0) {
    made.emplace(bytes, "a unit's shared parameters");
    mine.fd = made->fd();
  }
  auto table = meet(w, kOpAsked, mine);
  // Every rank checks every request, so a mismatch throws the same words on
  // every rank, and none of them maps anything.
  for (int q = 1; q < n; ++q)
    if (table[q].bytes != table[0].bytes)
      throw std::runtime_error(detail::cat(
          "rank ", w.name(0), " asked for ", table[0].bytes, " bytes of host-shared memory where rank ", w.name(q),
          " asked for ", table[q].bytes, ": the ranks issued different shared_tensor calls (a unit of another size: ",
          "build the same model with the same options on every rank)"));
  std::string why;
  char* base = r == 0 ? made->base() : map_peer_memfd(pidfd_[0], table[0].fd, bytes, PROT_READ | PROT_WRITE, &why);
  Post mapped{};
  mapped.value = base ? 1 : 0;
  auto all = meet(w, kOpMapped, mapped);
  for (int q = 0; q < n; ++q)
    if (!all[q].value) {
      if (base && r != 0) ::munmap(base, page_round(bytes));
      throw std::runtime_error(q == r ? detail::cat("mapping rank ", w.name(0), "'s shared memory: ", why)
                                      : detail::cat("rank ", w.name(q), " could not map rank ", w.name(0),
                                                    "'s shared memory"));
    }
  if (made) made->take_mapping();  // every rank has its own mapping: the descriptor closes with `made`
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
    Memfd m(bytes, "gradients to reduce");
    blocks_.push_back({next_serial_++, m.fd(), m.base(), m.bytes(), false});
    m.release();  // the block owns both now
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
  char* base = map_peer_memfd(pidfd_[q], fd, bytes, PROT_READ, &why);  // peers only read it
  if (!base) throw std::runtime_error(detail::cat("mapping rank ", w.name(q), "'s gradients: ", why));
  if (it != peer_blocks_.end()) ::munmap(it->second.base, page_round(it->second.bytes));
  peer_blocks_[key] = {base, bytes};
  return base;
}

void HostShared::gathered(const Wire& w) { meet(w, kOpGathered, Post{}); }

Traffic HostShared::all_gather(const Wire& w, const void* in, void* out, int64_t block_bytes) {
  const int n = w.mesh->size, r = rank_;
  char* mine = static_cast<char*>(out) + r * block_bytes;
  // In place (fp32: the shard is this slice) nothing moves; otherwise (a
  // low-precision copy of the shard) this rank writes its own slice.
  if (in != mine && block_bytes > 0) std::memcpy(mine, in, block_bytes);
  gathered(w);
  Traffic t((n - 1) * block_bytes);
  t.host_shared = true;
  return t;
}

Traffic HostShared::reduce_scatter(const Wire& w, const void* in, void* out, int64_t count, c10::ScalarType dtype,
                                   int divisor) {
  const int n = w.mesh->size, r = rank_;
  const int64_t es = c10::elementSize(dtype);
  return sum_chunks(w, in, n * count * es, {r * count}, count, out, dtype, divisor);
}

Traffic HostShared::sum_chunks(const Wire& w, const void* in, int64_t in_bytes, const std::vector<int64_t>& chunks,
                               int64_t count, void* out, c10::ScalarType dtype, int divisor) {
  const int n = w.mesh->size, r = rank_;
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
  auto table = meet(w, kOpBlocks, mine);
  std::vector<const char*> base(n);
  for (int q = 0; q < n; ++q) {
    if (table[q].value != in_bytes)
      throw std::runtime_error(detail::cat("rank ", w.name(q), " posted ", table[q].value,
                                           " bytes of gradients where this rank posted ", in_bytes,
                                           ": the ranks issued different collectives"));
    base[q] = (q == r ? static_cast<const char*>(in) - mine.offset
                      : peer_block(w, q, table[q].serial, table[q].fd, table[q].bytes)) +
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
  // Nobody reads this rank's block any more once every rank arrived here.
  meet(w, kOpRead, Post{});
  Traffic t(from_peers);
  t.host_shared = true;
  return t;
}

}  // namespace fsdp::comm
