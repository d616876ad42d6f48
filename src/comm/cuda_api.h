// fsdp-cpp: what the CUDA plugin (libfsdp_cuda.so, src/cuda/plugin.cpp)
// offers the rest of the library: the one boundary between the CPU-linked
// code and libtorch's CUDA libraries.
// defines: CudaApi, kCudaApiVersion, kCudaApiSymbol
//
// Why a plugin: libtorch_cuda maps the CUDA runtime, cuBLAS, cuDNN and NCCL
// into the process (a quarter second or more per rank start, most of a GiB
// of mappings), so CPU jobs do not link it. A job that asks for a CUDA
// device or NCCL loads the plugin (src/comm/device.cpp), and the plugin's
// own dependencies bring libtorch_cuda from the torch install it was built
// against: one CUDA runtime and one NCCL per process, the ones libtorch_cuda
// was built with, never a second copy from the system's CUDA toolkit.
//
// Only libtorch types cross this boundary (they live in libtorch's shared
// libraries, which the program and the plugin share); nothing of fsdp-cpp's
// own static libraries is linked into the plugin, so there is one flight
// recorder, one heartbeat, one of every fsdp-cpp table per process.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace fsdp::comm {

// Bumped whenever CudaApi changes; a plugin of another version is refused.
constexpr int kCudaApiVersion = 2;
// The plugin's one exported function: `const CudaApi* fsdp_cuda_api()`.
constexpr const char* kCudaApiSymbol = "fsdp_cuda_api";

struct CudaApi {
  int version;                  // kCudaApiVersion
  const char* torch_version;    // the libtorch the plugin was built against
  // CUDA devices this process sees (0 without a driver or a GPU).
  int (*device_count)();
  // "2.30.7": the NCCL libtorch_cuda loaded; with `path` (may be null)
  // the file it was loaded from.
  std::string (*nccl_version)(std::string* path);
  // The CUDA runtime's file (libcudart), as loaded.
  std::string (*cudart_path)();
  // A c10d::ProcessGroupNCCL over `store` (already prefixed for this
  // group): `rank` of `size`, bound to cuda:`device_index`, every
  // collective failing after `timeout`; `global_ranks` and `name` label
  // NCCL's own logs and flight records. Its streams are high-priority (as
  // FSDP2's), and it times its collectives on the GPU (Work::getDuration).
  c10::intrusive_ptr<c10d::Backend> (*make_nccl)(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                 int device_index, std::chrono::milliseconds timeout,
                                                 const std::vector<uint64_t>& global_ranks, const std::string& name);
  // The caching allocator's bytes on cuda:`device_index`: in use by tensors,
  // reserved from the driver, and the peak in use since the last reset.
  void (*memory)(int device_index, int64_t* allocated, int64_t* reserved, int64_t* peak_allocated);
  void (*reset_peak)(int device_index);
  // Caps the caching allocator of cuda:`device_index` at `bytes` of the
  // device's memory (setMemoryFraction); 0 lifts the cap.
  void (*set_memory_limit)(int device_index, int64_t bytes);
};

}  // namespace fsdp::comm
