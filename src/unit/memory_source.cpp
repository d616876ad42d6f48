// fsdp-cpp: the ledger's allocators (memory_source.h).
#include "unit/memory_source.h"

#include "fsdp/device.h"
#include "fsdp/memory.h"

namespace fsdp::detail {
namespace {

class CountingAllocator final : public MemorySource {
 public:
  MemoryReading read() const override {
    const memory::Stats s = memory::stats();
    return {s.current, s.peak, s.cached, s.foreground_current};
  }
  void reset_peak() override { memory::reset_peak(); }
  std::string name() const override { return "counting allocator"; }
};

class DeviceAllocator final : public MemorySource {
 public:
  explicit DeviceAllocator(c10::Device d) : device_(d) {}
  MemoryReading read() const override {
    const DeviceMemory m = device_memory(device_);
    return {m.allocated, m.peak_allocated, m.reserved - m.allocated};
  }
  void reset_peak() override { reset_device_peak(device_); }
  std::string name() const override { return "caching allocator of " + device_.str(); }

 private:
  const c10::Device device_;
};

}  // namespace

std::unique_ptr<MemorySource> memory_source_for(const c10::Device& device) {
  if (device.is_cpu()) return std::make_unique<CountingAllocator>();
  return std::make_unique<DeviceAllocator>(device);
}

}  // namespace fsdp::detail
