// Tests of the counting allocator's cache (src/observe/memory.cpp): blocks are
// reused, cached bytes are never counted as held, the cache gives its bytes
// back before a limit refuses anything, and a steady-state training step
// faults in (almost) no fresh pages.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/memory.h"

namespace FSDP_TEST_ID {

namespace memory = fsdp::memory;

constexpr int64_t kMiB = 1 << 20;

// Minor + major page faults of this process so far (/proc/self/stat fields 10 and 12).
long long page_faults() {
  std::ifstream f("/proc/self/stat");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces: fields count from after its ')'.
  auto close = all.rfind(')');
  EXPECT_NE(close, std::string::npos) << "unreadable /proc/self/stat";
  std::istringstream in(all.substr(close + 2));
  std::string field[11];
  for (auto& x : field) in >> x;
  // field[0] is field 3 (state); minflt is field 10, majflt field 12.
  EXPECT_FALSE(field[7].empty() || field[9].empty()) << "unreadable /proc/self/stat";
  return std::stoll(field[7]) + std::stoll(field[9]);
}

class MemoryCache : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(memory::install());
    memory::set_caching(true);
    memory::set_limit(0);
    memory::empty_cache();
  }
  void TearDown() override {
    memory::set_limit(0);
    memory::empty_cache();
  }
};

TEST_F(MemoryCache, FreedBlockIsReusedAndNotCountedAsHeld) {
  const auto s0 = memory::stats();
  void* first = nullptr;
  {
    auto t = torch::empty({kMiB / 4}, torch::kFloat32);  // 1 MiB
    first = t.data_ptr();
    EXPECT_EQ(memory::stats().current, s0.current + kMiB);
  }
  const auto s1 = memory::stats();
  EXPECT_EQ(s1.current, s0.current) << "a freed tensor's bytes must leave current";
  EXPECT_EQ(s1.cached, kMiB) << "the freed 1 MiB block must stay in the cache";
  {
    auto t = torch::empty({kMiB / 4}, torch::kFloat32);
    EXPECT_EQ(t.data_ptr(), first) << "the same size must get the cached block back";
    const auto s2 = memory::stats();
    EXPECT_EQ(s2.cache_hits, s1.cache_hits + 1);
    EXPECT_EQ(s2.system_allocations, s1.system_allocations) << "a cache hit must not ask the system";
    EXPECT_EQ(s2.cached, 0);
    EXPECT_EQ(s2.current, s0.current + kMiB);
  }
}

TEST_F(MemoryCache, SmallBlocksAreNotCached) {
  const auto s0 = memory::stats();
  { auto t = torch::empty({1000}, torch::kFloat32); }
  EXPECT_EQ(memory::stats().cached, s0.cached);
}

TEST_F(MemoryCache, ABlockServesARequestUpToAnEighthSmallerButNotLarger) {
  { auto t = torch::empty({2 * kMiB}, torch::kUInt8); }
  ASSERT_EQ(memory::stats().cached, 2 * kMiB);
  {
    auto bigger = torch::empty({2 * kMiB + 4096 * 4}, torch::kUInt8);
    EXPECT_EQ(memory::stats().cached, 2 * kMiB) << "a larger request must not take a smaller block";
  }
  memory::empty_cache();
  { auto t = torch::empty({2 * kMiB}, torch::kUInt8); }
  {
    auto h = memory::stats().cache_hits;
    auto smaller = torch::empty({2 * kMiB - 2 * kMiB / 9}, torch::kUInt8);
    EXPECT_EQ(memory::stats().cache_hits, h + 1) << "a request within 1/8 below the block must reuse it";
    EXPECT_EQ(memory::stats().cached, 0);
  }
  memory::empty_cache();
  { auto t = torch::empty({2 * kMiB}, torch::kUInt8); }
  {
    auto h = memory::stats().cache_hits;
    auto much_smaller = torch::empty({kMiB}, torch::kUInt8);
    EXPECT_EQ(memory::stats().cache_hits, h) << "half the block must not take it (it would waste half)";
  }
}

