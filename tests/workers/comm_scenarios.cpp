// fsdp-cpp tests: rank-side scenarios for the communicator and the launcher.
//
// comm_collectives   every collective x dtype x size, checked against values
//                    computed locally, plus exact byte counters
// comm_timeout       one rank never arrives at a collective
// comm_world_mismatch, comm_hello
// launcher_env, launcher_exit, launcher_kill, launcher_flaky, launcher_sigint
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "fsdp/comm.h"
#include "scenario.h"

namespace FSDP_TEST_ID {

using fsdp::CollectiveKind;
using fsdp::ReduceOp;

// Small integers: exact in bf16/fp16 and under every sum of up to 4 ranks,
// so any summation order gives the same bits. Varies with rank and index.
int64_t enc(int64_t rank, int64_t index) { return (rank * 31 + index * 7) % 61 - 30; }

torch::Tensor encoded(c10::ScalarType dtype, int64_t n, int rank, int64_t offset) {
  auto idx = torch::arange(offset, offset + n, torch::kLong);
  return ((idx * 7 + rank * 31) % 61 - 30).to(dtype);
}

// The expected reduction of elements [offset, offset+n) over `world` ranks.
torch::Tensor expected_reduce(c10::ScalarType dtype, int64_t n, int world, int64_t offset, ReduceOp op) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t sum = 0;
    for (int q = 0; q < world; ++q) sum += enc(q, offset + i);
    // Same arithmetic as the kernel: exact sum, one division in the
    // accumulation type, one rounding to the dtype.
    if (op == ReduceOp::AVG)
      v[i] = dtype == c10::kDouble ? static_cast<double>(sum) / world
                                   : static_cast<double>(static_cast<float>(sum) / static_cast<float>(world));
    else
      v[i] = static_cast<double>(sum);
  }
  return torch::tensor(v, torch::kDouble).to(dtype);
}

struct Checker {
  int failures = 0, checks = 0;
  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok) {
      ++failures;
      std::printf("MISMATCH %s\n", what.c_str());
      std::fflush(stdout);
    }
  }
};

std::string name(c10::ScalarType t) { return c10::toString(t); }

int64_t counted(fsdp::Communicator& c, CollectiveKind k, int64_t before) {
  return c.counters()[k].bytes_sent - before;
}

