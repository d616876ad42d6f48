// fsdp-cpp: the counting CPU allocator (see include/fsdp/memory.h).
//
// Blocks carry their size in a header in front, so the deleter knows exactly
// what to subtract; blocks of 64 KiB and more are mapped from the system
// directly and cached for reuse (below), smaller ones come from
// c10::alloc_cpu (what the default CPU allocator uses). Counters
// are atomics: the allocator is called from compute threads and the
// communication thread.
#include "fsdp/memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <list>
#include <map>
#include <unordered_map>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/env.h"
#include "fsdp/deferred.h"
#include "fsdp/errors.h"

namespace fsdp::memory {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_high{0};  // max of current since install, never reset
std::atomic<int64_t> g_allocs{0};
std::atomic<int64_t> g_limit{0};
std::atomic<int64_t> g_comm{0};        // of current: communication buffers (CommBuffers)
std::atomic<int64_t> g_comm_high{0};
// Of current: blocks allocated inside BackgroundWork, and all the others.
// Each block moves exactly one of the two, so a reader of the foreground
// never sees a background block's free half done.
std::atomic<int64_t> g_background{0};
std::atomic<int64_t> g_foreground{0};
std::atomic<int64_t> g_footprint{0};   // bytes the allocator holds from the system
std::atomic<int64_t> g_footprint_high{0};
std::atomic<int64_t> g_mapped{0};      // of the footprint: mapped directly, not through malloc
thread_local int tl_comm_depth = 0;
thread_local int tl_background_depth = 0;
std::mutex g_explainer_mu;
std::function<std::string(int64_t, const Stats&)> g_explainer;

// Each block carries a 64-byte header in front of the data holding its
// requested size and its capacity, so the DataPtr's context can equal its data
// pointer: some kernels (GELU's scratch space, for one) use
// Allocator::raw_allocate, which requires that.
constexpr size_t kHeader = 64;  // keeps the data 64-byte aligned like the default
struct Header {
  int64_t size;      // bytes the tensor asked for: what current/peak count
  int64_t capacity;  // bytes of data behind the header (>= size); 0: not cacheable
  int32_t comm;        // 1: a communication buffer (allocated inside CommBuffers)
  int32_t background;  // 1: allocated inside BackgroundWork
};
// The counter of a block's account: background work's, or the foreground's.
std::atomic<int64_t>& account_of(bool background) { return background ? g_background : g_foreground; }
// What a block takes from the system, its header included.
int64_t block_bytes(const Header& h) { return (h.capacity > 0 ? h.capacity : h.size) + int64_t(kHeader); }

// Cacheable blocks (capacity > 0) are mapped from the system directly, not
// taken from malloc: glibc raises its mmap threshold each time it unmaps a
// freed block (up to 32 MiB), after which blocks of that size come from its
// heap, and a heap block freed there stays resident. A block the cache gives
// back to stay under the limit would then still count against the process
// (make scale measured 64-190 MiB of such freed memory per rank). An unmapped
// block is gone. Under AddressSanitizer they stay with malloc, which it sees.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMapBlocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kMapBlocks = false;
#else
constexpr bool kMapBlocks = true;
#endif
#else
constexpr bool kMapBlocks = true;
#endif

void system_free(char* raw, int64_t bytes, bool cacheable) {
  g_footprint.fetch_sub(bytes, std::memory_order_relaxed);
  if (kMapBlocks && cacheable) {
    g_mapped.fetch_sub(bytes, std::memory_order_relaxed);
    ::munmap(raw, static_cast<size_t>(bytes));
  } else
    c10::free_cpu(raw);
}

// ---------------------------------------------------------------------------
// The cache. A large block given back to the kernel on free (unmapped) makes
// the next allocation of the same size fault in fresh
// zeroed pages, thousands per training step (every unshard, every gradient
// buffer, every activation of a few hundred KiB). Blocks of at least
// kCacheMin bytes are kept here instead and handed to the next request that
// fits. Capacities are rounded to pages, and a cached block serves a request
// of up to 1/8 less, so a step that repeats the previous one's sizes reuses
// every block exactly.
//
// What the cache holds is never counted as held: current/peak (what the
// ledger and the planner speak of) stay the tensors' own bytes. The cache is
// bounded: by the limit (held + cached never passes it: cached blocks are
// released, oldest first, before a request is refused), by the largest the
// process has ever held (so the footprint stays below twice that), and on
// demand (empty_cache). When the system refuses memory the cache is emptied
// and the request retried once.
constexpr int64_t kCacheMin = 64 * 1024;
constexpr int64_t kPage = 4096;
constexpr int64_t kMinCacheBound = 64ll << 20;

struct Cache {
  std::mutex mu;
  // capacity -> blocks (raw pointers, header included); insertion order kept in
  // `age` for eviction.
  std::multimap<int64_t, char*> free_by_size;
  std::list<std::multimap<int64_t, char*>::iterator> age;  // oldest first
  std::unordered_map<char*, std::list<std::multimap<int64_t, char*>::iterator>::iterator> age_of;
  std::atomic<int64_t> cached{0};
  std::atomic<int64_t> hits{0};
  std::atomic<int64_t> system_allocs{0};
  std::atomic<int64_t> released{0};
  std::atomic<bool> enabled{true};

