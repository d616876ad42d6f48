// fsdp-cpp tests: rank-side logic of tests/test_replicas.cpp.
//
// replica_train STEPS [STRATEGY] [D]: one replica group (this `fsdp run`,
// FSDP_REPLICA_GROUP, FSDP_COORDINATOR) trains the core test model
// (tests/core_model.h, width D, default 12) with Adam for STEPS committed
// steps under fsdp::ReplicaGroups. Rank r of group g at step s trains on
// batch_of(s, g, r) (replica_batch.h); each attempt prints
//   STEP group=G rank=R step=S q=Q members=0,1,2 commit=1|0 healed=0|1 heal_ms=.. heal_bytes=..
// and at the end rank 0 prints every parameter in full:
//   PARAM <name> v0 v1 ...      (%.9g)
// FSDP_TEST_FAULT="G:R:S:WHAT" hurts rank R of group G at step S of its
// first launch (FSDP_RESTART_COUNT 0): WHAT is kill (SIGKILL before the
// step's forward), kill_backward (SIGKILL inside backward, once the
// input's gradient is computed: the means across groups of the units
// reduced before it are in flight), kill_reduce (SIGKILL after backward,
// before the vote), stop_reduce (SIGSTOP after backward, once; the test sends
// SIGCONT), kill_lend (SIGKILL half way through lending its shard in the
// first heal at step S or later: after the header, before the tensors) or
// kill_take (the same on the healing side). FSDP_TEST_HOLD="S:FILE" holds
// this group before its step S until FILE exists (the test makes it once
// what it waits for happened; FSDP_TEST_HOLD2 a second hold). Each launch prints
//   LAUNCH group=G rank=R pid=P restart=K
// so that a test can stop or kill it from outside.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "../core_model.h"
#include "../replica_batch.h"
#include "fsdp/comm.h"
#include "fsdp/config.h"
#include "fsdp/fully_shard.h"
#include "fsdp/replicas.h"
#include "fsdp/trace.h"
#include "scenario.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

struct Fault {
  int group = -1, rank = -1;
  int64_t step = -1;
  std::string what;
  int ms = 0;
};

