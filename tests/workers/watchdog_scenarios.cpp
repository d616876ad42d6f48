// fsdp-cpp tests: rank-side scenarios for the watchdog (tests/test_watchdog.cpp).
//
// wd_train  a training-shaped loop of collectives with phases: per step
//           data, forward (all_gather 'blocks.0'), backward (reduce_scatter
//           'blocks.0'), optimizer (all_reduce 'clip_grad_norm'); prints
//           "step N" on rank 0. A fault at a given step on a given rank:
//             stop      the rank stops itself (SIGSTOP) inside the backward's
//                       reduce_scatter (its communication thread inside,
//                       as the flight recorder shows; use a large numel)
//             kill      the same, SIGKILL
//             data      the rank loops forever in its data phase
//             desync    the rank issues an all_reduce 'other' where the
//                       others issue the reduce_scatter
//           args: <steps> <numel> [<fault> <rank> <step>]
//           A rank whose collective fails prints "wd error: <message, one
//           line, '|' for newlines>" and exits 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "fsdp/comm.h"
#include "fsdp/flight.h"
#include "scenario.h"

namespace FSDP_TEST_ID {

using fsdp::Phase;
using fsdp::PhaseScope;
using fsdp::ReduceOp;

FSDP_SCENARIO(wd_train) {
  const int steps = std::stoi(args.at(0));
  const int64_t numel = std::stoll(args.at(1));
  const std::string fault = args.size() > 2 ? args[2] : "";
  const int fault_rank = args.size() > 3 ? std::stoi(args[3]) : -1;
  const int fault_step = args.size() > 4 ? std::stoi(args[4]) : -1;
  auto c = fsdp::make_communicator_from_env();
  const int n = c->world_size(), me = c->rank();
  auto shard = torch::ones({numel}, torch::kFloat);
  auto full = torch::empty({numel * n}, torch::kFloat);
  auto grad_shard = torch::empty({numel}, torch::kFloat);
  auto norm = torch::ones({1}, torch::kFloat);
  try {
    for (int step = 0; step < steps; ++step) {
      fsdp::set_step(step);
      const bool faulty = me == fault_rank && step == fault_step;
      {
        PhaseScope p(Phase::DATA);
        if (faulty && fault == "data") {
          volatile uint64_t spin = 0;
          for (;;) spin = spin + 1;
        }
      }
      {
        PhaseScope p(Phase::FORWARD);
        c->all_gather(shard, full, {"blocks.0"})->wait();
      }
      {
        PhaseScope p(Phase::BACKWARD);
        if (faulty && fault == "desync") {
          c->all_reduce(norm, ReduceOp::SUM, {"other"})->wait();
        } else {
          auto w = c->reduce_scatter(full, grad_shard, ReduceOp::AVG, {"blocks.0"});
          if (faulty && (fault == "stop" || fault == "kill")) {
            // Until its communication thread is inside (the flight recorder
            // says so); the collective is large enough to last a while.
            fsdp::flight::Record in;
            const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
            while (!(fsdp::flight::in_flight(&in) && in.kind == "reduce_scatter") &&
                   std::chrono::steady_clock::now() < give_up)
              std::this_thread::yield();
            std::printf("rank %d: %s inside reduce_scatter 'blocks.0' at step %d\n", me,
                        fault == "stop" ? "stopping" : "killed", step);
            std::fflush(stdout);
            kill(getpid(), fault == "stop" ? SIGSTOP : SIGKILL);
          }
          w->wait();
        }
      }
      {
        PhaseScope p(Phase::OPTIMIZER);
        c->all_reduce(norm, ReduceOp::AVG, {"clip_grad_norm"})->wait();
      }
      if (me == 0) {
        std::printf("step %d\n", step);
        std::fflush(stdout);
      }
    }
  } catch (const fsdp::CollectiveError& e) {
    std::string msg = e.what();
    for (auto& ch : msg)
      if (ch == '\n') ch = '|';
    std::printf("wd error: %s\n", msg.c_str());
    std::fflush(stdout);
    return 1;
  }
  return 0;
}

}  // namespace FSDP_TEST_ID