  // Takes a block of capacity in [cap, cap + cap/8] out of the cache.
  char* take(int64_t cap) {
    std::lock_guard<std::mutex> g(mu);
    auto it = free_by_size.lower_bound(cap);
    if (it == free_by_size.end() || it->first > cap + cap / 8) return nullptr;
    char* raw = it->second;
    auto a = age_of.find(raw);
    age.erase(a->second);
    age_of.erase(a);
    cached.fetch_sub(it->first, std::memory_order_relaxed);
    free_by_size.erase(it);
    hits.fetch_add(1, std::memory_order_relaxed);
    return raw;
  }

  // Keeps the block unless that would pass `bound`; returns false when the
  // caller must free it.
  bool put(char* raw, int64_t cap, int64_t bound) {
    std::lock_guard<std::mutex> g(mu);
    if (cap > bound) return false;
    while (cached.load(std::memory_order_relaxed) + cap > bound && !age.empty()) evict_oldest_locked();
    auto it = free_by_size.emplace(cap, raw);
    age.push_back(it);
    age_of[raw] = std::prev(age.end());
    cached.fetch_add(cap, std::memory_order_relaxed);
    return true;
  }

  void evict_oldest_locked() {
    auto it = age.front();
    age.pop_front();
    age_of.erase(it->second);
    cached.fetch_sub(it->first, std::memory_order_relaxed);
    released.fetch_add(it->first, std::memory_order_relaxed);
    system_free(it->second, it->first + int64_t(kHeader), /*cacheable=*/true);
    free_by_size.erase(it);
  }

