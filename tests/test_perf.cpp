// fsdp-cpp tests: the performance claims that can be checked exactly —
// bf16 halves the bytes on the wire, and prefetch stays inside its in-flight
// limit (peak measured by the counting allocator against the ledger). The
// timings themselves are `make bench`'s job (bench/README.md), not a test's.
// Ranks run as processes (tests/workers/perf_scenarios.cpp).
#include <gtest/gtest.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>
#include <random>
#include <thread>

#include "comm/local_sum.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

// The reduce-scatter's local add (SIMD lanes + scalar tail) gives exactly
// the bits of the plain scalar arithmetic it documents: widen to the
// accumulation type, add, divide, round once. Random bit patterns cover NaN,
// infinities, subnormals and rounding ties; lengths cover the tails; dst
// aliasing either input is allowed.
template <class T, class Acc>
std::vector<T> scalar_reference(const std::vector<T>& a, const std::vector<T>& b, int divisor) {
  std::vector<T> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    Acc s = static_cast<Acc>(a[i]) + static_cast<Acc>(b[i]);
    out[i] = static_cast<T>(divisor == 1 ? s : s / static_cast<Acc>(divisor));
  }
  return out;
}

template <class T, class Acc>
void check_add_into(c10::ScalarType dtype, bool integer) {
  std::mt19937_64 gen(7);
  for (int64_t n : {0, 1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 10007}) {
    std::vector<T> a(n), b(n);
    auto fill = [&](std::vector<T>& v) {
      for (auto& x : v) {
        uint64_t bits = gen();
        std::memcpy(&x, &bits, sizeof(T));
      }
    };
    fill(a);
    fill(b);
    if (integer)  // keep sums in range: no signed overflow
      for (int64_t i = 0; i < n; ++i) {
        a[i] = static_cast<T>(static_cast<int64_t>(a[i]) >> 2);
        b[i] = static_cast<T>(static_cast<int64_t>(b[i]) >> 2);
      }
    for (int divisor : integer ? std::vector<int>{1} : std::vector<int>{1, 3}) {
      auto want = scalar_reference<T, Acc>(a, b, divisor);
      std::vector<T> out(n), x = a, y = b;
      fsdp::comm::add_into(out.data(), a.data(), b.data(), n, dtype, divisor);
      fsdp::comm::add_into(x.data(), x.data(), b.data(), n, dtype, divisor);  // dst == a
      fsdp::comm::add_into(y.data(), a.data(), y.data(), n, dtype, divisor);  // dst == b
      // Bit-equal, except that a NaN may carry either input's payload.
      auto mismatches = [&](const std::vector<T>& got) {
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) {
          bool nan = !integer && static_cast<Acc>(got[i]) != static_cast<Acc>(got[i]) &&
                     static_cast<Acc>(want[i]) != static_cast<Acc>(want[i]);
          bad += !nan && std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
        }
        return bad;
      };
      EXPECT_EQ(mismatches(out), 0) << c10::toString(dtype) << " n=" << n << " div=" << divisor;
      EXPECT_EQ(mismatches(x), 0) << c10::toString(dtype) << " n=" << n << " div=" << divisor << " dst==a";
      EXPECT_EQ(mismatches(y), 0) << c10::toString(dtype) << " n=" << n << " div=" << divisor << " dst==b";
    }
  }
}

TEST(PerfKernels, AddIntoIsBitExactScalarArithmetic) {
  check_add_into<float, float>(c10::kFloat, false);
  check_add_into<double, double>(c10::kDouble, false);
  check_add_into<c10::BFloat16, float>(c10::kBFloat16, false);
  check_add_into<c10::Half, float>(c10::kHalf, false);
  check_add_into<int32_t, int32_t>(c10::kInt, true);
  check_add_into<int64_t, int64_t>(c10::kLong, true);
}

// Same model, same step: bf16 parameters all-gather exactly half the bytes of
// fp32, and (reduce_dtype defaults to param_dtype) reduce-scatter half too.
TEST(PerfTraffic, Bf16AllGatherIsExactlyHalfOfFp32) {
  auto r = run_ranks(2, "perf_traffic");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto fp32 = lines_with(r.output, "TRAFFIC dtype=fp32");
  auto bf16 = lines_with(r.output, "TRAFFIC dtype=bf16");
  ASSERT_EQ(fp32.size(), 2u) << r.output;
  ASSERT_EQ(bf16.size(), 2u) << r.output;
  for (size_t i = 0; i < 2; ++i) {
    auto f = parse_kv(fp32[i]), b = parse_kv(bf16[i]);
    ASSERT_GT(f["ag"], 0) << fp32[i];
    EXPECT_EQ(2 * b["ag"], f["ag"]) << fp32[i] << "\n" << bf16[i];
    EXPECT_EQ(2 * b["rs"], f["rs"]) << fp32[i] << "\n" << bf16[i];
    EXPECT_EQ(b["ag_calls"], f["ag_calls"]);
    EXPECT_EQ(b["rs_calls"], f["rs_calls"]);
  }
}

