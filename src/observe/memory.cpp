// fsdp-cpp: the counting CPU allocator (see include/fsdp/memory.h).
//
// Blocks come from c10::alloc_cpu (what the default CPU allocator uses) with
// the size in a header in front, so the deleter knows exactly what to
// subtract. Counters are atomics: the allocator is called from compute
// threads and the communication thread.
#include "fsdp/memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "fsdp/errors.h"

namespace fsdp::memory {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_allocs{0};
std::atomic<int64_t> g_limit{0};
std::mutex g_explainer_mu;
std::function<std::string(int64_t, const Stats&)> g_explainer;

// Each block carries a 64-byte header in front of the data holding its size,
// so the DataPtr's context can equal its data pointer: some kernels (GELU's
// scratch space, for one) use Allocator::raw_allocate, which requires that.
constexpr size_t kHeader = 64;  // keeps the data 64-byte aligned like the default

void release(void* data) {
  if (!data) return;
  char* raw = static_cast<char*>(data) - kHeader;
  int64_t size = *reinterpret_cast<int64_t*>(raw);
  g_current.fetch_sub(size, std::memory_order_relaxed);
  c10::free_cpu(raw);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    const c10::Device cpu(c10::DeviceType::CPU);
    int64_t size = static_cast<int64_t>(n);
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &release, cpu);
    int64_t limit = g_limit.load(std::memory_order_relaxed);
    int64_t now = g_current.fetch_add(size, std::memory_order_relaxed) + size;
    if (limit > 0 && now > limit) {
      g_current.fetch_sub(size, std::memory_order_relaxed);
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
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    char* raw = static_cast<char*>(c10::alloc_cpu(n + kHeader));  // throws c10::Error when the OS says no
    *reinterpret_cast<int64_t*>(raw) = size;
    void* data = raw + kHeader;
    return c10::DataPtr(data, data, &release, cpu);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }
};

std::atomic<bool> g_installed{false};

}  // namespace

bool install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator alloc;
    // Priority above the default so later registrations at default priority
    // do not replace it.
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
  s.allocations = g_allocs.load(std::memory_order_relaxed);
  s.limit = g_limit.load(std::memory_order_relaxed);
  return s;
}

void reset_peak() { g_peak.store(g_current.load()); }

void set_limit(int64_t bytes) { g_limit.store(bytes < 0 ? 0 : bytes); }

void set_oom_explainer(std::function<std::string(int64_t, const Stats&)> fn) {
  std::lock_guard<std::mutex> g(g_explainer_mu);
  g_explainer = std::move(fn);
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