  // Releases oldest blocks until at most `keep` bytes stay cached.
  int64_t trim(int64_t keep) {
    std::lock_guard<std::mutex> g(mu);
    int64_t before = cached.load(std::memory_order_relaxed);
    while (cached.load(std::memory_order_relaxed) > keep && !age.empty()) evict_oldest_locked();
    return before - cached.load(std::memory_order_relaxed);
  }
};

Cache& cache() {
  // Immortal: tensors freed during static destruction still come back here.
  static Cache* c = new Cache;
  return *c;
}

int64_t round_capacity(int64_t n) { return (n + kPage - 1) / kPage * kPage; }

int64_t cache_bound() {
  int64_t b = std::max(kMinCacheBound, g_high.load(std::memory_order_relaxed));
  int64_t limit = g_limit.load(std::memory_order_relaxed);
  if (limit > 0) b = std::min(b, std::max<int64_t>(0, limit - g_current.load(std::memory_order_relaxed)));
  return b;
}

// Deferred construction (fsdp/deferred.h): every tensor a thread allocates
// inside a DeferredInit scope gets the same block of one scratch mapping
// (MAP_NORESERVE: address space, no memory until written). Constructors that
// write their default initial values touch at most the largest tensor's
// pages; those are dropped when the last scope ends. Never unmapped: deferred
// tensors may point into it for as long as they live.
struct Scratch {
  std::mutex mu;
  char* base = nullptr;
  int64_t size = 0;
  std::atomic<int> scopes{0};
  std::atomic<int64_t> live{0};        // deferred blocks not yet released
  std::atomic<int64_t> touched_max{0};  // largest deferred block handed out
};
Scratch& scratch() {
  static Scratch* s = new Scratch;  // immortal, like the cache
  return *s;
}
thread_local int tl_defer_depth = 0;
thread_local int64_t tl_deferred_bytes = 0;
thread_local int64_t tl_deferred_count = 0;

bool in_scratch(const void* p) {
  Scratch& s = scratch();
  const char* c = static_cast<const char*>(p);
  return s.base && c >= s.base && c < s.base + s.size;
}

void release(void* data) {
  if (!data) return;
  if (in_scratch(data)) {
    scratch().live.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  char* raw = static_cast<char*>(data) - kHeader;
  const Header h = *reinterpret_cast<Header*>(raw);
  g_current.fetch_sub(h.size, std::memory_order_relaxed);
  if (h.comm) g_comm.fetch_sub(h.size, std::memory_order_relaxed);
  account_of(h.background != 0).fetch_sub(h.size, std::memory_order_relaxed);
  Cache& c = cache();
  if (h.capacity > 0 && c.enabled.load(std::memory_order_relaxed) && c.put(raw, h.capacity, cache_bound()))
    return;
  system_free(raw, block_bytes(h), h.capacity > 0);
}

// ---------------------------------------------------------------------------
// Where the process's resident memory goes (ProcessMemory). Each time the
// allocator's footprint passes its high by kSampleStep, the resident size
// (/proc/self/statm: two numbers, no allocation) and malloc's totals are
// sampled, with the allocator's own counters of that moment; the sample with
// the most resident memory is kept. A few hundred samples in a run at most,
// nearly all in its first step.
constexpr int64_t kSampleStep = 1 << 20;

struct Resident {
  int64_t total = 0;  // resident bytes
  int64_t file = 0;   // of which file-backed or shared (library code and data, shared memory)
  int64_t shmem = 0;  // of which shared memory (RssShmem: the host-shared units' memfds)
};
// One "Key:   N kB" line of a /proc file read into `buf`, in bytes (0: absent).
int64_t kb_field(const char* buf, const char* key) {
  const char* at = std::strstr(buf, key);
  if (!at) return 0;
  long long kb = 0;
  if (std::sscanf(at + std::strlen(key), " %lld", &kb) != 1) return 0;
  return kb * 1024;
}
// RssShmem from /proc/self/status, without allocating.
int64_t read_rss_shmem() {
  char buf[4096];
  if (::fsdp::detail::env().read_proc("/proc/self/status", buf, sizeof buf) <= 0) return 0;
  return kb_field(buf, "RssShmem:");
}
Resident read_statm() {
  Resident r;
  r.shmem = read_rss_shmem();
  char buf[160];
  if (::fsdp::detail::env().read_proc("/proc/self/statm", buf, sizeof buf) <= 0) return r;
  long long size = 0, resident = 0, shared = 0;
  if (std::sscanf(buf, "%lld %lld %lld", &size, &resident, &shared) != 3) return r;
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  r.total = resident * page;
  r.file = shared * page;
  return r;
}

struct MallocTotals {
  int64_t used = 0;  // in use, mmap'd chunks included
  int64_t free = 0;  // freed and kept
};
MallocTotals read_malloc() {
  const struct mallinfo2 m = ::mallinfo2();
  return {static_cast<int64_t>(m.uordblks + m.hblkhd), static_cast<int64_t>(m.fordblks)};
}

struct Sample {
  Resident resident;
  MallocTotals malloc;
  int64_t current = 0, comm = 0, footprint = 0, mapped = 0;
};
struct Samples {
  std::mutex mu;
  Sample start;  // at install
  Sample best;   // the most resident
  std::atomic<int64_t> next{0};  // footprint that triggers the next sample
};
Samples& samples() {
  static Samples* s = new Samples;  // immortal, like the cache
  return *s;
}

Sample take_sample() {
  Sample x;
  x.resident = read_statm();
  x.malloc = read_malloc();
  x.current = g_current.load(std::memory_order_relaxed);
  x.comm = g_comm.load(std::memory_order_relaxed);
  x.footprint = g_footprint.load(std::memory_order_relaxed);
  x.mapped = g_mapped.load(std::memory_order_relaxed);
  return x;
}

void note_footprint(int64_t footprint) {
  int64_t high = g_footprint_high.load(std::memory_order_relaxed);
  while (footprint > high && !g_footprint_high.compare_exchange_weak(high, footprint, std::memory_order_relaxed)) {
  }
  Samples& s = samples();
  if (footprint < s.next.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> g(s.mu);
  if (footprint < s.next.load(std::memory_order_relaxed)) return;
  s.next.store(footprint + kSampleStep, std::memory_order_relaxed);
  Sample x = take_sample();
  if (x.resident.total >= s.best.resident.total) s.best = x;
}

char* map_block(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) return static_cast<char*>(p);
  const int err = errno;
  throw OutOfMemory("out of memory: the system refused " + format_bytes(static_cast<int64_t>(bytes)) + " (mmap: " +
                    std::strerror(err) + ") with " + format_bytes(g_current.load()) +
                    " held by tensors in this process. Expected: memory for the tensors this step needs. "
                    "Fix: fewer ranks on this host, a smaller micro-batch, or --strategy full / activation "
                    "checkpointing (fsdp plan shows each term).");
}

char* system_alloc(size_t bytes, bool cacheable) {
  cache().system_allocs.fetch_add(1, std::memory_order_relaxed);
  const bool mapped = kMapBlocks && cacheable;
  char* raw = nullptr;
  try {
    raw = mapped ? map_block(bytes) : static_cast<char*>(c10::alloc_cpu(bytes));
  } catch (const std::exception&) {
    // The system said no: what the cache holds is the first thing to give back.
    if (cache().trim(0) == 0) throw;
    // Throws again (OutOfMemory, or c10::Error from alloc_cpu) when still refused.
    raw = mapped ? map_block(bytes) : static_cast<char*>(c10::alloc_cpu(bytes));
  }
  if (mapped) g_mapped.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  note_footprint(g_footprint.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) +
                 static_cast<int64_t>(bytes));
  return raw;
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    int64_t size = static_cast<int64_t>(n);
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &release, cpu);
    if (tl_defer_depth > 0) return deferred(size, cpu);
    Cache& c = cache();
    const bool cacheable = size >= kCacheMin && c.enabled.load(std::memory_order_relaxed);
    const int64_t cap = cacheable ? round_capacity(size) : 0;
    int64_t limit = g_limit.load(std::memory_order_relaxed);
    int64_t now = g_current.fetch_add(size, std::memory_order_relaxed) + size;
    const bool comm = tl_comm_depth > 0;
    const bool background = tl_background_depth > 0;
    if (limit > 0) {
      // Held plus cached bytes stay within the limit: give back cached blocks
      // (oldest first) before refusing anything.
      int64_t room = limit - now;
      if (c.cached.load(std::memory_order_relaxed) > room) c.trim(std::max<int64_t>(0, room));
    }
    if (limit > 0 && now > limit) {
      g_current.fetch_sub(size, std::memory_order_relaxed);
      c.trim(0);
      Stats s = stats();
      std::string why;
      {
        std::lock_guard<std::mutex> g(g_explainer_mu);
        if (g_explainer) why = g_explainer(size, s);
      }
      throw OutOfMemory("out of memory: allocating " + format_bytes(size) + " with " +
                        format_bytes(s.current) + " in use would exceed the per-rank limit of " +
                        format_bytes(limit) + (why.empty() ? std::string(".") : ".\n" + why));
    }
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    int64_t high = g_high.load(std::memory_order_relaxed);
    while (now > high && !g_high.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
    }
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    account_of(background).fetch_add(size, std::memory_order_relaxed);
    if (comm) {
      const int64_t c_now = g_comm.fetch_add(size, std::memory_order_relaxed) + size;
      int64_t c_high = g_comm_high.load(std::memory_order_relaxed);
      while (c_now > c_high && !g_comm_high.compare_exchange_weak(c_high, c_now, std::memory_order_relaxed)) {
      }
    }
    char* raw = cacheable ? c.take(cap) : nullptr;
    int64_t got = cap;
    if (raw) {
      got = reinterpret_cast<Header*>(raw)->capacity;
    } else {
      try {
        raw = system_alloc(static_cast<size_t>(cacheable ? cap : size) + kHeader, cacheable);
      } catch (...) {
        g_current.fetch_sub(size, std::memory_order_relaxed);
        if (comm) g_comm.fetch_sub(size, std::memory_order_relaxed);
        account_of(background).fetch_sub(size, std::memory_order_relaxed);
        throw;
      }
    }
    *reinterpret_cast<Header*>(raw) = Header{size, got, comm ? 1 : 0, background ? 1 : 0};
    void* data = raw + kHeader;
    return c10::DataPtr(data, data, &release, cpu);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static c10::DataPtr deferred(int64_t size, c10::Device cpu) {
    Scratch& s = scratch();
    if (size > s.size)
      throw Error("deferred construction: a tensor of " + format_bytes(size) +
                  " is larger than the scratch region (" + format_bytes(s.size) +
                  "). Expected: module constructors that allocate their parameters tensor by tensor. "
                  "Fix: construct this module without fsdp::DeferredInit.");
    s.live.fetch_add(1, std::memory_order_relaxed);
    int64_t t = s.touched_max.load(std::memory_order_relaxed);
    while (size > t && !s.touched_max.compare_exchange_weak(t, size, std::memory_order_relaxed)) {
    }
    tl_deferred_bytes += size;
    ++tl_deferred_count;
    return c10::DataPtr(s.base, s.base, &release, cpu);
  }
};