// With prefetch on, the peak of a step stays within
//   rest + (limit + 1) P_block + A [+ (1 + 1/N) P_block with async reduce]
// rest: shards, shard grads, Adam state; limit units unsharded at once plus
// the unit in backward's gradients (autograd allocates them as it computes
// them, no temporary: they reach P_block when the unit's activations are
// gone); with async reduce, the one reduce-scatter in flight holds the
// previous unit's flat gradients (P_block, freed when it completes) and its
// output (P_block / N). Slack: 64 KiB of small tensors. A model of 8 MLP
// units with tiny activations makes P_block the term that moves. Two ranks,
// so the reduce-scatter really runs on the communication thread (at N=1 it
// completes at once).
struct Limit {
  long long peak = 0, rest = 0, pblock = 0, a = 0;
};
Limit run_limit(int limit, const std::string& mode, int layers = 8) {
  // The copying path: host-shared units (the default on one host) gather
  // into memory the allocator does not hold, so no limit shows in its peak.
  auto r = run_ranks(2, "perf_limit", {std::to_string(limit), mode, std::to_string(layers)}, {"FSDP_SHARE_HOST=off"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto lines = lines_with(r.output, "LIMIT");
  EXPECT_EQ(lines.size(), 2u) << r.output;
  Limit worst;
  for (auto& line : lines) {  // the larger peak of the two ranks (same rest)
    auto kv = parse_kv(line);
    std::printf("%s\n", line.c_str());
    if (kv["peak"] > worst.peak) worst = {kv["peak"], kv["rest"], kv["P_block"], kv["A"]};
  }
  return worst;
}
long long bound(const Limit& l, int limit, bool async) {
  return l.rest + (limit + 1) * l.pblock + l.a + (async ? l.pblock + l.pblock / 2 : 0) + (64 << 10);
}

// Each reduce-scatter waited for at once (async_reduce=false): the peak is
// the in-flight limit's, and limit 2 holds exactly one unit more than 1.
TEST(PerfLimit, PeakStaysWithinTheInFlightLimit) {
  auto one = run_limit(1, "SYNC"), two = run_limit(2, "SYNC");
  ASSERT_GT(one.pblock, 0);
  EXPECT_LE(one.peak, bound(one, 1, false)) << "limit_all_gathers=1";
  EXPECT_LE(two.peak, bound(two, 2, false)) << "limit_all_gathers=2";
  EXPECT_GE(two.peak - one.peak, two.pblock / 2);
  EXPECT_LE(two.peak - one.peak, two.pblock + (64 << 10));
}

// The default async reduce-scatter: one reduction in flight on top of the
// limit, and the peak does not grow with the number of units (16 units hold
// no more beyond their model state than 8).
TEST(PerfLimit, PeakStaysWithinTheInFlightLimitWithAsyncReduce) {
  auto one = run_limit(1, "ASYNC"), two = run_limit(2, "ASYNC"), deep = run_limit(2, "ASYNC", 16);
  ASSERT_GT(one.pblock, 0);
  EXPECT_LE(one.peak, bound(one, 1, true)) << "limit_all_gathers=1";
  EXPECT_LE(two.peak, bound(two, 2, true)) << "limit_all_gathers=2";
  EXPECT_LE(deep.peak, bound(deep, 2, true)) << "limit_all_gathers=2, 16 units";
}

// Threads per rank: cores / local ranks by default (libtorch follows
// OMP_NUM_THREADS), and idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE)
// once ranks x threads exceed the cores; a user's own setting is kept.
TEST(PerfThreads, DefaultIsCoresOverRanksAndOversubscriptionIsPassive) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto d = run_ranks(1, "perf_env");
  ASSERT_EQ(d.exit_code, 0) << d.output;
  auto lines = lines_with(d.output, "THREADS");
  ASSERT_EQ(lines.size(), 1u) << d.output;
  // One rank: it may use every core it is allowed (affinity can narrow it).
  auto kv = parse_kv(lines[0]);
  EXPECT_GE(kv["omp"], 1) << lines[0];
  EXPECT_LE(kv["omp"], cores) << lines[0];
  EXPECT_EQ(kv["torch"], kv["omp"]) << lines[0];
  EXPECT_NE(lines[0].find("wait=unset"), std::string::npos) << lines[0];

  // Two ranks with as many threads each as there are cores: oversubscribed.
  auto o = run_command({bin_path("fsdp"), "run", "-n", "2", "--threads", std::to_string(cores), "--",
                        bin_path("fsdp_test_worker"), "perf_env"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  auto ol = lines_with(o.output, "THREADS");
  ASSERT_EQ(ol.size(), 2u) << o.output;
  for (auto& l : ol) {
    EXPECT_NE(l.find("omp=" + std::to_string(cores) + " "), std::string::npos) << l;
    EXPECT_NE(l.find("wait=PASSIVE"), std::string::npos) << l;
  }
  auto u = run_ranks(2, "perf_env", {}, {"OMP_WAIT_POLICY=ACTIVE", "OMP_NUM_THREADS=" + std::to_string(cores)});
  ASSERT_EQ(u.exit_code, 0) << u.output;
  auto ul = lines_with(u.output, "THREADS");
  ASSERT_EQ(ul.size(), 2u) << u.output;
  for (auto& l : ul) EXPECT_NE(l.find("wait=ACTIVE"), std::string::npos) << l;
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
