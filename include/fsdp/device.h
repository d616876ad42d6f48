// fsdp-cpp: the devices a job runs on (CPU, or CUDA through fsdp-cpp's
// CUDA plugin) and their memory.
// defines: parse_device, cuda_device_count, cuda_unavailable_reason,
//          require_device, DeviceMemory, device_memory, reset_device_peak,
//          set_device_memory_limit, cuda_libraries
//
// Programs link libtorch's CPU libraries only. CUDA support (libtorch_cuda,
// the CUDA runtime and NCCL, as the torch install provides them) is loaded
// into the process the first time a job names a CUDA device or NCCL:
// parse_device, FsdpOptions::device, CommOptions::backend, or a call below.
// Loading it is the only thing this changes in the process, and only on that
// request (docs/DESIGN.md, "Process-wide state").
//
// Name the device first. libtorch decides once per process whether it has
// CUDA, the first time anything asks: torch::cuda::device_count(),
// torch::manual_seed(), the first backward pass (which also fixes autograd's
// device threads), at::getAccelerator(). Asked before fsdp-cpp loaded CUDA
// support, libtorch keeps its CPU stub for good; loading then fails with one
// error saying so. So a program that may run on a GPU calls parse_device (or
// require_device) before any of those, right after reading its command line.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace fsdp {

// "cpu", "cuda" (this rank's GPU: cuda:LOCAL_RANK) or "cuda:K" as a device.
// A CUDA device loads CUDA support now and is checked (require_device, `what`
// names the setting in the message, e.g. "--device"); anything else is a
// fsdp::UsageError saying what was expected.
c10::Device parse_device(const std::string& text, const std::string& what = "--device");

// CUDA devices this process sees; loads CUDA support the first time. 0 when
// the build has no CUDA plugin, the plugin cannot be loaded, the driver is
// missing or no GPU is visible (cuda_unavailable_reason says which).
int cuda_device_count();
// Why cuda_device_count() is 0, in one sentence; "" when it is not.
std::string cuda_unavailable_reason();

// Throws fsdp::Error unless `device` can hold this job's tensors: the CPU,
// or cuda:K with K < cuda_device_count(). `what` names the setting in the
// message (e.g. "FsdpOptions::device").
void require_device(const c10::Device& device, const std::string& what);

// The device's memory as its allocator counts it. CPU: fsdp's counting
// allocator (fsdp/memory.h; zero without fsdp::init). CUDA: the caching
// allocator's bytes in use by tensors, reserved from the driver, and the
// peak in use since reset_device_peak.
struct DeviceMemory {
  int64_t allocated = 0;       // held by tensors now
  int64_t reserved = 0;        // held by the allocator (allocated + cached)
  int64_t peak_allocated = 0;  // most held by tensors since the last reset
};
// This device's DeviceMemory now (see above for what each count means).
DeviceMemory device_memory(const c10::Device& device);
// Starts a new peak for device_memory(device).peak_allocated.
void reset_device_peak(const c10::Device& device);

// Caps what the device's allocator may hold for this process at `bytes`
// (0: no cap). CPU: memory::set_limit (needs fsdp::init). CUDA: the caching
// allocator's memory fraction of the device; an allocation past it raises
// libtorch's out-of-memory error.
void set_device_memory_limit(const c10::Device& device, int64_t bytes);

// Which CUDA runtime and NCCL the process loaded (files and versions), in
// one line, e.g. "NCCL 2.30.7 (.../nvidia/nccl/lib/libnccl.so.2), CUDA
// runtime .../libcudart.so.13, ...", ending with what a timed-out NCCL
// collective does (TORCH_NCCL_ASYNC_ERROR_HANDLING); the reason when CUDA
// support is unavailable.
std::string cuda_libraries();

}  // namespace fsdp
