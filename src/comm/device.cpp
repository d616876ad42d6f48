// fsdp-cpp: CUDA support on request, and the devices' memory (fsdp/device.h).
//
// The CUDA plugin (src/comm/cuda_api.h) is looked for, in order: the file
// FSDP_CUDA_PLUGIN names; <program's folder>/../lib and the program's folder
// (a build tree: bin/ and lib/); the folder it was installed to. It is
// loaded once per process, on the first request, with RTLD_LOCAL: its
// symbols stay its own, and libtorch_cuda registers its kernels with
// libtorch's dispatcher as it loads.
//
// What loading cannot undo: ATen reads its CUDA hooks from the registry once
// per process, the first time anything asks (torch::cuda::device_count,
// torch::manual_seed, the first backward, at::getAccelerator). Asked before
// libtorch_cuda registered them, ATen keeps its CPU stub for good and every
// CUDA tensor op fails later in ways that do not say why. So after dlopen the
// load checks that the real hooks are the ones ATen uses (isBuilt), and
// fails with one message naming what runs too early.
#include "comm/device.h"

#include <ATen/detail/CUDAHooksInterface.h>

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <mutex>

#include "common/env.h"
#include "fsdp/config.h"
#include "fsdp/device.h"
#include "fsdp/errors.h"
#include "fsdp/memory.h"

#ifndef FSDP_CUDA_PLUGIN_INSTALL_DIR
#define FSDP_CUDA_PLUGIN_INSTALL_DIR ""
#endif

