// fsdp-cpp tests: rank-side scenarios for reliability (tests/test_reliability.cpp).
//
// rel_trace       collectives under a trace: "comm" spans with unit/bytes/seq
// rel_mismatch    FSDP_DEBUG=detail: one rank issues a different size (or marks
//                 the call compressible where the others do not)
// rel_latency     per-call latency of small all_reduces (cost of the detail check)
// rel_straggler   one rank works longer every step (on its own clock); StragglerMonitor names it
// rel_store_bind  where rank 0's rendezvous store listens
// rel_own_sigusr1 a program with its own SIGUSR1 handler embeds the library:
//                 after a communicator, fully_shard and a training step the
//                 handler is still its own and runs on SIGUSR1
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/straggler.h"
#include "fsdp/trace.h"
#include "scenario.h"

namespace FSDP_TEST_ID {

using fsdp::ReduceOp;
using Clock = std::chrono::steady_clock;

// args: <trace dir>
FSDP_SCENARIO(rel_trace) {
  auto c = fsdp::make_communicator_from_env();
  fsdp::trace::start(args.at(0), c->rank(), c->world_size());
  const int n = c->world_size();
  auto in = torch::ones({100}, torch::kFloat);
  auto out = torch::empty({100 * n}, torch::kFloat);
  c->all_gather(in, out, {"blocks.0"})->wait();
  auto rs_out = torch::empty({100}, torch::kFloat);
  c->reduce_scatter(out, rs_out, ReduceOp::SUM, {"blocks.0"})->wait();
  c->all_reduce(in, ReduceOp::SUM, {"clip_grad_norm"})->wait();
  c->broadcast(in, 0, {"init"})->wait();
  c->barrier({"end"})->wait();
  std::printf("trace written: %s\n", fsdp::trace::stop().c_str());
  return 0;
}

// args: <rank that differs> [size|lossy]: it issues 999 elements instead of
// 1000 (size, the default), or marks the call compressible (lossy)
FSDP_SCENARIO(rel_mismatch) {
  const int odd = std::stoi(args.at(0));
  const bool lossy = args.size() > 1 && args[1] == "lossy";
  auto c = fsdp::make_communicator_from_env();
  auto warm = torch::ones({8}, torch::kFloat);
  c->all_reduce(warm, ReduceOp::SUM, {"warmup"})->wait();
  auto t = torch::ones({c->rank() == odd && !lossy ? 999 : 1000}, torch::kFloat);
  auto t0 = Clock::now();
  try {
    c->all_reduce(t, ReduceOp::SUM, {"blocks.1", /*compressible=*/lossy && c->rank() == odd})->wait();
    std::printf("unexpected: the mismatched collective completed\n");
    std::fflush(stdout);
    return 1;
  } catch (const fsdp::CollectiveError& e) {
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::string msg = e.what();
    for (auto& ch : msg)
      if (ch == '\n') ch = '|';  // one line per rank for the test to grep
    std::printf("elapsed=%.3f\nmismatch error: %s\n", s, msg.c_str());
    std::fflush(stdout);
  }
  return 0;
}

// args: <calls> <numel>
FSDP_SCENARIO(rel_latency) {
  const int calls = std::stoi(args.at(0));
  const int64_t numel = std::stoll(args.at(1));
  auto c = fsdp::make_communicator_from_env();
  auto t = torch::ones({numel}, torch::kFloat);
  for (int i = 0; i < 20; ++i) c->all_reduce(t, ReduceOp::SUM, {"warmup"})->wait();
  auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) c->all_reduce(t, ReduceOp::SUM, {"lat"})->wait();
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / calls;
  std::printf("latency_us=%.1f\n", us);
  std::fflush(stdout);
  return 0;
}

// args: <slow rank> <steps> <base ms> <slow ms>
// Each rank's clock is its own count of work (no sleep, no wall clock): a
// step's work advances it by base ms (the slow rank's by slow ms), and the
// wait clock reads it around every blocking wait, as a trainer measures
// busy = wall - blocked. So the monitor sees exactly those times, whatever
// else the machine runs.
FSDP_SCENARIO(rel_straggler) {
  const int slow = std::stoi(args.at(0)), steps = std::stoi(args.at(1));
  const int base_ms = std::stoi(args.at(2)), slow_ms = std::stoi(args.at(3));
  double now = 0;  // seconds of this rank's work; read on this thread only
  auto waits = std::make_shared<fsdp::WaitClock>([&now] { return now; });
  auto c = fsdp::with_wait_clock(fsdp::make_communicator_from_env(), waits);
  fsdp::StragglerMonitor mon(c, 1.5, 5);
  int first_named = -1;
  for (int step = 1; step <= steps; ++step) {
    const double t0 = now, w0 = waits->seconds();
    now += (c->rank() == slow ? slow_ms : base_ms) / 1000.0;  // the step's work
    c->barrier({"step"})->wait();                             // blocked: no work
    auto rep = mon.observe((now - t0) - (waits->seconds() - w0));
    if (!rep.stragglers.empty() && first_named < 0) {
      first_named = static_cast<int>(step);
      std::printf("stragglers at step %d:", step);
      for (int q : rep.stragglers) std::printf(" %d", q);
      std::printf("\n");
    }
  }
  std::printf("first named at step %d\n", first_named);
  std::printf("summary: %s\n", mon.summary().c_str());
  std::fflush(stdout);
  return 0;
}

// Prints the local address of every listening TCP socket on MASTER_PORT.
FSDP_SCENARIO(rel_store_bind) {
  auto c = fsdp::make_communicator_from_env();
  if (c->rank() == 0) {
    const int port = std::stoi(std::getenv("MASTER_PORT"));
    char want[8];
    std::snprintf(want, sizeof want, "%04X", port);
    for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
      std::ifstream f(file);
      std::string line;
      std::getline(f, line);  // header
      while (std::getline(f, line)) {
        std::istringstream ss(line);
        std::string sl, local, remote, st;
        ss >> sl >> local >> remote >> st;
        if (st != "0A") continue;  // LISTEN
        auto colon = local.rfind(':');
        if (local.substr(colon + 1) != want) continue;
        std::printf("store listens on %s %s\n", file, local.substr(0, colon).c_str());
      }
    }
    std::fflush(stdout);
  }
  c->barrier()->wait();
  return 0;
}

std::atomic<int> g_own_usr1{0};
void own_usr1(int) { g_own_usr1.fetch_add(1); }

FSDP_SCENARIO(rel_own_sigusr1) {
  struct sigaction sa {};
  sa.sa_handler = own_usr1;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  auto c = fsdp::make_communicator_from_env();
  torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::Linear(8, 3));
  fsdp::FsdpOptions o;
  o.wrap = fsdp::WrapPolicy::size_based(1);
  auto model = fsdp::fully_shard(net, c, o);
  auto loss = model.forward(torch::randn({4, 6})).pow(2).mean();
  loss.backward();
  c->barrier()->wait();
  struct sigaction now {};
  sigaction(SIGUSR1, nullptr, &now);
  raise(SIGUSR1);
  std::printf("rank %d handler %s, ran %d time(s)\n", c->rank(), now.sa_handler == own_usr1 ? "own" : "replaced",
              g_own_usr1.load());
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID
