// fsdp-cpp tests: rank-side logic of tests/test_checkpoint_residuals.cpp —
// error feedback's residuals in checkpoints, so a compressed run resumes
// bit for bit.
//
// core_residuals PHASE STEPS CKPT_DIR OUT [STRATEGY]
//   straight:    train STEPS steps, save_full(OUT.model.safetensors) and
//                save_full_optim(OUT.optim.safetensors)
//   first:       train STEPS/2 steps, save_checkpoint(CKPT_DIR); prints
//                RESIDUALS rank=R count=K (the residuals this rank saved)
//   first_async: the same save in the background (wait_for_checkpoint
//                after two more steps that change every residual)
//   second:      load_checkpoint(CKPT_DIR), train to STEPS, save both full
//                files as straight does; prints NOTE <LoadResult::note>
//   second_zero: the same, but the residuals are then replaced by none
//                (Communicator::load_residuals({})): what a load that drops
//                them leaves
// The model, batches and optimizer are those of core_resume
// (state_scenarios.cpp); compression, hosts and sharing come from the
// environment (FSDP_COMPRESS, FSDP_TEST_HOST_LAYOUT, FSDP_SHARE_HOST).
// STRATEGY: full (the default) or hybrid (shard groups of N/2 ranks, one host; the
// replica group's all-reduce is what compresses, on its own communicator).
// RESIDUALS counts those of the world's and, under hybrid, the replica
// group's communicator; second_zero empties both.
#include <cstdio>

#include "../core_model.h"
#include "fsdp/fsdp.h"
#include "scenario.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

// One AdamW step on the global batch of step s (seeded by s, split over the
// ranks), with clip_grad_norm: core_resume's.
void train_step(Sharded<Net>& model, torch::optim::Optimizer& opt, int step, int N, int r) {
  torch::manual_seed(500 + step);
  const int B = 12;
  auto X = torch::randn({B, 7});
  auto Y = torch::randn({B, 5});
  const int b = B / N;
  auto x = X.narrow(0, r * b, b), y = Y.narrow(0, r * b, b);
  opt.zero_grad();
  auto loss = (model.forward(x) - y).pow(2).mean();
  loss.backward();
  model->clip_grad_norm(1.0);
  opt.step();
}

FSDP_SCENARIO(core_residuals) {
  const std::string phase = args.at(0);
  const int steps = std::stoi(args.at(1));
  const std::string dir = args.at(2), out = args.at(3);
  const std::string strategy = args.size() > 4 ? args[4] : "full";
  auto comm = make_communicator_from_env();
  const int N = comm->world_size(), r = comm->rank();
  torch::manual_seed(7);
  Net net;
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  o.strategy = parse_strategy(strategy);
  if (strategy == "hybrid") o.shard_group_size = N / 2;  // one host of FSDP_TEST_HOST_LAYOUT=a,a,b,b
  auto model = fully_shard(net, comm, o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  const bool first = phase == "first" || phase == "first_async";
  int start = 0;
  const int end = first ? steps / 2 : steps;
  if (phase == "second" || phase == "second_zero") {
    auto res = load_checkpoint(*model, &opt, dir);
    FSDP_USER_CHECK(res.found, "no checkpoint in ", dir);
    start = res.train_state.at("step").get<int>();
    if (phase == "second_zero") {
      comm->load_residuals({});
      if (model->replica_group()) model->replica_group()->load_residuals({});
    }
    std::printf("NOTE rank=%d %s\n", r, res.note.c_str());
  }
  for (int s = start; s < end; ++s) train_step(model, opt, s, N, r);
  if (first) {
    const Residuals world = comm->residuals();
    const Residuals replica = model->replica_group() ? model->replica_group()->residuals() : Residuals{};
    std::printf("RESIDUALS rank=%d count=%zu compress=%s replica_count=%zu replica_compress=%s\n", r,
                world.by_buffer.size(), to_string(world.compress), replica.by_buffer.size(),
                to_string(replica.compress));
    CheckpointOptions co;
    co.async = phase == "first_async";
    auto res = save_checkpoint(*model, &opt, dir, end, {{"step", end}}, co);
    if (co.async) {
      FSDP_USER_CHECK(res.in_background, "expected a background save");
      // Every residual changes before the write: the snapshot must hold them as they were.
      for (int s = end; s < end + 2; ++s) train_step(model, opt, s, N, r);
      FSDP_USER_CHECK(wait_for_checkpoint(*model), "expected the background save's result");
    }
  } else {
    save_full(*model, out + ".model.safetensors");
    save_full_optim(*model, opt, out + ".optim.safetensors");
  }
  std::printf("DONE phase=%s N=%d\n", phase.c_str(), N);
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID
}  // namespace fsdp::testing
