// fsdp-cpp: the CUDA plugin, libfsdp_cuda.so (see src/comm/cuda_api.h).
//
// Built only with FSDP_CUDA (the default where libtorch has CUDA). It links
// libtorch_cuda and c10_cuda from the torch install the build found, by
// their full paths, and nothing of the CUDA toolkit: their own run paths
// then load the CUDA runtime and NCCL that libtorch_cuda was built with.
// Loaded by src/comm/device.cpp when a job asks for a CUDA device or NCCL.
#include <dlfcn.h>

#include <algorithm>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/version.h>

#include "comm/cuda_api.h"

namespace {

// The file a symbol of an already loaded library comes from ("" if none).
std::string file_of(const char* soname, const char* symbol) {
  void* h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  if (!h) return "";
  void* f = dlsym(h, symbol);
  Dl_info info{};
  std::string out = f && dladdr(f, &info) && info.dli_fname ? info.dli_fname : "";
  dlclose(h);
  return out;
}

int device_count() { return static_cast<int>(c10::cuda::device_count()); }

// NCCL is libtorch_cuda's dependency, not ours: asked through the library
// already loaded (linking it here could bind a second copy).
std::string nccl_version(std::string* path) {
  if (path) *path = file_of("libnccl.so.2", "ncclGetVersion");
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (!h) return "not loaded";
  auto get = reinterpret_cast<ncclResult_t (*)(int*)>(dlsym(h, "ncclGetVersion"));
  int v = 0;
  const bool ok = get && get(&v) == ncclSuccess;
  dlclose(h);
  if (!ok) return "unknown";
  // NCCL >= 2.9: major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string cudart_path() { return file_of("libcudart.so.13", "cudaGetDeviceCount"); }

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            int device_index, std::chrono::milliseconds timeout,
                                            const std::vector<uint64_t>& global_ranks, const std::string& name) {
  // High-priority NCCL streams, as FSDP2's: a collective's kernels are
  // scheduled ahead of compute kernels queued at the same time, so the
  // transfer that the next unit waits for is not starved by this one's math.
  auto o = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/true);
  o->timeout = timeout;
  o->group_name = name;
  o->global_ranks_in_group = global_ranks;
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
  // Bound to its device: NCCL's communicator is made now, not at the first
  // collective, so a rank that cannot reach the others fails here.
  pg->setBoundDeviceId(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_index)));
  pg->eagerConnectSingleDevice(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_index)));
  // Start and end events around each collective on NCCL's stream: the
  // communicator's counters read the time on the GPU (getDuration) once a
  // collective completed, not the host's time in a wait() that only orders
  // streams.
  pg->enableCollectivesTiming();
  return pg;
}

// The caching allocator learns its devices when CUDA is first used; asked
// before the first CUDA tensor (a limit set first thing), it needs that done.
void init_allocator() { at::globalContext().lazyInitDevice(c10::DeviceType::CUDA); }

void memory(int device_index, int64_t* allocated, int64_t* reserved, int64_t* peak_allocated) {
  init_allocator();
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_index));
  const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  *allocated = s.allocated_bytes[all].current;
  *reserved = s.reserved_bytes[all].current;
  *peak_allocated = s.allocated_bytes[all].peak;
}

void reset_peak(int device_index) {
  init_allocator();
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_index));
}

void set_memory_limit(int device_index, int64_t bytes) {
  const auto d = static_cast<c10::DeviceIndex>(device_index);
  init_allocator();
  const double total = static_cast<double>(at::cuda::getDeviceProperties(d)->totalGlobalMem);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(bytes > 0 ? std::min(1.0, double(bytes) / total) : 1.0, d);
}

const fsdp::comm::CudaApi kApi = {
    fsdp::comm::kCudaApiVersion, TORCH_VERSION, device_count, nccl_version, cudart_path, make_nccl, memory,
    reset_peak, set_memory_limit};

}  // namespace

extern "C" __attribute__((visibility("default"))) const fsdp::comm::CudaApi* fsdp_cuda_api() { return &kApi; }
