// fsdp-cpp tests: rank-side logic of the CUDA plugin's load order
// (tests/test_device.cpp, Device.*LoadsCuda*).
//
// cuda_hooks ENTRY [FIRST]: in a fresh process, optionally run FIRST (what a
// program may do before naming its device: seed, backward, nothing), then
// the library entry point ENTRY that names a CUDA device, catching its
// error (a machine without a GPU fails there, after loading CUDA support);
// then print
//   CUDAHOOKS entry=.. first=.. hooks_built=0|1 error=<the entry's message, or none>
// hooks_built is ATen's answer to "are the real CUDA hooks the ones in use",
// read after the entry point: 1 means libtorch_cuda's hooks were registered
// before anything fixed ATen's choice.
//   ENTRY: parse_device | require_device | fully_shard | nccl_communicator |
//          memory_limit | device_memory
//   FIRST: none | seed (torch::manual_seed) | backward (a CPU backward) |
//          device_count (torch::cuda::device_count)
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstdio>

#include "fsdp/comm.h"
#include "fsdp/device.h"
#include "fsdp/fully_shard.h"
#include "scenario.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

FSDP_SCENARIO(cuda_hooks) {
  const std::string entry = args.at(0), first = args.size() > 1 ? args[1] : "none";
  if (first == "seed") {
    torch::manual_seed(7);
  } else if (first == "backward") {
    auto x = torch::ones({2}, torch::requires_grad());
    (x * x).sum().backward();
  } else if (first == "device_count") {
    (void)torch::cuda::device_count();
  } else if (first != "none") {
    throw Error("cuda_hooks: FIRST is none, seed, backward or device_count; found " + first);
  }
  const c10::Device gpu(c10::kCUDA, 0);
  std::string error = "none";
  try {
    if (entry == "parse_device") {
      parse_device("cuda");
    } else if (entry == "require_device") {
      require_device(gpu, "the test's device");
    } else if (entry == "fully_shard") {
      FsdpOptions o;
      o.device = gpu;
      fully_shard(torch::nn::Linear(4, 3).ptr(), make_local_communicator(), o);
    } else if (entry == "nccl_communicator") {
      CommOptions o;
      o.backend = CommBackend::NCCL;
      make_communicator_from_env(o);
    } else if (entry == "memory_limit") {
      set_device_memory_limit(gpu, int64_t(1) << 30);
    } else if (entry == "device_memory") {
      device_memory(gpu);
    } else {
      throw Error("cuda_hooks: unknown ENTRY " + entry);
    }
  } catch (const Error& e) {
    error = e.what();
  }
  std::printf("CUDAHOOKS entry=%s first=%s hooks_built=%d error=%s\n", entry.c_str(), first.c_str(),
              int(at::detail::getCUDAHooks().isBuilt()), error.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID
}  // namespace fsdp::testing
