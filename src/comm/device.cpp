// fsdp-cpp: CUDA support on request, and the devices' memory (fsdp/device.h).
//
// The CUDA plugin (src/comm/cuda_api.h) is looked for, in order: the file
// FSDP_CUDA_PLUGIN names; <program's folder>/../lib and the program's folder
// (a build tree: bin/ and lib/); the folder it was installed to. It is
// loaded once per process, on the first request, with RTLD_LOCAL: its
// symbols stay its own, and libtorch_cuda registers its kernels with
// libtorch's dispatcher as it loads.
#include "comm/device.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <mutex>

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
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string p(buf, static_cast<size_t>(n));
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
    if (*FSDP_CUDA_PLUGIN_INSTALL_DIR) candidates.push_back(std::string(FSDP_CUDA_PLUGIN_INSTALL_DIR) + "/" + kPluginFile);
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

void reset_device_peak(const c10::Device& device) {
  if (device.is_cpu()) {
    memory::reset_peak();
    return;
  }
  require_device(device, "reset_device_peak");
  comm::cuda_api()->reset_peak(device.index());
}

std::string cuda_libraries() {
  const comm::CudaApi* api = comm::cuda_api();
  if (!api) return cuda_unavailable_reason();
  std::string nccl_path;
  const std::string v = api->nccl_version(&nccl_path);
  return detail::cat("NCCL ", v, " (", nccl_path.empty() ? "not loaded" : nccl_path, "), CUDA runtime ",
                     api->cudart_path().empty() ? "not loaded" : api->cudart_path(), ", plugin ", comm::loaded().path,
                     " (libtorch ", api->torch_version, ")");
}

}  // namespace fsdp