namespace fsdp {
namespace comm {
namespace {

constexpr const char* kPluginFile = "libfsdp_cuda.so";

struct Loaded {
  const CudaApi* api = nullptr;
  std::string why;  // when api is null
  std::string path;
};

std::string program_dir() {
  const std::string p = ::fsdp::detail::env().read_link("/proc/self/exe");
  if (p.empty()) return "";
  return p.substr(0, p.find_last_of('/'));
}

Loaded load() {
  Loaded out;
  std::vector<std::string> candidates;
  const std::string named = config::read_env().cuda_plugin;
  if (!named.empty()) {
    candidates.push_back(named);
  } else {
    const std::string dir = program_dir();
    if (!dir.empty()) {
      candidates.push_back(dir + "/../lib/" + kPluginFile);
      candidates.push_back(dir + "/" + kPluginFile);
    }
    if (*FSDP_CUDA_PLUGIN_INSTALL_DIR) {
      // Appended, not operator+ on a temporary: GCC 12 warns wrongly of the
      // latter (-Warray-bounds in char_traits' memcpy).
      std::string installed = FSDP_CUDA_PLUGIN_INSTALL_DIR;
      installed.append("/").append(kPluginFile);
      candidates.push_back(std::move(installed));
    }
  }
  std::string tried;
  for (const std::string& c : candidates) {
    if (access(c.c_str(), F_OK) != 0) {
      tried += (tried.empty() ? "" : ", ") + c;
      continue;
    }
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      out.why = detail::cat("fsdp-cpp's CUDA plugin ", c, " could not be loaded: ", dlerror(),
                            ". Expected: the torch install it was built against, with its CUDA libraries. Fix: "
                            "rebuild fsdp-cpp against the torch this program uses.");
      return out;
    }
    auto get = reinterpret_cast<const CudaApi* (*)()>(dlsym(h, kCudaApiSymbol));
    const CudaApi* api = get ? get() : nullptr;
    if (!api || api->version != kCudaApiVersion) {
      out.why = detail::cat("fsdp-cpp's CUDA plugin ", c, " is of another version (interface ",
                            api ? api->version : -1, ", this program needs ", kCudaApiVersion,
                            "). Fix: install the plugin built with this program.");
      return out;
    }
    if (!at::detail::getCUDAHooks().isBuilt()) {
      out.why = detail::cat(
          "libtorch settled on having no CUDA before fsdp-cpp loaded its CUDA plugin ", c,
          ": something in this process asked libtorch about CUDA first (torch::cuda::device_count() or "
          "is_available(), torch::manual_seed(), a backward pass, at::getAccelerator()), and libtorch decides that "
          "once per process. Expected: the CUDA device named to fsdp-cpp before any of these. Fix: call "
          "fsdp::parse_device(\"cuda\") (or fsdp::require_device) right after reading the command line, before "
          "seeding or building the model (docs/GPU.md)");
      return out;
    }
    out.api = api;
    out.path = c;
    return out;
  }
  out.why = candidates.empty() || tried.empty()
                ? std::string("this build of fsdp-cpp has no CUDA plugin (it was configured with FSDP_CUDA=OFF, or "
                              "its libtorch has no CUDA). Fix: build with -DFSDP_CUDA=ON against a CUDA torch")
                : detail::cat("fsdp-cpp's CUDA plugin (", kPluginFile, ") was not found (looked at ", tried,
                              "). Fix: build with -DFSDP_CUDA=ON, or set FSDP_CUDA_PLUGIN to the file");
  return out;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const CudaApi* cuda_api() { return loaded().api; }

const CudaApi& require_cuda(const std::string& what) {
  const Loaded& l = loaded();
  if (!l.api) throw Error(detail::cat(what, " needs CUDA, but ", l.why, "."));
  return *l.api;
}

}  // namespace comm

int cuda_device_count() {
  const comm::CudaApi* api = comm::cuda_api();
  return api ? api->device_count() : 0;
}

std::string cuda_unavailable_reason() {
  const auto& l = comm::loaded();
  if (!l.api) return l.why;
  if (l.api->device_count() == 0)
    return "this process sees no CUDA device (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)";
  return "";
}

c10::Device parse_device(const std::string& text, const std::string& what) {
  c10::Device d(c10::kCPU);
  if (text == "cuda") {
    d = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(config::read_env().local_rank));
  } else if (text == "cpu" || text.rfind("cuda:", 0) == 0) {
    try {
      d = c10::Device(text);
    } catch (const std::exception&) {
      throw Error(detail::cat(what, " ", text, ": expected cpu, cuda or cuda:K (K a device index)"));
    }
  } else {
    throw Error(detail::cat(what, " ", text, ": expected cpu, cuda or cuda:K (K a device index)"));
  }
  require_device(d, what + " " + text);
  return d;
}

void require_device(const c10::Device& device, const std::string& what) {
  if (device.is_cpu()) return;
  if (!device.is_cuda())
    throw Error(detail::cat(what, " is ", device.str(), "; expected cpu or cuda:K. Fix: use torch::kCPU or ",
                            "torch::Device(torch::kCUDA, local_rank)"));
  const int n = cuda_device_count();
  if (n == 0)
    throw Error(detail::cat(what, " is ", device.str(), ", but ", cuda_unavailable_reason(),
                            ". Fix: run on a machine with a GPU, or use the CPU"));
  if (!device.has_index() || device.index() >= n)
    throw Error(detail::cat(what, " is ", device.str(), ", but this process sees ", n, " CUDA device",
                            n == 1 ? "" : "s", " (cuda:0", n > 1 ? detail::cat("..cuda:", n - 1) : "",
                            "). Fix: name one of them, e.g. cuda:LOCAL_RANK with one GPU per rank"));
}

DeviceMemory device_memory(const c10::Device& device) {
  DeviceMemory m;
  if (device.is_cpu()) {
    const memory::Stats s = memory::stats();
    m.allocated = s.current;
    m.reserved = s.current + s.cached;
    m.peak_allocated = s.peak;
    return m;
  }
  require_device(device, "device_memory");
  comm::cuda_api()->memory(device.index(), &m.allocated, &m.reserved, &m.peak_allocated);
  return m;
}

void set_device_memory_limit(const c10::Device& device, int64_t bytes) {
  FSDP_USER_CHECK(bytes >= 0, "set_device_memory_limit: the limit must be >= 0 bytes (0: none), found ", bytes);
  if (device.is_cpu()) {
    memory::set_limit(bytes);
    return;
  }
  require_device(device, "set_device_memory_limit");
  comm::cuda_api()->set_memory_limit(device.index(), bytes);
}

void reset_device_peak(const c10::Device& device) {
  if (device.is_cpu()) {
    memory::reset_peak();
    return;
  }
  require_device(device, "reset_device_peak");
  comm::cuda_api()->reset_peak(device.index());
}

// What ProcessGroupNCCL does with a collective that outlives its timeout:
// it reads TORCH_NCCL_ASYNC_ERROR_HANDLING when it is made (torch 2.x's
// default, 3: tear the process down without cleaning NCCL up).
static std::string nccl_timeout_behaviour() {
  const std::string m = config::read_env().nccl_async_error_handling;
  const std::string head = "TORCH_NCCL_ASYNC_ERROR_HANDLING=" + m + ": a timed-out NCCL collective ";
  if (m == "0") return head + "is only logged by NCCL's watchdog";
  if (m == "2") return head + "aborts NCCL's communicator and fails the next wait()";
  return head + "aborts the process (SIGABRT)";
}

std::string cuda_libraries() {
  const comm::CudaApi* api = comm::cuda_api();
  if (!api) return cuda_unavailable_reason();
  std::string nccl_path;
  const std::string v = api->nccl_version(&nccl_path);
  return detail::cat("NCCL ", v, " (", nccl_path.empty() ? "not loaded" : nccl_path, "), CUDA runtime ",
                     api->cudart_path().empty() ? "not loaded" : api->cudart_path(), ", plugin ", comm::loaded().path,
                     " (libtorch ", api->torch_version, "); ", nccl_timeout_behaviour());
}

}  // namespace fsdp
