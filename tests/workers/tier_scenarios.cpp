// fsdp-cpp tests: rank-side logic of tests/test_comm_tiers.cpp.
//
// tier_sums   random fp32 / bf16 values through all_reduce and
//             reduce_scatter, against a local fp64 sum of every rank's
//             input (the tiers sum in another order than the flat ring:
//             equal to rounding), and every rank's all_reduce bit-identical
// tier_bytes  the exact bytes per tier of one all_gather, reduce_scatter
//             and all_reduce: prints TIERBYTES lines for the test
// Hosts come from FSDP_TEST_HOST_LAYOUT (worker_main.cpp) or the launchers'
// FSDP_HOST_ID.
#include <cstdio>
#include <string>

#include "fsdp/comm.h"
#include "scenario.h"

namespace FSDP_TEST_ID {

using fsdp::CollectiveKind;
using fsdp::ReduceOp;

torch::Tensor random_input(int rank, int64_t n, c10::ScalarType dt) {
  torch::manual_seed(1000 + rank);
  return torch::randn({n}, torch::kFloat).to(dt);
}

FSDP_SCENARIO(tier_sums) {
  auto c = fsdp::make_communicator_from_env();
  const int n = c->world_size(), r = c->rank();
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::printf("MISMATCH %s\n", what.c_str());
      std::fflush(stdout);
    }
  };
  for (auto dt : {c10::kFloat, c10::kBFloat16}) {
    const double rtol = dt == c10::kFloat ? 1e-5 : 2e-2, atol = dt == c10::kFloat ? 1e-5 : 5e-2;
    for (int64_t m : {int64_t(7), int64_t(1000), int64_t(1) << 16}) {
      const std::string tag = std::string(c10::toString(dt)) + " m=" + std::to_string(m);
      auto ref = torch::zeros({n * m}, torch::kDouble);
      for (int q = 0; q < n; ++q) ref += random_input(q, n * m, dt).to(torch::kDouble);
      // reduce_scatter, SUM and AVG.
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        auto out = torch::empty({m}, dt);
        c->reduce_scatter(random_input(r, n * m, dt), out, op, {"tier.rs"})->wait();
        auto want = ref.slice(0, r * m, (r + 1) * m) / (op == ReduceOp::AVG ? n : 1);
        check(torch::allclose(out.to(torch::kDouble), want, rtol, atol), "reduce_scatter " + tag);
      }
      // all_reduce (numel n*m+1: uneven chunks), every rank the same bits.
      auto t = random_input(r, n * m + 1, dt);
      auto want = torch::zeros({n * m + 1}, torch::kDouble);
      for (int q = 0; q < n; ++q) want += random_input(q, n * m + 1, dt).to(torch::kDouble);
      c->all_reduce(t, ReduceOp::SUM, {"tier.ar"})->wait();
      check(torch::allclose(t.to(torch::kDouble), want, rtol, atol), "all_reduce " + tag);
      auto all = torch::empty({n * (n * m + 1)}, dt);
      c->all_gather(t, all, {"tier.ar.same"})->wait();
      for (int q = 0; q < n; ++q)
        check(torch::equal(all.slice(0, q * (n * m + 1), (q + 1) * (n * m + 1)), t),
              "all_reduce bit-identical on rank " + std::to_string(q) + " " + tag);
    }
  }
  std::printf("tier_sums %s: %d failures\n", c->describe().c_str(), failures);
  if (failures == 0) std::printf("tier_sums passed\n");
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

// args: <floats per rank>
FSDP_SCENARIO(tier_bytes) {
  const int64_t m = std::stoll(args.at(0));
  auto c = fsdp::make_communicator_from_env();
  const int n = c->world_size(), r = c->rank();
  c->reset_counters();
  {
    auto out = torch::empty({n * m});
    c->all_gather(torch::ones({m}), out, {"tier.ag"})->wait();
    auto in = torch::ones({n * m});
    auto o = torch::empty({m});
    c->reduce_scatter(in, o, ReduceOp::SUM, {"tier.rs"})->wait();
    auto t = torch::ones({n * m});
    c->all_reduce(t, ReduceOp::SUM, {"tier.ar"})->wait();
  }
  auto k = c->counters();
  const auto &ag = k[CollectiveKind::ALL_GATHER], &rs = k[CollectiveKind::REDUCE_SCATTER],
             &ar = k[CollectiveKind::ALL_REDUCE];
  std::printf("TIERBYTES rank=%d ag=%lld ag_inter=%lld rs=%lld rs_inter=%lld ar=%lld ar_inter=%lld tiers=%d\n", r,
              (long long)ag.bytes_sent, (long long)ag.bytes_inter_host, (long long)rs.bytes_sent,
              (long long)rs.bytes_inter_host, (long long)ar.bytes_sent, (long long)ar.bytes_inter_host,
              c->describe().find("tiers") != std::string::npos ? 1 : 0);
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID
