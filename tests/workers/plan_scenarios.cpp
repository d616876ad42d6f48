// fsdp-cpp tests: rank-side measurement for the planner accuracy test
// (tests/test_plan_accuracy.cpp).
//
//   fsdp run -n N -- fsdp_test_worker plan_measure CONFIG [CONFIG...]
//
// CONFIG = "strategy,wrap,L,d,h,V,T,B,dtype,prefetch[,ac]", e.g.
// "full,block,2,64,4,256,32,4,fp32,0" (ac: none|block|every:K, activation
// checkpointing as gpt --ac; default none). For each config the scenario trains
// GPT-mini (examples/gpt/model.cpp) exactly as build/bin/gpt's step does:
// forward, cross-entropy, backward, clip_grad_norm, AdamW (two parameter
// groups) step, zero_grad. Step 0 is the warm-up (Adam's state appears, the
// forward order is recorded for prefetch); step 1 is measured: the counting
// allocator's peak (reset at the step's start, so it includes everything
// resident) and the communicator's byte counters. Every rank prints
//   MEASURE cfg=<i> rank=<r> rest=<bytes> peak=<bytes> ag=<bytes> rs=<bytes> ar=<bytes>
//           after_forward=<bytes> forward_peak=<bytes> a=<bytes> a_recompute=<bytes>
// rest = bytes allocated when the measured step starts (model state at rest);
// after_forward / forward_peak: allocated when the loss exists, and the peak
// until then (where the step's peak happens: forward, or backward); a and
// a_recompute: the ledger's measured A and A_recompute.
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "fsdp/memory.h"
#include "gpt/data.h"
#include "gpt/model.h"
#include "gpt/plan_gpt.h"
#include "scenario.h"

namespace FSDP_TEST_ID {

struct MeasureConfig {
  std::string strategy, wrap, dtype, ac = "none";
  gpt::Config cfg;
  int64_t batch = 4;
  bool prefetch = false;
};

MeasureConfig parse_config(const std::string& text) {
  std::vector<std::string> f;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) f.push_back(item);
  FSDP_USER_CHECK(f.size() == 10 || f.size() == 11, "plan_measure: expected strategy,wrap,L,d,h,V,T,B,dtype,prefetch[,ac], found '",
                  text, "'");
  MeasureConfig c;
  c.strategy = f[0];
  c.wrap = f[1];
  c.cfg.layers = std::stoll(f[2]);
  c.cfg.dim = std::stoll(f[3]);
  c.cfg.heads = std::stoll(f[4]);
  c.cfg.vocab = std::stoll(f[5]);
  c.cfg.seq = std::stoll(f[6]);
  c.batch = std::stoll(f[7]);
  c.dtype = f[8];
  c.prefetch = f[9] == "1";
  if (f.size() == 11) c.ac = f[10];
  c.cfg.validate();
  return c;
}

fsdp::WrapPolicy policy(const std::string& w) {
  if (w == "block") return fsdp::WrapPolicy::module_type<gpt::BlockImpl>("Block");
  if (w == "none") return fsdp::WrapPolicy::none();
  FSDP_USER_CHECK(w.rfind("size:", 0) == 0, "plan_measure: wrap block|none|size:N, found '", w, "'");
  return fsdp::WrapPolicy::size_based(std::stoll(w.substr(5)));
}

FSDP_SCENARIO(plan_measure) {
  FSDP_USER_CHECK(!args.empty(), "plan_measure CONFIG [CONFIG...]");
  auto comm = fsdp::make_communicator_from_env();  // installs the counting allocator
  const int rank = comm->rank(), N = comm->world_size();
  torch::set_num_threads(1);
  for (size_t i = 0; i < args.size(); ++i) {
    const MeasureConfig c = parse_config(args[i]);
    // Random byte tokens: enough for both steps' rows.
    gpt::data::Tokens tokens(size_t(4 * N * c.batch * (c.cfg.seq + 1) + 16));
    uint32_t x = 12345;
    for (auto& t : tokens) {
      x = x * 1664525u + 1013904223u;
      t = uint16_t((x >> 16) % uint32_t(c.cfg.vocab));
    }
    const gpt::data::Order order{c.cfg.seq, c.batch, 1, N};
    int64_t rest = 0, peak = 0, after_forward = 0, forward_peak = 0, A = 0, A_recompute = 0;
    fsdp::CommCounters counters;
    {
      torch::manual_seed(1);
      gpt::GPT net(c.cfg);
      fsdp::FsdpOptions o;
      o.strategy = fsdp::parse_strategy(c.strategy);
      o.wrap = policy(c.wrap);
      if (c.dtype == "bf16") o.mixed_precision.param_dtype = torch::kBFloat16;
      if (c.prefetch) {
        o.backward_prefetch = fsdp::BackwardPrefetch::BACKWARD_PRE;
        o.forward_prefetch = true;
      }
      if (const int every = gpt::recompute_every(c.ac))
        o.recompute = fsdp::RecomputePolicy::every_kth<gpt::BlockImpl>(every, "Block");
      auto model = fsdp::fully_shard(net.ptr(), comm, o);
      // build/bin/gpt's optimizer: AdamW, decay on 2-D weights only.
      std::vector<torch::Tensor> decay, no_decay;
      for (auto& s : model->named_shards()) (s.full_shape.size() == 2 ? decay : no_decay).push_back(s.tensor);
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                     torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1)));
      groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                        torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.0)));
      torch::optim::AdamW opt(std::move(groups));
      for (int64_t step = 0; step < 2; ++step) {
        auto b = gpt::data::batch(tokens, order, step, 0, rank);
        if (step == 1) {
          comm->reset_counters();
          fsdp::memory::reset_peak();
          rest = fsdp::memory::stats().current;
        }
        {
          auto logits = model.forward(b.x);  // [B,T,V], held through backward as the trainer does
          auto loss = gpt::loss(logits, b.y);
          if (step == 1) {
            auto st = fsdp::memory::stats();
            after_forward = st.current;
            forward_peak = st.peak;
          }
          loss.backward();
          (void)loss.item<double>();
        }
        model->clip_grad_norm(1.0);
        opt.step();
        opt.zero_grad();
        if (step == 1) {
          const fsdp::Ledger l = model->ledger(&opt);  // waits for pending reductions
          A = l.A;
          A_recompute = l.A_recompute;
          peak = fsdp::memory::stats().peak;
          counters = comm->counters();
        }
      }
    }
    std::printf("MEASURE cfg=%zu rank=%d rest=%lld peak=%lld ag=%lld rs=%lld ar=%lld after_forward=%lld forward_peak=%lld "
                "a=%lld a_recompute=%lld\n", i, rank, (long long)rest,
                (long long)peak, (long long)counters[fsdp::CollectiveKind::ALL_GATHER].bytes_sent,
                (long long)counters[fsdp::CollectiveKind::REDUCE_SCATTER].bytes_sent,
                (long long)counters[fsdp::CollectiveKind::ALL_REDUCE].bytes_sent, (long long)after_forward,
                (long long)forward_peak, (long long)A, (long long)A_recompute);
    std::fflush(stdout);
    comm->barrier()->wait();
  }
  return 0;
}

}  // namespace FSDP_TEST_ID