std::atomic<bool> g_installed{false};

}  // namespace

bool install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator alloc;
    // Priority above the default so later registrations at default priority
    // do not replace it.
    samples().start = take_sample();
    c10::SetCPUAllocator(&alloc, /*priority=*/10);
    g_installed = true;
  });
  return g_installed;
}

bool installed() { return g_installed; }

Stats stats() {
  Stats s;
  s.current = g_current.load(std::memory_order_relaxed);
  s.peak = g_peak.load(std::memory_order_relaxed);
  s.high_water = g_high.load(std::memory_order_relaxed);
  s.allocations = g_allocs.load(std::memory_order_relaxed);
  s.limit = g_limit.load(std::memory_order_relaxed);
  Cache& c = cache();
  s.cached = c.cached.load(std::memory_order_relaxed);
  s.cache_hits = c.hits.load(std::memory_order_relaxed);
  s.system_allocations = c.system_allocs.load(std::memory_order_relaxed);
  s.cache_released = c.released.load(std::memory_order_relaxed);
  s.comm_current = g_comm.load(std::memory_order_relaxed);
  s.comm_high = g_comm_high.load(std::memory_order_relaxed);
  s.background_current = g_background.load(std::memory_order_relaxed);
  s.foreground_current = g_foreground.load(std::memory_order_relaxed);
  s.footprint = g_footprint.load(std::memory_order_relaxed);
  s.footprint_high = g_footprint_high.load(std::memory_order_relaxed);
  return s;
}