Fault fault_from_env() {
  Fault f;
  const char* e = std::getenv("FSDP_TEST_FAULT");
  const char* restart = std::getenv("FSDP_RESTART_COUNT");
  if (!e || (restart && std::atoi(restart) != 0)) return f;
  std::stringstream ss(e);
  std::string part;
  std::vector<std::string> p;
  while (std::getline(ss, part, ':')) p.push_back(part);
  FSDP_USER_CHECK(p.size() >= 4, "FSDP_TEST_FAULT=", e, ": expected G:R:S:WHAT");
  f.group = std::stoi(p[0]);
  f.rank = std::stoi(p[1]);
  f.step = std::stoll(p[2]);
  f.what = p[3];
  if (p.size() > 4) f.ms = std::stoi(p[4]);
  return f;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

void hold_at(int64_t step) {
  for (const char* name : {"FSDP_TEST_HOLD", "FSDP_TEST_HOLD2"}) {
    const char* h = std::getenv(name);
    if (!h) continue;
    const std::string v = h;
    const auto colon = v.find(':');
    if (std::stoll(v.substr(0, colon)) != step) continue;
    const std::string file = v.substr(colon + 1);
    // FILE.held says a rank waits here (FSDP_TEST_HOLD_RELAUNCH waits for it).
    if (access(file.c_str(), F_OK) != 0) close(open((file + ".held").c_str(), O_CREAT | O_WRONLY, 0644));
    for (int i = 0; i < 12000 && access(file.c_str(), F_OK) != 0; ++i) usleep(10000);
  }
}

// FSDP_TEST_HOLD_RELAUNCH=FILE: a relaunched rank (FSDP_RESTART_COUNT > 0)
// waits for FILE before it registers, so that the others reach a step first.
void hold_relaunch() {
  const char* restart = std::getenv("FSDP_RESTART_COUNT");
  const char* file = std::getenv("FSDP_TEST_HOLD_RELAUNCH");
  if (!file || !restart || std::atoi(restart) == 0) return;
  for (int i = 0; i < 12000 && access(file, F_OK) != 0; ++i) usleep(10000);
}

FSDP_SCENARIO(replica_train) {
  const int64_t steps = std::stoll(args.at(0));
  const std::string strategy = args.size() > 1 ? args[1] : "FULL_SHARD";
  const int64_t d = args.size() > 2 ? std::stoll(args[2]) : 12;
  auto comm = make_communicator_from_env();
  torch::manual_seed(1);
  Net net(7, d, 5, 3);
  FsdpOptions o;
  o.strategy = parse_strategy(strategy);
  o.wrap = WrapPolicy::predicate(
      [](const std::string&, const torch::nn::Module& m, int64_t) {
        return dynamic_cast<const BlockImpl*>(&m) || dynamic_cast<const GateImpl*>(&m);
      },
      "Block and Gate");
  auto model = fully_shard(net, comm, o);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  const Fault fault = fault_from_env();
  const int r = comm->rank();
  const char* restart = std::getenv("FSDP_RESTART_COUNT");
  ReplicaOptions ro;
  ro.on_heal = [&fault, r](const HealProgress& h) {
    // Half way through the first heal at step S or later: the header
    // crossed, the tensors have not.
    const int g = config::read_env().replica_group.value_or(-1);
    if (fault.group != g || fault.rank != r || h.step < fault.step || h.bytes == h.total) return;
    if ((fault.what == "kill_lend" && h.lending) || (fault.what == "kill_take" && !h.lending)) raise(SIGKILL);
  };
  hold_relaunch();
  ReplicaGroups replicas(*model, opt, ro);
  std::printf("LAUNCH group=%d rank=%d pid=%d restart=%s\n", replicas.group(), r, static_cast<int>(getpid()),
              restart ? restart : "0");
  std::fflush(stdout);
  // FSDP_TEST_TRACE=DIR: each group's ranks trace into DIR/group<g>, as gpt --trace does.
  const char* trace_to = std::getenv("FSDP_TEST_TRACE");
  if (trace_to)
    trace::start(std::string(trace_to) + "/group" + std::to_string(replicas.group()), comm->rank(), comm->world_size());
  const int g = replicas.group();
  const bool hurt_here = fault.group == g && fault.rank == r;
  bool hurt = false;  // once per launch
  while (replicas.step() < steps) {
    hold_at(replicas.step());
    const StepQuorum& q = replicas.start_step();
    trace::Span span("step", "step");
    if (span.active()) span.arg("step", q.step);
    if (hurt_here && q.step == fault.step && fault.what == "kill") raise(SIGKILL);
    auto [x, y] = batch_of(q.step, g, r);
    if (hurt_here && q.step == fault.step && fault.what == "kill_backward") {
      x.requires_grad_(true);
      x.register_hook([](const torch::Tensor& grad) {
        raise(SIGKILL);
        return grad;
      });
    }
    auto loss = torch::mse_loss(model.forward(x), y);
    loss.backward();
    if (hurt_here && q.step == fault.step && fault.what == "kill_reduce") raise(SIGKILL);
    if (hurt_here && q.step == fault.step && fault.what == "stop_reduce" && !hurt) {
      hurt = true;
      raise(SIGSTOP);
    }
    const bool commit = replicas.commit();
    if (commit) opt.step();
    opt.zero_grad();
    std::printf("STEP group=%d rank=%d step=%lld q=%lld members=%s commit=%d healed=%d heal_ms=%.1f heal_bytes=%lld\n",
                g, r, static_cast<long long>(q.step), static_cast<long long>(q.id), join(q.groups).c_str(),
                commit ? 1 : 0, q.healed ? 1 : 0, q.heal_seconds * 1000, static_cast<long long>(q.heal_bytes));
    if (!commit) std::printf("DROPPED group=%d rank=%d: %s\n", g, r, q.dropped.c_str());
    std::fflush(stdout);
  }
  if (trace_to) trace::stop();
  auto full = model->full_state(0);
  if (r == 0) {
    for (auto& [name, t] : full) {
      std::printf("PARAM %s", name.c_str());
      auto f = t.to(torch::kFloat64).reshape({-1});
      for (int64_t i = 0; i < f.numel(); ++i) std::printf(" %.9g", f[i].item<double>());
      std::printf("\n");
    }
    std::printf("DONE group=%d steps=%lld sent=%lld coordinator_restarts=%lld\n", g,
                static_cast<long long>(replicas.step()), static_cast<long long>(replicas.bytes_sent()),
                static_cast<long long>(replicas.coordinator_restarts()));
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