int run_grid(fsdp::Communicator& c, Checker& ck) {
  const int n_ranks = c.world_size(), r = c.rank();
  // Composed tiers: H hosts of S ranks; this rank is local index `local`
  // on its host and j-th among the ranks of that local index.
  const bool composed = c.describe().find("tiers") != std::string::npos;
  const std::vector<int> hosts = c.hosts();
  int H = 0, local = 0, j = 0;
  for (int h : hosts) H = std::max(H, h + 1);
  const int S = n_ranks / std::max(H, 1);
  for (int q = 0; q < r; ++q) local += hosts[q] == hosts[r];
  for (int q = 0; q < r; ++q) {
    int lq = 0;
    for (int p = 0; p < q; ++p) lq += hosts[p] == hosts[q];
    j += lq == local;
  }
  const std::vector<c10::ScalarType> dtypes = {c10::kFloat, c10::kBFloat16, c10::kHalf, c10::kInt, c10::kLong};
  for (auto dt : dtypes) {
    // The large size exercises the transport (same bytes whatever the dtype):
    // run it for the two dtypes FSDP moves most, keeping the test fast.
    std::vector<int64_t> sizes = {0, 1, 7, 1000};
    if (dt == c10::kFloat || dt == c10::kBFloat16) sizes.push_back(1 << 20);
    const bool is_float = c10::isFloatingType(dt);
    const int64_t es = c10::elementSize(dt);
    for (int64_t n : sizes) {
      std::string tag = name(dt) + " n=" + std::to_string(n);
      // all_gather: rank-major blocks.
      {
        auto in = encoded(dt, n, r, 0);
        auto out = torch::full({n_ranks * n}, -99, dt);
        int64_t b0 = c.counters()[CollectiveKind::ALL_GATHER].bytes_sent;
        c.all_gather(in, out, {"grid.ag"})->wait();
        std::vector<torch::Tensor> parts;
        for (int q = 0; q < n_ranks; ++q) parts.push_back(encoded(dt, n, q, 0));
        ck.expect(torch::equal(out, torch::cat(parts)), "all_gather " + tag);
        ck.expect(counted(c, CollectiveKind::ALL_GATHER, b0) == (n_ranks - 1) * n * es,
                  "all_gather bytes " + tag);
      }
      // reduce_scatter: rank r gets the reduction of block r.
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        if (op == ReduceOp::AVG && !is_float) continue;
        auto in = encoded(dt, n_ranks * n, r, 0);
        auto out = torch::full({n}, -99, dt);
        int64_t b0 = c.counters()[CollectiveKind::REDUCE_SCATTER].bytes_sent;
        c.reduce_scatter(in, out, op, {"grid.rs"})->wait();
        std::string t = tag + (op == ReduceOp::AVG ? " avg" : " sum");
        ck.expect(torch::equal(out, expected_reduce(dt, n, n_ranks, r * n, op)), "reduce_scatter " + t);
        ck.expect(torch::equal(in, encoded(dt, n_ranks * n, r, 0)), "reduce_scatter kept input " + t);
        ck.expect(counted(c, CollectiveKind::REDUCE_SCATTER, b0) == (n_ranks - 1) * n * es,
                  "reduce_scatter bytes " + t);
      }
      // all_reduce, in place; numel n is deliberately not a multiple of N.
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        if (op == ReduceOp::AVG && !is_float) continue;
        auto t = encoded(dt, n, r, 0);
        int64_t b0 = c.counters()[CollectiveKind::ALL_REDUCE].bytes_sent;
        c.all_reduce(t, op, {"grid.ar"})->wait();
        std::string s = tag + (op == ReduceOp::AVG ? " avg" : " sum");
        ck.expect(torch::equal(t, expected_reduce(dt, n, n_ranks, 0, op)), "all_reduce " + s);
        // Ring: every chunk but ours in the reduce-scatter, every chunk but
        // our right neighbour's in the all-gather.
        auto chunk = [](int64_t numel, int world, int j) { return numel / world + (j < numel % world ? 1 : 0); };
        int64_t want = n_ranks == 1 ? 0 : (2 * n - chunk(n, n_ranks, r) - chunk(n, n_ranks, (r + 1) % n_ranks)) * es;
        if (composed) {
          // Tiers (src/comm/tiers.h): intra reduce-scatter of S chunks,
          // inter all-reduce of chunk s over H, intra all-gather.
          const int64_t cs = chunk(n, S, local);
          want = ((n - cs) + (2 * cs - chunk(cs, H, j) - chunk(cs, H, (j + 1) % H)) + (n - chunk(n, S, (local + 1) % S))) * es;
          if (n == 0) want = 0;
        }
        ck.expect(counted(c, CollectiveKind::ALL_REDUCE, b0) == want, "all_reduce bytes " + s);
      }
      // broadcast from a root that varies with the size.
      {
        int root = static_cast<int>(n % n_ranks);
        auto t = r == root ? encoded(dt, n, root, 0) : torch::zeros({n}, dt);
        int64_t b0 = c.counters()[CollectiveKind::BROADCAST].bytes_sent;
        c.broadcast(t, root, {"grid.bc"})->wait();
        ck.expect(torch::equal(t, encoded(dt, n, root, 0)), "broadcast " + tag);
        ck.expect(counted(c, CollectiveKind::BROADCAST, b0) == (r == root ? (n_ranks - 1) * n * es : 0),
                  "broadcast bytes " + tag);
      }
      // gather to a root that varies with the size; non-roots pass no output.
      {
        int root = static_cast<int>((n + 1) % n_ranks);
        auto in = encoded(dt, n, r, 0);
        torch::Tensor out = r == root ? torch::full({n_ranks * n}, -99, dt) : torch::Tensor();
        int64_t b0 = c.counters()[CollectiveKind::GATHER].bytes_sent;
        c.gather(in, out, root, {"grid.ga"})->wait();
        if (r == root) {
          std::vector<torch::Tensor> parts;
          for (int q = 0; q < n_ranks; ++q) parts.push_back(encoded(dt, n, q, 0));
          ck.expect(torch::equal(out, torch::cat(parts)), "gather " + tag);
        }
        ck.expect(torch::equal(in, encoded(dt, n, r, 0)), "gather kept input " + tag);
        ck.expect(counted(c, CollectiveKind::GATHER, b0) == (r == root ? 0 : n * es), "gather bytes " + tag);
      }
    }
  }
  // Three collectives in flight at once, waited in reverse order.
  for (int64_t n : {int64_t(1000), int64_t(1) << 20}) {
    auto ag_in = encoded(c10::kFloat, n, r, 0), ag_out = torch::empty({n_ranks * n}, torch::kFloat);
    auto rs_in = encoded(c10::kBFloat16, n_ranks * n, r, 0), rs_out = torch::empty({n}, torch::kBFloat16);
    auto ar = encoded(c10::kFloat, n + 3, r, 0);
    auto w1 = c.all_gather(ag_in, ag_out, {"inflight.ag"});
    auto w2 = c.reduce_scatter(rs_in, rs_out, ReduceOp::SUM, {"inflight.rs"});
    auto w3 = c.all_reduce(ar, ReduceOp::AVG, {"inflight.ar"});
    w3->wait();
    w2->wait();
    w1->wait();
    ck.expect(w1->is_completed() && w2->is_completed() && w3->is_completed(), "in flight: completed");
    std::vector<torch::Tensor> parts;
    for (int q = 0; q < n_ranks; ++q) parts.push_back(encoded(c10::kFloat, n, q, 0));
    ck.expect(torch::equal(ag_out, torch::cat(parts)), "in flight all_gather");
    ck.expect(torch::equal(rs_out, expected_reduce(c10::kBFloat16, n, n_ranks, r * n, ReduceOp::SUM)),
              "in flight reduce_scatter");
    ck.expect(torch::equal(ar, expected_reduce(c10::kFloat, n + 3, n_ranks, 0, ReduceOp::AVG)),
              "in flight all_reduce");
  }
  int64_t b0 = c.counters()[CollectiveKind::BARRIER].calls;
  c.barrier({"grid.end"})->wait();
  ck.expect(c.counters()[CollectiveKind::BARRIER].calls == b0 + 1, "barrier counted");
  return ck.failures;
}