void reset_peak() { g_peak.store(g_current.load()); }

void set_limit(int64_t bytes) {
  g_limit.store(bytes < 0 ? 0 : bytes);
  if (bytes > 0) cache().trim(std::max<int64_t>(0, bytes - g_current.load()));
}

int64_t empty_cache() { return cache().trim(0); }

}  // namespace fsdp::memory

namespace fsdp {

using memory::scratch;
using memory::tl_defer_depth;

DeferredInit::DeferredInit() {
  if (!memory::installed())
    throw Error("fsdp::DeferredInit needs the counting allocator, which hands out the deferred blocks. "
                "Expected: fsdp::init() (or memory::install()) before the model is built. Fix: call "
                "fsdp::init() first in main().");
  memory::Scratch& s = scratch();
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (!s.base) {
      // Address space only; the largest tensor a constructor writes is what
      // becomes resident.
      for (int64_t want = int64_t(1) << 36; want >= (int64_t(1) << 30) && !s.base; want /= 2) {
        void* p = ::mmap(nullptr, static_cast<size_t>(want), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
          s.base = static_cast<char*>(p);
          s.size = want;
        }
      }
      if (!s.base)
        throw Error("fsdp::DeferredInit: could not reserve address space for deferred construction "
                    "(mmap of 1 GiB, MAP_NORESERVE, refused). Fix: construct the model eagerly.");
    }
  }
  s.scopes.fetch_add(1);
  bytes_before_ = memory::tl_deferred_bytes;
  count_before_ = memory::tl_deferred_count;
  ++tl_defer_depth;
}

