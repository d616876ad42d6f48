// The ledger's measured terms come from the allocator of the job's device
// (src/unit/memory_source.h): the counting allocator on the CPU, the CUDA
// caching allocator on a GPU, where the host's counters read next to nothing.
// A fake device allocator, driven by the model's own forward and backward,
// shows that A, A_recompute, the peak, current and cached are read from it
// and from nothing else, and that the ledger names it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "unit/engine_access.h"
#include "unit/memory_source.h"

namespace FSDP_TEST_ID {

// What the fake "device" holds: the test's modules add to it as they run.
struct FakeBytes {
  int64_t current = 0, peak = 0, resets = 0;
  void add(int64_t n) {
    current += n;
    peak = std::max(peak, current);
  }
};

class FakeDeviceAllocator final : public fsdp::detail::MemorySource {
 public:
  explicit FakeDeviceAllocator(FakeBytes* b) : b_(b) {}
  fsdp::detail::MemoryReading read() const override { return {b_->current, b_->peak, 4096}; }
  void reset_peak() override {
    b_->peak = b_->current;
    ++b_->resets;
  }
  std::string name() const override { return "caching allocator of fake:0"; }

 private:
  FakeBytes* b_;
};

// A layer that "allocates" 1000 device bytes per forward call and keeps them
// for backward (as activations), released when its backward ran.
struct DeviceLayerImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  FakeBytes* bytes;
  DeviceLayerImpl(FakeBytes* b) : bytes(b) { fc = register_module("fc", torch::nn::Linear(6, 6)); }
  torch::Tensor forward(const torch::Tensor& x) {
    bytes->add(1000);
    auto y = fc(x);
    if (y.requires_grad()) y.register_hook([b = bytes](const torch::Tensor& g) { b->add(-1000); return g; });
    return y;
  }
};
TORCH_MODULE(DeviceLayer);

TEST(LedgerSource, MeasuresOnTheDevicesAllocator) {
  FakeBytes bytes;
  auto net = torch::nn::Sequential(DeviceLayer(&bytes), torch::nn::Tanh(), DeviceLayer(&bytes));
  fsdp::FsdpOptions o;
  o.wrap = fsdp::WrapPolicy::module_type<DeviceLayerImpl>("DeviceLayer");
  auto model = fsdp::fully_shard(net.ptr(), fsdp::make_local_communicator(), o);
  fsdp::detail::EngineAccess(*model).use_memory_source(std::make_unique<FakeDeviceAllocator>(&bytes));
  bytes.add(50000);  // what the device held before the step (the model's state)
  model.forward(torch::randn({3, 6})).sum().backward();
  const fsdp::Ledger l = model->ledger();
  EXPECT_EQ(l.memory_source, "caching allocator of fake:0");
  // A: what the root forward left held on the device: the two layers' 1000.
  EXPECT_EQ(l.A, 2000);
  EXPECT_EQ(l.peak, 52000);
  EXPECT_EQ(l.current, 50000);
  EXPECT_EQ(l.cached, 4096);
  EXPECT_NE(l.str().find("measured peak (caching allocator of fake:0)"), std::string::npos) << l.str();
}

// On the CPU the ledger names the counting allocator (and reads it).
TEST(LedgerSource, TheCpuReadsTheCountingAllocator) {
  auto model = fsdp::fully_shard(torch::nn::Linear(4, 4).ptr(), fsdp::make_local_communicator(), {});
  model.forward(torch::randn({2, 4})).sum().backward();
  EXPECT_EQ(model->ledger().memory_source, "counting allocator");
  EXPECT_NE(model->ledger().str().find("measured peak (counting allocator)"), std::string::npos);
}

}  // namespace FSDP_TEST_ID
