// fsdp-cpp tests: rank-side scenarios for the same-host transport (CMA).
//
// comm_sum_order     reduce_scatter / all_reduce of random (inexact) values
//                    equal, bit for bit, a local sum in the ring's order
// comm_kill_gather   one rank SIGKILLs itself while large all_gathers run;
//                    the others report how fast they failed and why
// comm_one_gloo      the Gloo libraries the process maps, and where Gloo's
//                    TCP device is defined
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "fsdp/comm.h"
#include "scenario.h"

namespace FSDP_TEST_ID {

using fsdp::ReduceOp;

// Rank q's input: random normals, so sums round and any other order of
// addition would show in the low bits.
torch::Tensor input_of(int q, int64_t n, c10::ScalarType dt) {
  torch::manual_seed(1000 + q);
  return torch::randn({n}, torch::kFloat).mul_(100).to(dt);
}

// The ring's order for chunk c (src/comm/cma.h): rank c+1, c+2, ..., then
// rank c; each addition in fp32, rounded to the dtype; AVG divides the last
// sum in fp32 before its rounding.
torch::Tensor ring_order_sum(const std::vector<torch::Tensor>& chunk_of_rank, int c, ReduceOp op) {
  const int n = static_cast<int>(chunk_of_rank.size());
  const auto dt = chunk_of_rank[0].scalar_type();
  torch::Tensor acc = chunk_of_rank[(c + 1) % n].clone();
  for (int i = 2; i <= n; ++i) {
    const auto& x = chunk_of_rank[(c + i) % n];
    torch::Tensor s = acc.to(torch::kFloat) + x.to(torch::kFloat);
    if (i == n && op == ReduceOp::AVG) s = s / static_cast<float>(n);
    acc = s.to(dt);
  }
  return acc;
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.numel() == b.numel() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

FSDP_SCENARIO(comm_sum_order) {
  auto c = fsdp::make_communicator_from_env();
  const int n = c->world_size(), r = c->rank();
  int failures = 0, checks = 0;
  auto expect = [&](bool ok, const std::string& what) {
    ++checks;
    if (!ok) {
      ++failures;
      std::printf("MISMATCH %s\n", what.c_str());
    }
  };
  for (auto dt : {c10::kFloat, c10::kBFloat16, c10::kHalf}) {
    // 2^18 + 3 fp32 elements per chunk are more than one 1 MiB piece.
    for (int64_t m : {int64_t(1000), (int64_t(1) << 18) + 3}) {
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        const std::string tag = std::string(c10::toString(dt)) + " m=" + std::to_string(m) +
                                (op == ReduceOp::AVG ? " avg" : " sum");
        std::vector<torch::Tensor> all;
        for (int q = 0; q < n; ++q) all.push_back(input_of(q, n * m, dt));
        // reduce_scatter: chunk r of every rank.
        auto out = torch::empty({m}, dt);
        c->reduce_scatter(all[r], out, op, {"order.rs"})->wait();
        std::vector<torch::Tensor> chunks;
        for (int q = 0; q < n; ++q) chunks.push_back(all[q].narrow(0, r * m, m));
        expect(bitwise_equal(out, ring_order_sum(chunks, r, op)), "reduce_scatter " + tag);
        // all_reduce of numel n*m + 1 (uneven chunks: the first one longer).
        const int64_t numel = n * m + 1;
        std::vector<torch::Tensor> ar;
        for (int q = 0; q < n; ++q) ar.push_back(input_of(q, numel, dt));
        auto t = ar[r].clone();
        c->all_reduce(t, op, {"order.ar"})->wait();
        int64_t at = 0;
        for (int k = 0; k < n; ++k) {
          const int64_t len = numel / n + (k < numel % n ? 1 : 0);
          std::vector<torch::Tensor> parts;
          for (int q = 0; q < n; ++q) parts.push_back(ar[q].narrow(0, at, len));
          expect(bitwise_equal(t.narrow(0, at, len).contiguous(), ring_order_sum(parts, k, op)),
                 "all_reduce chunk " + std::to_string(k) + " " + tag);
          at += len;
        }
      }
    }
  }
  std::printf("%s: sum order %d checks, %d failures\n", c->describe().c_str(), checks, failures);
  if (failures == 0) std::printf("comm_sum_order passed\n");
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

// args: <victim rank>. Every rank runs all_gathers of 16 MiB blocks (the
// victim's read by every peer) until the victim kills itself 300 ms in. The survivors ignore the launcher's SIGTERM (its --grace must
// outlast their timeout) so that they report their own failure.
FSDP_SCENARIO(comm_kill_gather) {
  const int victim = std::stoi(args.at(0));
  auto c = fsdp::make_communicator_from_env();
  const int r = c->rank(), n = c->world_size();
  const int64_t block = (int64_t(16) << 20) / 4;  // fp32 elements
  auto in = torch::full({block}, static_cast<float>(r));
  auto out = torch::empty({n * block});
  c->barrier()->wait();
  if (r == victim) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }).detach();
  } else {
    signal(SIGTERM, SIG_IGN);
  }
  std::printf("transport %s\n", c->describe().c_str());
  std::fflush(stdout);
  for (int i = 0;; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      c->all_gather(in, out, {"big.ag"})->wait();
    } catch (const fsdp::CollectiveError& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string msg = e.what();
      for (auto& ch : msg)
        if (ch == '\n') ch = '|';  // one line, so the test finds it whole
      std::printf("after %d gathers: elapsed=%.3f\nerror: %s\n", i, s, msg.c_str());
      std::fflush(stdout);
      return 1;
    }
  }
}

// Which Gloo the process runs: the libraries mapped whose name holds "gloo",
// and the file that defines Gloo's TCP device (libtorch's own, if it is the
// only Gloo), after a collective over TCP.
FSDP_SCENARIO(comm_one_gloo) {
  auto c = fsdp::make_communicator_from_env();
  auto t = torch::ones({4});
  c->all_reduce(t, fsdp::ReduceOp::SUM)->wait();
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::set<std::string> gloo_libs;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    if (path.find("gloo") != std::string::npos) gloo_libs.insert(path);
  }
  for (auto& p : gloo_libs) std::printf("rank %d maps %s\n", c->rank(), p.c_str());
  // gloo::transport::tcp::CreateDevice(gloo::transport::tcp::attr const&)
  void* sym = dlsym(RTLD_DEFAULT, "_ZN4gloo9transport3tcp12CreateDeviceERKNS1_4attrE");
  Dl_info info{};
  if (sym && dladdr(sym, &info) && info.dli_fname)
    std::printf("rank %d gloo from %s\n", c->rank(), info.dli_fname);
  else
    std::printf("rank %d gloo symbol not found\n", c->rank());
  std::printf("rank %d sum %g\n", c->rank(), t[0].item<double>());
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID
