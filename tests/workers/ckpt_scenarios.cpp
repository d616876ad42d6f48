// fsdp-cpp tests: checkpoint scenarios run by every rank process.
//
//   ckpt_save ROOT STEP            save the test model (FSDP layout at this world size)
//   ckpt_load ROOT STEP            load it at this world size, compare; prints "ckpt_load ok rank R"
//   ckpt_save_loop ROOT START      save steps START, START+1, ... forever (the test SIGKILLs it)
//
// Values are computable from (name, index, step), so any rank count can check
// any checkpoint.
#include <cstdio>
#include <string>

#include "test_checkpoint_util.h"
#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "scenario.h"

namespace FSDP_TEST_ID {
using namespace fsdp;

int check(const std::vector<ckpt::Slice>& got, const std::vector<testing::Param>& want, int rank) {
  for (size_t i = 0; i < got.size(); ++i) {
    auto w = want[i].full.reshape(-1).slice(0, got[i].lo, got[i].hi);
    if (!torch::equal(got[i].data, w)) {
      std::printf("rank %d: MISMATCH %s\n", rank, got[i].name.c_str());
      return 1;
    }
  }
  return 0;
}

FSDP_SCENARIO(ckpt_save) {
  auto comm = make_communicator_from_env();
  int64_t step = std::stoll(args.at(1));
  auto m = testing::model_at_step(step, false);
  ckpt::SaveOptions o;
  o.strategy = "FULL_SHARD";
  o.keep_last = 2;
  auto ms = testing::fsdp_slices(m, comm->rank(), comm->world_size());
  auto os = testing::fsdp_slices(m, comm->rank(), comm->world_size(), false, "/exp_avg");
  auto r = ckpt::save_sharded(*comm, args.at(0), step, ms, os, {{"step", step}}, o);
  std::printf("ckpt_save ok rank %d %s %lld bytes\n", comm->rank(), r.path.c_str(),
              static_cast<long long>(r.bytes_written));
  return 0;
}

FSDP_SCENARIO(ckpt_load) {
  auto comm = make_communicator_from_env();
  int64_t step = std::stoll(args.at(1));
  auto m = testing::model_at_step(step, false);
  auto ms = testing::fsdp_slices(m, comm->rank(), comm->world_size(), true);
  auto os = testing::fsdp_slices(m, comm->rank(), comm->world_size(), true, "/exp_avg");
  auto r = ckpt::load_sharded(*comm, args.at(0), ms, os);
  if (!r.found || r.step != step) {
    std::printf("rank %d: found=%d step=%lld, expected step %lld\n", comm->rank(), r.found,
                static_cast<long long>(r.step), static_cast<long long>(step));
    return 1;
  }
  if (check(ms, m, comm->rank()) || check(os, m, comm->rank())) return 1;
  std::printf("ckpt_load ok rank %d (saved at world size %d)\n", comm->rank(), r.saved_world_size);
  return 0;
}

FSDP_SCENARIO(ckpt_save_loop) {
  auto comm = make_communicator_from_env();
  ckpt::SaveOptions o;
  o.keep_last = 2;
  for (int64_t step = std::stoll(args.at(1));; ++step) {
    auto m = testing::model_at_step(step, true);
    auto ms = testing::fsdp_slices(m, comm->rank(), comm->world_size());
    ckpt::save_sharded(*comm, args.at(0), step, ms, {}, {{"step", step}}, o);
    std::printf("saved %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
  }
}

}  // namespace FSDP_TEST_ID
