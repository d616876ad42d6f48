// A GPU communicator's counters (src/comm/gpu_timings.h, used by the NCCL
// communicator): bf16/fp16 reductions count the fp32 bytes that go on the
// wire, and seconds are each collective's time on the GPU, counted once,
// when it has completed, never the host's time in a wait() that only orders
// streams. The works here are fakes of c10d::Work (no GPU needed).
#include <gtest/gtest.h>

#include "comm/gpu_timings.h"

namespace FSDP_TEST_ID {

using fsdp::CollectiveKind;

class FakeWork : public c10d::Work {
 public:
  explicit FakeWork(float ms, bool fails = false) : ms_(ms), fails_(fails) {}
  bool isCompleted() override { return done; }
  float getDuration() const override {
    if (fails_) throw std::runtime_error("no duration: the collective failed");
    return ms_;
  }
  bool done = false;

 private:
  float ms_;
  bool fails_;
};

TEST(GpuCounters, HalfFloatReductionsCountTheFp32OnTheWire) {
  using fsdp::comm::wire_bytes_per_element;
  EXPECT_EQ(wire_bytes_per_element(c10::kBFloat16, CollectiveKind::REDUCE_SCATTER), 4);
  EXPECT_EQ(wire_bytes_per_element(c10::kHalf, CollectiveKind::ALL_REDUCE), 4);
  EXPECT_EQ(wire_bytes_per_element(c10::kFloat, CollectiveKind::REDUCE_SCATTER), 4);
  // An all-gather moves the bytes it is given: bf16 stays bf16.
  EXPECT_EQ(wire_bytes_per_element(c10::kBFloat16, CollectiveKind::ALL_GATHER), 2);
  EXPECT_EQ(wire_bytes_per_element(c10::kBFloat16, CollectiveKind::BROADCAST), 2);
}

TEST(GpuCounters, EachCollectivesGpuTimeIsCountedOnceWhenItCompleted) {
  fsdp::comm::GpuTimings t;
  auto a = c10::make_intrusive<FakeWork>(2.0f), b = c10::make_intrusive<FakeWork>(3.0f),
       c = c10::make_intrusive<FakeWork>(5.0f, /*fails=*/true);
  t.issued(a, CollectiveKind::ALL_GATHER);
  t.issued(b, CollectiveKind::REDUCE_SCATTER);
  t.issued(c, CollectiveKind::ALL_REDUCE);
  std::map<CollectiveKind, double> seconds;
  int calls = 0;
  auto add = [&](CollectiveKind k, double s) {
    seconds[k] += s;
    ++calls;
  };
  t.harvest(add);
  EXPECT_EQ(calls, 0) << "nothing completed yet: nothing counted";
  b->done = true;  // the second completed, the first not yet: issue order holds it back
  t.harvest(add);
  EXPECT_EQ(calls, 0);
  a->done = true;
  t.harvest(add);
  EXPECT_EQ(calls, 2);
  EXPECT_DOUBLE_EQ(seconds[CollectiveKind::ALL_GATHER], 0.002);
  EXPECT_DOUBLE_EQ(seconds[CollectiveKind::REDUCE_SCATTER], 0.003);
  t.harvest(add);
  EXPECT_EQ(calls, 2) << "counted twice";
  c->done = true;  // failed: its error reaches wait(); no time is made up for it
  t.harvest(add);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(seconds.count(CollectiveKind::ALL_REDUCE), 0u);
}

}  // namespace FSDP_TEST_ID
