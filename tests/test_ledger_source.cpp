// The ledger's measured terms come from the allocator of the job's device
// (src/unit/memory_source.h): the counting allocator on the CPU, the CUDA
// caching allocator on a GPU, where the host's counters read next to nothing.
// A fake device allocator, driven by the model's own forward and backward,
// shows that A, A_recompute, the peak, current and cached are read from it
// and from nothing else, and that the ledger names it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/memory.h"
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

// A measurement that cannot be (here: something beside training frees
// device memory while the root forward runs, as a background save's device
// copies can on a GPU, so A reads negative) is said in the ledger and
// planned as 0; the ledger never throws for it, so the run it measures is
// not failed.
TEST(LedgerSource, ANegativeMeasurementIsReportedNotThrown) {
  FakeBytes bytes;
  FakeBytes* b = &bytes;
  auto net = torch::nn::Sequential(torch::nn::Functional([b](torch::Tensor t) {
                                     b->add(-7000);  // freed by someone else meanwhile
                                     return t;
                                   }),
                                   DeviceLayer(&bytes));
  fsdp::FsdpOptions o;
  o.wrap = fsdp::WrapPolicy::module_type<DeviceLayerImpl>("DeviceLayer");
  auto model = fsdp::fully_shard(net.ptr(), fsdp::make_local_communicator(), o);
  fsdp::detail::EngineAccess(*model).use_memory_source(std::make_unique<FakeDeviceAllocator>(&bytes));
  bytes.add(50000);
  model.forward(torch::randn({3, 6})).sum().backward();
  fsdp::Ledger l;
  ASSERT_NO_THROW(l = model->ledger());
  EXPECT_EQ(l.A, 1000 - 7000) << "the measurement is kept as it was, not hidden";
  ASSERT_EQ(l.notes.size(), 1u) << l.str();
  EXPECT_NE(l.notes[0].find("A measured -5.86 KiB (-6000 bytes)"), std::string::npos) << l.notes[0];
  EXPECT_NE(l.str().find("note: A measured"), std::string::npos) << l.str();
  EXPECT_EQ(l.predicted_peak, model->ledger().predicted_peak);
  EXPECT_GT(l.predicted_peak, l.predicted_rest) << "the plan is made, with A counted as 0";
}

// On the CPU a background save copies its snapshot, writes and frees it on
// its own thread while training's forward runs. Those blocks are the
// save's (memory::BackgroundWork): A reads exactly what it reads without
// them.
TEST(LedgerSource, ABackgroundSavesBytesDoNotMoveA) {
  ASSERT_TRUE(fsdp::memory::install());
  torch::Tensor previous_snapshot, new_snapshot;
  {
    fsdp::memory::BackgroundWork background;
    previous_snapshot = torch::empty({int64_t(1) << 20}, torch::kUInt8);
  }
  bool save_in_flight = false;
  auto net = torch::nn::Sequential(torch::nn::Linear(16, 16), torch::nn::Functional([&](torch::Tensor t) {
                                     if (save_in_flight)
                                       std::thread([&] {
                                         fsdp::memory::BackgroundWork background;
                                         previous_snapshot = torch::Tensor();  // released mid-forward
                                         new_snapshot = torch::empty({int64_t(3) << 20}, torch::kUInt8);
                                       }).join();
                                     return torch::tanh(t);
                                   }),
                                   torch::nn::Linear(16, 16));
  auto model = fsdp::fully_shard(net.ptr(), fsdp::make_local_communicator(), {});
  const auto x = torch::randn({8, 16});
  model.forward(x).sum().backward();  // the first step makes what later ones reuse
  model.forward(x).sum().backward();
  const int64_t quiet = model->ledger().A;
  save_in_flight = true;
  model.forward(x).sum().backward();
  ASSERT_FALSE(previous_snapshot.defined());
  ASSERT_TRUE(new_snapshot.defined()) << "the save's thread ran inside the forward";
  EXPECT_GT(quiet, 0);
  EXPECT_EQ(model->ledger().A, quiet) << "a save's copies and frees moved A";
}

// On the CPU the ledger names the counting allocator (and reads it).
TEST(LedgerSource, TheCpuReadsTheCountingAllocator) {
  auto model = fsdp::fully_shard(torch::nn::Linear(4, 4).ptr(), fsdp::make_local_communicator(), {});
  model.forward(torch::randn({2, 4})).sum().backward();
  EXPECT_EQ(model->ledger().memory_source, "counting allocator");
  EXPECT_NE(model->ledger().str().find("measured peak (counting allocator)"), std::string::npos);
}

}  // namespace FSDP_TEST_ID