FSDP_SCENARIO(comm_collectives) {
  auto c = fsdp::make_communicator_from_env();
  auto t0 = std::chrono::steady_clock::now();
  Checker ck;
  run_grid(*c, ck);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %d checks, %d failures, %.2f s\n", c->describe().c_str(), ck.checks, ck.failures, s);
  if (ck.failures == 0) std::printf("comm_collectives passed\n");
  std::fflush(stdout);
  return ck.failures == 0 ? 0 : 1;
}

// args: <missing rank> <sequence number it never reaches>
FSDP_SCENARIO(comm_timeout) {
  const int missing = std::stoi(args.at(0));
  const int at = std::stoi(args.at(1));
  auto c = fsdp::make_communicator_from_env();
  auto t = torch::ones({1000}, torch::kBFloat16);
  for (int seq = 1; seq < at; ++seq) c->all_reduce(t, ReduceOp::SUM, {"warmup"})->wait();
  if (c->rank() == missing) {
    std::printf("rank %d stays away from collective #%d\n", c->rank(), at);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  auto t0 = std::chrono::steady_clock::now();
  try {
    c->all_reduce(t, ReduceOp::SUM, {"blocks.3"})->wait();
    std::printf("unexpected: the collective completed\n");
    return 0;
  } catch (const fsdp::CollectiveError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("elapsed=%.3f\nerror: %s\n", s, e.what());
  }
  // Fail fast: every later call fails at once with the same error.
  auto t1 = std::chrono::steady_clock::now();
  try {
    c->barrier()->wait();
  } catch (const fsdp::CollectiveError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::printf("later call failed after %.3f s: %s\n", s,
                std::string(e.what()).find("collective #") != std::string::npos ? "same error" : e.what());
  }
  std::fflush(stdout);
  return 1;
}

// args: <rank> <WORLD_SIZE it believes in>
FSDP_SCENARIO(comm_world_mismatch) {
  const char* rank = std::getenv("RANK");
  if (rank && std::stoi(rank) == std::stoi(args.at(0))) setenv("WORLD_SIZE", args.at(1).c_str(), 1);
  auto c = fsdp::make_communicator_from_env();
  c->barrier()->wait();
  std::printf("unexpected: the world formed\n");
  return 0;
}

FSDP_SCENARIO(comm_hello) {
  auto c = fsdp::make_communicator_from_env();
  c->barrier()->wait();
  std::printf("hello from %s\n", c->describe().c_str());
  return 0;
}

FSDP_SCENARIO(launcher_env) {
  std::string line = "env";
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "FSDP_RESTART_COUNT"}) {
    const char* v = std::getenv(k);
    line += std::string(" ") + k + "=" + (v ? v : "<unset>");
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

// args: <rank> <exit code>; the others would sleep for a minute.
FSDP_SCENARIO(launcher_exit) {
  int me = std::atoi(std::getenv("RANK"));
  if (me == std::stoi(args.at(0))) {
    std::printf("rank %d: about to exit with %s\n", me, args.at(1).c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return std::stoi(args.at(1));
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

// args: <rank>; that rank SIGKILLs itself.
FSDP_SCENARIO(launcher_kill) {
  int me = std::atoi(std::getenv("RANK"));
  if (me == std::stoi(args.at(0))) {
    std::printf("rank %d: about to be killed\n", me);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    raise(SIGKILL);
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

// Rank 0 fails until the launcher has restarted it <args[0]> times.
FSDP_SCENARIO(launcher_flaky) {
  int restart = std::atoi(std::getenv("FSDP_RESTART_COUNT"));
  int me = std::atoi(std::getenv("RANK"));
  std::printf("attempt %d\n", restart);
  std::fflush(stdout);
  if (me == 0 && restart < std::stoi(args.at(0))) return 1;
  if (me != 0 && restart < std::stoi(args.at(0))) std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

// Rank 0 sends SIGINT to the launcher, which must forward it to every rank.
FSDP_SCENARIO(launcher_sigint) {
  static volatile sig_atomic_t got = 0;
  signal(SIGINT, [](int) { got = 1; });
  // Every rank has its handler before rank 0 pulls the trigger.
  auto c = fsdp::make_communicator_from_env();
  c->barrier()->wait();
  std::printf("ready\n");
  std::fflush(stdout);
  if (c->rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(getppid(), SIGINT);
  }
  for (int i = 0; i < 600 && !got; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::printf(got ? "got SIGINT\n" : "no SIGINT\n");
  std::fflush(stdout);
  return got ? 0 : 1;
}

}  // namespace FSDP_TEST_ID
