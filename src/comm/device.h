// fsdp-cpp: the CUDA plugin, loaded on the first request (device.cpp).
// defines: cuda_api, require_cuda
#pragma once

#include <string>

#include "comm/cuda_api.h"

namespace fsdp::comm {

// The plugin's functions, loading it the first time; null when it is
// missing or cannot be loaded (fsdp::cuda_unavailable_reason says why).
const CudaApi* cuda_api();
// The same, or fsdp::Error saying that `what` needs CUDA and why it is
// unavailable.
const CudaApi& require_cuda(const std::string& what);

}  // namespace fsdp::comm
