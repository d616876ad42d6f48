// fsdp-cpp tests: rank-side logic of tests/test_state_dict.cpp — checkpoints
// of a wrapped model: exact resume, resharding, untouched on error.
//
// core_resume PHASE STEPS CKPT_DIR OUT [STRATEGY [SHARD_GROUP]]
//   straight:    train STEPS steps, save_full(OUT)
//   first:       train STEPS/2 steps, save_checkpoint(CKPT_DIR)
//   first_async: the same save in the background (throttled), while two
//                more steps change every shard; prints OVERLAPPED (the
//                steps ended before the write did) and COMMITTED. The
//                save's thread copies the snapshot (the default);
//   first_async_caller: the same, copied by the call
//                (CheckpointOptions::snapshot_on_thread = false)
//   second:      load_checkpoint(CKPT_DIR), train to STEPS, save_full(OUT)
//   full_first:  train STEPS/2 steps, save_full + save_full_optim into CKPT_DIR
//   full_second: load_full + load_full_optim from CKPT_DIR, train to STEPS,
//                save_full(OUT)
// The global batch of step s is seeded by s and split over ranks, so any
// world size trains the same model (up to summation order).
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <thread>

#include "../core_model.h"
#include "fsdp/fsdp.h"
#include "scenario.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

void train_step(Sharded<Net>& model, torch::optim::Optimizer& opt, int step, int N, int r) {
  torch::manual_seed(500 + step);
  const int B = 12;  // divisible by 1, 2, 3, 4
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

// The model of the scenarios below: Net seeded with 7, one unit per Block,
// FULL_SHARD over `comm`.
Sharded<Net> wrap_blocks(const CommPtr& comm) {
  torch::manual_seed(7);
  Net net;
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  return fully_shard(net, comm, o);
}

FSDP_SCENARIO(core_resume) {
  const std::string phase = args.at(0);
  const int steps = std::stoi(args.at(1));
  const std::string dir = args.at(2), out = args.at(3);
  const std::string strategy = args.size() > 4 ? args[4] : "full";
  auto comm = make_communicator_from_env();
  const int N = comm->world_size(), r = comm->rank();
  torch::manual_seed(7);
  Net net;
  FsdpOptions o;
  o.strategy = parse_strategy(strategy);
  if (args.size() > 5) o.shard_group_size = std::stoi(args[5]);
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, comm, o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  int start = 0, end = steps;
  if (phase == "first" || phase == "first_async" || phase == "first_async_caller" || phase == "full_first")
    end = steps / 2;
  if (phase == "full_second") {
    load_full(*model, dir + "/model.safetensors");
    load_full_optim(*model, opt, dir + "/optim.safetensors");
    start = steps / 2;
  }
  if (phase == "second") {
    auto res = load_checkpoint(*model, &opt, dir);
    FSDP_USER_CHECK(res.found, "no checkpoint in ", dir);
    start = res.train_state.at("step").get<int>();
    std::printf("RESUMED step=%d from world %d\n", start, res.saved_world_size);
  }
  for (int s = start; s < end; ++s) train_step(model, opt, s, N, r);
  if (phase == "first") {
    save_checkpoint(*model, &opt, dir, end, {{"step", end}});
  } else if (phase == "first_async" || phase == "first_async_caller") {
    CheckpointOptions co;
    co.async = true;
    co.snapshot_on_thread = phase == "first_async";
    co.max_write_bytes_per_second = 2000;  // this model's shards: about a second
    auto res = save_checkpoint(*model, &opt, dir, end, {{"step", end}}, co);
    const auto returned = std::chrono::steady_clock::now();
    FSDP_USER_CHECK(res.in_background && res.snapshot_bytes > 0, "expected a background save with a snapshot");
    // Every shard and every optimizer state changes while the copy is written.
    for (int s = end; s < end + 2; ++s) train_step(model, opt, s, N, r);
    const double trained = std::chrono::duration<double>(std::chrono::steady_clock::now() - returned).count();
    auto w = wait_for_checkpoint(*model);
    FSDP_USER_CHECK(w && w->bytes_written > 0, "expected the background save's result");
    const bool overlapped = trained < w->seconds;  // the steps ended while the write went on
    std::printf("OVERLAPPED %d\nCOMMITTED %s bytes=%lld C=%lld snapshot_wait=%.6f\n", int(overlapped),
                w->path.c_str(), (long long)w->bytes_written, (long long)model->ledger(&opt).C,
                w->snapshot_wait_seconds);
  } else if (phase == "full_first") {
    if (r == 0) std::filesystem::create_directories(dir);
    save_full(*model, dir + "/model.safetensors");
    save_full_optim(*model, opt, dir + "/optim.safetensors");
  } else
    save_full(*model, out);
  std::printf("DONE phase=%s N=%d\n", phase.c_str(), N);
  return 0;
}

// core_async_order DIR: background saves one at a time, and their errors.
// Prints WAITED when a save that follows a background one finds it
// committed; ERROR <message> for a background save that could not write;
// NONE when there is nothing to wait for. The model is then destroyed with a
// failed save nobody waited for (its destructor prints it).
FSDP_SCENARIO(core_async_order) {
  const std::string dir = args.at(0);
  auto comm = make_communicator_from_env();
  const int N = comm->world_size(), r = comm->rank();
  auto model = wrap_blocks(comm);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  prepare_background_saves(*model);
  train_step(model, opt, 0, N, r);
  CheckpointOptions slow;
  slow.async = true;
  slow.max_write_bytes_per_second = 2000;
  save_checkpoint(*model, &opt, dir + "/ck", 1, {{"step", 1}}, slow);
  save_checkpoint(*model, &opt, dir + "/ck", 2, {{"step", 2}});  // synchronous: waits for step 1 first
  namespace fs = std::filesystem;
  if (fs::exists(dir + "/ck/step-000001/metadata.json") && ckpt::resolve_checkpoint(dir + "/ck") == dir + "/ck/step-000002")
    std::printf("WAITED\n");
  if (!wait_for_checkpoint(*model)) std::printf("NONE\n");
  // A root below a regular file: the background save fails (rank 0 cannot
  // make the folder), on every rank, after the call returned.
  if (r == 0) std::fclose(std::fopen((dir + "/not-a-dir").c_str(), "w"));
  comm->barrier()->wait();
  CheckpointOptions bg;
  bg.async = true;
  auto res = save_checkpoint(*model, &opt, dir + "/not-a-dir/ck", 3, {{"step", 3}}, bg);
  std::printf("RETURNED in_background=%d\n", int(res.in_background));
  try {
    wait_for_checkpoint(*model);
    std::printf("NO ERROR (unexpected)\n");
  } catch (const fsdp::Error& e) {
    std::printf("ERROR %s\n", e.what());
  }
  save_checkpoint(*model, &opt, dir + "/not-a-dir/ck", 4, {{"step", 4}}, bg);  // fails too; nobody waits
  std::fflush(stdout);
  return 0;
}

// core_async_kill DIR: a rank killed while its background write is under
// way. Saves step 1 (committed), then step 2 in the background, slowly;
// rank 1 kills itself once its shard file of step 2 has begun.
FSDP_SCENARIO(core_async_kill) {
  const std::string dir = args.at(0);
  auto comm = make_communicator_from_env();
  const int N = comm->world_size(), r = comm->rank();
  auto model = wrap_blocks(comm);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  train_step(model, opt, 0, N, r);
  save_checkpoint(*model, &opt, dir, 1, {{"step", 1}});
  train_step(model, opt, 1, N, r);
  CheckpointOptions slow;
  slow.async = true;
  slow.max_write_bytes_per_second = 500;
  save_checkpoint(*model, &opt, dir, 2, {{"step", 2}}, slow);
  char name[96];
  std::snprintf(name, sizeof name, "/.tmp-step-000002/rank-%05d-of-%05d.safetensors.tmp", r, N);
  const std::string partial = dir + name;
  for (int i = 0; i < 2000; ++i) {
    std::error_code ec;
    if (r == 1 && std::filesystem::file_size(partial, ec) > 0 && !ec) {
      std::printf("KILLING rank 1 while %s is partial\n", partial.c_str());
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  wait_for_checkpoint(*model);  // rank 0: fails once rank 1 is gone (or is killed by the launcher first)
  std::printf("NOT KILLED (unexpected)\n");
  return 1;
}

// core_async_changed DIR: the snapshot copied on the save's thread, and
// parameters changed in place before it was waited for.
//   1. step 1 saved synchronously; step 2 in the background (throttled),
//      then every parameter changed at once (not through backward and the
//      optimizer): prints ERROR <message> from wait_for_checkpoint.
//   2. step 3 in the background, wait_for_snapshot, then the same change:
//      prints SAVED <path>; loading it back gives the values at the save
//      (prints SNAPSHOT exact when bitwise equal).
FSDP_SCENARIO(core_async_changed) {
  const std::string dir = args.at(0);
  auto comm = make_communicator_from_env();
  const int N = comm->world_size(), r = comm->rank();
  auto model = wrap_blocks(comm);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  prepare_background_saves(*model, &opt);
  auto change_all = [&] {
    torch::NoGradGuard ng;
    for (auto& p : model->parameters()) p.add_(1.0f);
  };
  train_step(model, opt, 0, N, r);
  save_checkpoint(*model, &opt, dir, 1, {{"step", 1}});
  CheckpointOptions slow;
  slow.async = true;
  slow.max_write_bytes_per_second = 4000;  // the write outlasts the change below
  save_checkpoint(*model, &opt, dir, 2, {{"step", 2}}, slow);
  change_all();
  try {
    wait_for_checkpoint(*model);
    std::printf("NO ERROR (unexpected)\n");
  } catch (const fsdp::Error& e) {
    std::printf("ERROR %s\n", e.what());
  }
  std::vector<torch::Tensor> at_save;
  for (auto& p : model->parameters()) at_save.push_back(p.detach().clone());
  save_checkpoint(*model, &opt, dir, 3, {{"step", 3}}, slow);
  wait_for_snapshot(*model);
  change_all();
  auto w = wait_for_checkpoint(*model);
  std::printf("SAVED %s\n", w ? w->path.c_str() : "(nothing)");
  load_checkpoint(*model, &opt, dir + "/step-000003");
  bool exact = true;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) exact = exact && torch::equal(params[i].detach(), at_save[i]);
  std::printf("SNAPSHOT %s\n", exact ? "exact" : "differs");
  std::fflush(stdout);
  return 0;
}

// core_full_memory DIR: what gathering the full state costs each rank. Prints
// per rank "MEM op=<op> rank=<r> extra=<peak above the resting bytes>
// block=<largest unit unsharded bytes> shard=<largest shard bytes>".
FSDP_SCENARIO(core_full_memory) {
  memory::install();
  auto comm = make_communicator_from_env();
  const int r = comm->rank();
  torch::manual_seed(7);
  Net net(7, 48, 5, 3);
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, comm, o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  train_step(model, opt, 0, comm->world_size(), r);
  int64_t block = 0, shard = 0;
  for (auto& u : model->units()) {
    block = std::max(block, u.unsharded_bytes);
    shard = std::max(shard, u.shard_bytes);
  }
  auto measure = [&](const char* op, const std::function<void()>& fn) {
    comm->barrier()->wait();
    const int64_t before = memory::stats().current;
    memory::reset_peak();
    fn();
    std::printf("MEM op=%s rank=%d extra=%lld block=%lld shard=%lld\n", op, r,
                static_cast<long long>(memory::stats().peak - before), static_cast<long long>(block),
                static_cast<long long>(shard));
  };
  const std::string dir = args.at(0);
  measure("save_full", [&] { save_full(*model, dir + "/m.safetensors"); });
  measure("save_full_optim", [&] { save_full_optim(*model, opt, dir + "/o.safetensors"); });
  int64_t full_bytes = 0;
  measure("full_state", [&] {
    auto st = model->full_state(0);
    for (auto& [k, t] : st) full_bytes += t.numel() * t.element_size();
  });
  std::printf("FULL rank=%d bytes=%lld\n", r, static_cast<long long>(full_bytes));
  return 0;
}

// core_load_bad PATH: a load that must fail leaves the model untouched:
// prints UNTOUCHED when the parameters after the failed load equal before.
FSDP_SCENARIO(core_load_bad) {
  auto comm = make_communicator_from_env();
  auto model = wrap_blocks(comm);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  std::vector<torch::Tensor> before;
  for (auto& p : model->parameters()) before.push_back(p.detach().clone());
  try {
    load_checkpoint(*model, &opt, args.at(0));
    std::printf("LOADED (unexpected)\n");
    return 1;
  } catch (const fsdp::Error& e) {
    std::printf("ERROR %s\n", e.what());
  }
  auto now = model->parameters();
  for (size_t i = 0; i < now.size(); ++i)
    if (!torch::equal(now[i], before[i])) {
      std::printf("TOUCHED\n");
      return 1;
    }
  std::printf("UNTOUCHED opt_state=%zu\n", opt.state().size());
  return 0;
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
