// fsdp-cpp: the mesh on libtorch's c10d::ProcessGroupGloo (see mesh.h).
//
// The only file that includes ProcessGroupGloo.hpp; it compiles against
// gloo_names/ (declarations of the Gloo names that header uses, see
// gloo_names/gloo/names.h) with USE_C10D_GLOO, as libtorch itself was built.
#include "comm/mesh.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <algorithm>

namespace fsdp::comm {
namespace {

// c10d's tags are non-negative ints.
int tag_of(uint64_t slot) { return static_cast<int>(slot & 0x7fffffffu); }

std::vector<at::Tensor> bytes_at(const void* p, int64_t nbytes) {
  // A view of the caller's memory, no copy: Gloo sends from and receives
  // into it directly. (c10d takes a mutable tensor even for a send; sends
  // never write.)
  return {torch::from_blob(const_cast<void*>(p), {std::max<int64_t>(nbytes, 1)}, torch::kByte)};
}

}  // namespace

bool Transfer::wait(std::chrono::milliseconds timeout) {
  // Gloo treats a non-positive timeout as "use the default"; 1 ms expires now.
  return work_->wait(std::max(timeout, std::chrono::milliseconds(1)));
}

Mesh::Mesh(c10::intrusive_ptr<c10d::Backend> backend, int rank, int size)
    : rank(rank), size(size), backend_(std::move(backend)) {}

Mesh::~Mesh() = default;

Transfer Mesh::send(int peer, uint64_t slot, const void* p, int64_t nbytes) {
  auto t = bytes_at(p, nbytes);
  return Transfer(backend_->send(t, peer, tag_of(slot)));
}

Transfer Mesh::recv(int peer, uint64_t slot, void* p, int64_t nbytes) {
  auto t = bytes_at(p, nbytes);
  return Transfer(backend_->recv(t, peer, tag_of(slot)));
}

std::shared_ptr<Mesh> connect_gloo_mesh(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                        const std::string& ifname, const std::string& hostname,
                                        std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(ifname.empty() ? c10d::ProcessGroupGloo::createDeviceForHostname(hostname)
                                         : c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  // Point-to-point only: Gloo's worker threads run c10d's own collectives,
  // which fsdp-cpp does not use.
  opts->threads = 1;
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
  return std::make_shared<Mesh>(std::move(pg), rank, size);
}

}  // namespace fsdp::comm