DeferredInit::~DeferredInit() {
  --tl_defer_depth;
  memory::Scratch& s = scratch();
  if (s.scopes.fetch_sub(1) == 1) {
    // The values there are garbage by contract: give the touched pages back.
    std::lock_guard<std::mutex> g(s.mu);
    if (s.scopes.load() == 0) ::madvise(s.base, static_cast<size_t>(s.size), MADV_DONTNEED);
  }
}

int64_t DeferredInit::bytes() const { return memory::tl_deferred_bytes - bytes_before_; }
int64_t DeferredInit::tensors() const { return memory::tl_deferred_count - count_before_; }

bool is_deferred(const torch::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  const void* p = t.storage().data();
  return p && memory::in_scratch(p);
}

int64_t deferred_blocks_alive() { return scratch().live.load(std::memory_order_relaxed); }

}  // namespace fsdp

namespace fsdp::memory {

void set_caching(bool on) {
  cache().enabled = on;
  if (!on) cache().trim(0);
}

bool caching() { return cache().enabled.load(); }

void set_oom_explainer(std::function<std::string(int64_t, const Stats&)> fn) {
  std::lock_guard<std::mutex> g(g_explainer_mu);
  g_explainer = std::move(fn);
}

int64_t process_peak_rss() {
  char buf[4096];
  if (::fsdp::detail::env().read_proc("/proc/self/status", buf, sizeof buf) <= 0) return 0;
  return kb_field(buf, "VmHWM:");
}

CommBuffers::CommBuffers() { ++tl_comm_depth; }
CommBuffers::~CommBuffers() { --tl_comm_depth; }

BackgroundWork::BackgroundWork() { ++tl_background_depth; }
BackgroundWork::~BackgroundWork() { --tl_background_depth; }

// The process's proportional set size now (/proc/self/smaps_rollup "Pss:"):
// resident bytes with each shared page divided among the processes that map
// it; -1 where the kernel does not say.
int64_t read_pss() {
  char buf[4096];
  if (::fsdp::detail::env().read_proc("/proc/self/smaps_rollup", buf, sizeof buf) <= 0) return -1;
  for (const char* at = buf; (at = std::strstr(at, "Pss:")) != nullptr; ++at)
    if (at == buf || at[-1] == '\n') {
      long long kb = 0;
      return std::sscanf(at + 4, " %lld", &kb) == 1 ? kb * 1024 : -1;
    }
  return -1;
}

ProcessMemory process_memory() {
  ProcessMemory m;
  if (!installed()) {
    m.vmhwm = process_peak_rss();
    return m;
  }
  Sample start, best;
  {
    Samples& s = samples();
    std::lock_guard<std::mutex> g(s.mu);
    // The moment of asking counts too: the resident size may have grown
    // without the allocator's footprint.
    Sample now = take_sample();
    if (now.resident.total > s.best.resident.total) s.best = now;
    start = s.start;
    best = s.best;
  }
  m.at_start = start.resident.total;
  m.sample = best.resident.total;
  // Read after the samples, and never below one: the kernel's resident
  // counters are kept per CPU and reach /proc/self/status and statm a page
  // or so apart.
  m.vmhwm = std::max(process_peak_rss(), m.sample);
  m.shared = std::max<int64_t>(0, best.resident.shmem - start.resident.shmem);
  m.code_since = std::max<int64_t>(0, (best.resident.file - best.resident.shmem) -
                                          (start.resident.file - start.resident.shmem));
  m.comm = best.comm;
  m.tensors = best.current - best.comm;
  m.cache = best.footprint - best.current;
  // malloc's totals include the allocator's small blocks (those it does not
  // map itself): the rest is everyone else's, counted from what it was at start.
  m.malloc_other = std::max<int64_t>(0, best.malloc.used - (best.footprint - best.mapped) - start.malloc.used);
  m.malloc_free = std::max<int64_t>(0, best.malloc.free - start.malloc.free);
  m.unexplained = m.sample - m.at_start - m.code_since - m.shared - m.tensors - m.comm - m.cache - m.malloc_other -
                  m.malloc_free;
  m.pss = read_pss();
  m.elsewhere = std::max<int64_t>(0, m.vmhwm - m.sample);
  m.comm_high = g_comm_high.load(std::memory_order_relaxed);
  return m;
}

int64_t ProcessMemory::fixed() const { return vmhwm - tensors - comm - cache; }

std::string ProcessMemory::str() const {
  std::string out = "process memory: VmHWM " + format_bytes(vmhwm) + "\n";
  auto row = [&](const char* k, int64_t v, const char* note) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "  %-13s %12s   %s\n", k, format_bytes(v).c_str(), note);
    out += buf;
  };
  row("at start", at_start, "resident when the allocator was installed: libtorch's code and data");
  row("code since", code_since, "library pages first touched later (kernels first used)");
  if (shared > 0) row("shared", shared, "host-shared memory mapped (one copy per host: every local rank maps it)");
  row("tensors", tensors, "held by tensors (the ledger's terms and the rest of the step's)");
  row("comm", comm, "communication buffers (staging on the communication thread)");
  row("cache", cache, "the allocator's cache: freed blocks kept for reuse, headers, rounding");
  row("malloc used", malloc_other, "malloc's heap besides the allocator: objects (autograd graph, strings)");
  row("malloc free", malloc_free, "freed memory malloc keeps instead of returning it");
  row("unexplained", unexplained, "the rest: thread stacks, other mappings");
  row("= sample", sample, "resident at the largest sample (taken as the allocator's footprint grew)");
  if (elsewhere > 0) row("+ elsewhere", elsewhere, "VmHWM reached at another moment (between samples)");
  row("(comm high)", comm_high, "the most communication buffers held at once in the run (not a part: at any moment)");
  if (pss >= 0)
    row("(PSS now)", pss, "resident now with each shared page divided among the processes mapping it (per host: the sum)");
  return out;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace fsdp::memory
