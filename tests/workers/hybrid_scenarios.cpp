// fsdp-cpp tests: rank-side logic of tests/test_hybrid.cpp.
//
// hybrid_traffic STRATEGY [SHARD_GROUP]: the core test model (tests/core_model.h)
// trains one warm-up step, then this rank prints the traffic of the next
// step by kind and tier (the world's counters, which include its groups'),
// and the sizes the formulas need:
//   TRAFFIC rank=R N=.. S=.. R=.. padded=.. ag=.. ag_inter=.. rs=.. rs_inter=.. ar=.. ar_inter=..
//     inter_logical=..
// inter_logical: what the inter-host bytes would have been uncompressed
// (FSDP_COMPRESS; equal to their sum otherwise).
// padded: the units' padded elements over the shard group (S ranks; N for
// the other strategies). FSDP_TEST_HOSTS=H makes this one launcher look like
// H hosts (rank r on host r / (N/H), by FSDP_HOST_ID); under two launchers
// with FSDP_HOST_ID each launcher is one host. FSDP_TEST_TRACE=DIR records
// a trace of the two steps there (for the report's tiers).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../core_model.h"
#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/trace.h"
#include "scenario.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

FSDP_SCENARIO(hybrid_traffic) {
  const std::string strategy = args.at(0);
  const int shard_group = args.size() > 1 ? std::stoi(args[1]) : 0;
  if (const char* h = std::getenv("FSDP_TEST_HOSTS")) {
    const int hosts = std::atoi(h), n = std::atoi(std::getenv("WORLD_SIZE")), r = std::atoi(std::getenv("RANK"));
    FSDP_USER_CHECK(hosts >= 1 && n % hosts == 0, "FSDP_TEST_HOSTS=", h, " must divide WORLD_SIZE=", n);
    setenv("FSDP_HOST_ID", ("test-host-" + std::to_string(r / (n / hosts))).c_str(), 1);
  }
  auto comm = make_communicator_from_env();
  const char* trace_dir = std::getenv("FSDP_TEST_TRACE");
  if (trace_dir) trace::start(trace_dir, comm->rank(), comm->world_size());
  torch::manual_seed(1);
  Net net(7, 12, 5, 3);
  FsdpOptions o;
  o.strategy = parse_strategy(strategy);
  o.shard_group_size = shard_group;
  o.wrap = WrapPolicy::predicate(
      [](const std::string&, const torch::nn::Module& m, int64_t) {
        return dynamic_cast<const BlockImpl*>(&m) || dynamic_cast<const GateImpl*>(&m);
      },
      "Block and Gate");
  auto model = fully_shard(net, comm, o);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto x = torch::randn({4, 7});
  CommCounters t;
  for (int step = 0; step < 2; ++step) {
    trace::Span span("step", "step", {{"step", step}});
    comm->reset_counters();
    auto loss = model.forward(x).pow(2).mean();
    loss.backward();
    model->wait_pending();
    t = comm->counters();  // step 1's: the steady state
    opt.step();
    opt.zero_grad();
  }
  int64_t padded = 0;
  for (auto& u : model->units()) padded += u.padded_numel;
  const auto& ag = t[CollectiveKind::ALL_GATHER];
  const auto& rs = t[CollectiveKind::REDUCE_SCATTER];
  const auto& ar = t[CollectiveKind::ALL_REDUCE];
  const int S = model->shard_group()->world_size();
  const int R = model->replica_group() ? model->replica_group()->world_size() : 1;
  std::printf("TRAFFIC rank=%d N=%d S=%d R=%d padded=%lld ag=%lld ag_inter=%lld rs=%lld rs_inter=%lld ar=%lld "
              "ar_inter=%lld inter_logical=%lld\n",
              comm->rank(), comm->world_size(), S, R, (long long)padded, (long long)ag.bytes_sent,
              (long long)ag.bytes_inter_host, (long long)rs.bytes_sent, (long long)rs.bytes_inter_host,
              (long long)ar.bytes_sent, (long long)ar.bytes_inter_host, (long long)t.total_bytes_inter_host_logical());
  std::fflush(stdout);
  if (trace_dir) {
    trace::stop();
    comm->barrier()->wait();
  }
  return 0;
}

}  // namespace FSDP_TEST_ID
}  // namespace fsdp::testing