TEST_F(MemoryCache, CachedBytesAreReleasedBeforeAnOutOfMemoryIsDeclared) {
  const int64_t base = memory::stats().current;
  memory::set_limit(base + 8 * kMiB);
  { auto t = torch::empty({6 * kMiB}, torch::kUInt8); }
  ASSERT_EQ(memory::stats().cached, 6 * kMiB);
  {
    // 7 MiB does not fit the 6 MiB block; held 7 + cached 6 would pass the
    // limit, so the cache must give its block back instead of failing.
    auto t = torch::empty({7 * kMiB}, torch::kUInt8);
    const auto s = memory::stats();
    EXPECT_EQ(s.current, base + 7 * kMiB);
    EXPECT_EQ(s.cached, 0);
    EXPECT_LE(s.current + s.cached, base + 8 * kMiB);
  }
  // Cache the 7 MiB block, then ask for more than the limit allows: the
  // refusal must come with nothing left in the cache.
  ASSERT_EQ(memory::stats().cached, 7 * kMiB);
  bool refused = false;
  try {
    auto t = torch::empty({9 * kMiB}, torch::kUInt8);
  } catch (const memory::OutOfMemory& e) {
    refused = true;
    EXPECT_NE(std::string(e.what()).find("per-rank limit"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(refused) << "9 MiB over a limit of 8 MiB must be refused";
  EXPECT_EQ(memory::stats().cached, 0) << "an out-of-memory is declared only after the cache is empty";
  EXPECT_EQ(memory::stats().current, base);
}

TEST_F(MemoryCache, LoweringTheLimitTrimsTheCache) {
  const int64_t base = memory::stats().current;
  { auto t = torch::empty({4 * kMiB}, torch::kUInt8); }
  ASSERT_EQ(memory::stats().cached, 4 * kMiB);
  memory::set_limit(base + 2 * kMiB);
  EXPECT_EQ(memory::stats().cached, 0);
  memory::set_limit(0);
}

TEST_F(MemoryCache, EmptyCacheAndCachingOff) {
  { auto t = torch::empty({kMiB}, torch::kUInt8); }
  EXPECT_EQ(memory::empty_cache(), kMiB);
  EXPECT_EQ(memory::stats().cached, 0);
  memory::set_caching(false);
  { auto t = torch::empty({kMiB}, torch::kUInt8); }
  EXPECT_EQ(memory::stats().cached, 0);
  memory::set_caching(true);
}

// A stack of MLP blocks (one unit each) trained FULL_SHARD in a world of one:
// every step unshards every unit into a fresh all-gather output, allocates
// gradient buffers and activations of a few hundred KiB to a few MiB.
struct MlpImpl : torch::nn::Module {
  torch::nn::Linear up{nullptr}, down{nullptr};
  explicit MlpImpl(int64_t d) {
    up = register_module("up", torch::nn::Linear(d, 4 * d));
    down = register_module("down", torch::nn::Linear(4 * d, d));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + down(torch::gelu(up(x))); }
};
TORCH_MODULE(Mlp);
struct StackImpl : torch::nn::Module {
  std::vector<Mlp> blocks;
  StackImpl(int64_t d, int64_t layers) {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(Mlp(d));
      list->push_back(blocks.back());
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = fsdp::call(b, x);
    return x;
  }
};
TORCH_MODULE(Stack);

double faults_per_step(bool caching) {
  memory::set_caching(caching);
  torch::manual_seed(0);
  Stack net(256, 4);  // 4 units of 2 MiB of weights each
  fsdp::FsdpOptions o;
  o.wrap = fsdp::WrapPolicy::module_type<MlpImpl>("Mlp");
  auto model = fully_shard(net, fsdp::make_local_communicator(), o);
  torch::optim::AdamW opt(model->parameters(), 1e-3);
  auto x = torch::randn({256, 256});  // activations of 256 KiB .. 1 MiB
  auto step = [&] {
    opt.zero_grad();
    model.forward(x).square().mean().backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step();
  const int steps = 10;
  const long long before = page_faults();
  for (int i = 0; i < steps; ++i) step();
  return double(page_faults() - before) / steps;
}

TEST_F(MemoryCache, SteadyStateStepFaultsInAlmostNoPages) {
  const double with_cache = faults_per_step(true);
  const double without = faults_per_step(false);
  std::printf("page faults per step: cache on %.1f, cache off %.1f\n", with_cache, without);
  // The bound: a few faults for glibc's own small blocks. A step of this
  // model allocates ~40 blocks of >= 64 KiB; without the cache glibc hands
  // most back to the kernel and they fault in again (hundreds per step).
  EXPECT_LE(with_cache, 20.0) << "the cache should leave a steady-state step (almost) fault-free";
  memory::set_caching(true);
}

// Background work (a background save's snapshot and writes) is counted in
// current like any tensor and apart from training's own bytes, whatever
// thread frees it: the foreground counter does not move while another
// thread allocates or frees background blocks.
TEST_F(MemoryCache, BackgroundWorkIsCountedApartWhateverThreadFreesIt) {
  const auto s0 = memory::stats();
  EXPECT_EQ(s0.foreground_current + s0.background_current, s0.current);
  torch::Tensor snapshot;
  std::thread save([&] {
    memory::BackgroundWork background;
    snapshot = torch::empty({5 * kMiB}, torch::kUInt8);
    auto writer_buffer = torch::empty({kMiB}, torch::kUInt8);  // allocated and freed on the thread
  });
  save.join();
  const auto s1 = memory::stats();
  EXPECT_EQ(s1.background_current - s0.background_current, 5 * kMiB);
  EXPECT_EQ(s1.foreground_current, s0.foreground_current) << "the save's blocks are not training's";
  EXPECT_EQ(s1.current - s0.current, 5 * kMiB) << "background blocks count in current";
  auto activation = torch::empty({2 * kMiB}, torch::kUInt8);  // training's, on this thread
  EXPECT_EQ(memory::stats().foreground_current - s0.foreground_current, 2 * kMiB);
  std::thread release([&] { snapshot = torch::Tensor(); });  // the save drops its snapshot mid-forward
  release.join();
  const auto s2 = memory::stats();
  EXPECT_EQ(s2.background_current, s0.background_current) << "a background block leaves the background's counter";
  EXPECT_EQ(s2.foreground_current - s0.foreground_current, 2 * kMiB)
      << "training's bytes do not move when a background block is freed, on any thread";
  EXPECT_EQ(s2.foreground_current + s2.background_current, s2.current);
}

// The allocator's footprint (what it holds from the system) and its
// communication buffers are exact; the process breakdown adds up to its
// sample, which VmHWM bounds.
TEST_F(MemoryCache, FootprintCommBuffersAndTheProcessBreakdownAddUp) {
  const auto s0 = memory::stats();
  {
    auto t = torch::empty({8 * kMiB}, torch::kUInt8);
    const auto s1 = memory::stats();
    // A fresh block: page-rounded capacity plus its 64-byte header.
    EXPECT_EQ(s1.footprint - s0.footprint, 8 * kMiB + 64);
    EXPECT_GE(s1.footprint_high, s1.footprint);
    EXPECT_EQ(s1.comm_current, s0.comm_current) << "allocated outside CommBuffers: a tensor, not a comm buffer";
    {
      memory::CommBuffers comm;
      auto c = torch::empty({3 * kMiB}, torch::kUInt8);
      EXPECT_EQ(memory::stats().comm_current, s0.comm_current + 3 * kMiB);
      EXPECT_EQ(memory::stats().current, s1.current + 3 * kMiB) << "comm buffers are part of current";
    }
    EXPECT_EQ(memory::stats().comm_current, s0.comm_current) << "a freed comm buffer must leave comm_current";
  }
  memory::empty_cache();
  EXPECT_EQ(memory::stats().footprint, s0.footprint) << "empty_cache gives every cached block back";

  const memory::ProcessMemory m = memory::process_memory();
  EXPECT_GT(m.at_start, 0) << "the resident size at install is read from /proc/self/statm";
  EXPECT_GT(m.sample, m.at_start);
  EXPECT_GE(m.vmhwm, m.sample) << "VmHWM bounds every sample";
  EXPECT_EQ(m.elsewhere, m.vmhwm - m.sample);
  EXPECT_EQ(m.sample, m.at_start + m.code_since + m.tensors + m.comm + m.cache + m.malloc_other + m.malloc_free +
                          m.unexplained);
  EXPECT_EQ(m.fixed(), m.vmhwm - m.tensors - m.comm - m.cache);
  for (int64_t part : {m.code_since, m.tensors, m.comm, m.cache, m.malloc_other, m.malloc_free}) EXPECT_GE(part, 0);
  const std::string table = m.str();
  for (const char* row : {"at start", "code since", "tensors", "comm", "cache", "malloc used", "malloc free",
                          "unexplained", "= sample"})
    EXPECT_NE(table.find(row), std::string::npos) << row << " missing from:\n" << table;
}

}  // namespace FSDP_TEST_ID
