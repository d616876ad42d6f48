// fsdp-cpp: the point-to-point links every collective algorithm runs on.
// defines: Transfer, Mesh, connect_gloo_mesh
//
// A Mesh is a full mesh of links between the ranks of one group, made by
// libtorch's own c10d::ProcessGroupGloo (so the process holds one Gloo: the
// one built into libtorch_cpu.so). The algorithms (ring.h, cma.h, tiers.h)
// post sends and receives of byte ranges and wait for each once, in the
// order they choose; a message is matched by (peer, slot), so two
// collectives in flight can never take each other's messages.
//
// Thread: a Mesh is used by one thread at a time (the communicator's
// worker); its construction talks to every rank of the group.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace fsdp::comm {

// One posted send or receive. Its memory must stay valid until wait()
// returned or threw.
class Transfer {
 public:
  Transfer() = default;
  explicit Transfer(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  // true once the bytes left (a send: the peer took them) or arrived (a
  // receive); false when it was aborted. Throws when `timeout` passes first
  // or the link broke; after either the mesh is unusable (Gloo fails all of
  // its links), which the communicator reports as a CollectiveError.
  bool wait(std::chrono::milliseconds timeout);
  bool posted() const { return work_.defined(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

class Mesh {
 public:
  Mesh(c10::intrusive_ptr<c10d::Backend> backend, int rank, int size);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // Constant after construction.
  const int rank;
  const int size;

  // `nbytes` bytes at `p` to (from) `peer`, matched by `slot` (only its low
  // 31 bits travel: a slot must not repeat among the messages in flight
  // between two ranks, which a collective's sequence number modulo 2^11
  // over 2^20 steps guarantees; slots.h hands the steps out).
  Transfer send(int peer, uint64_t slot, const void* p, int64_t nbytes);
  Transfer recv(int peer, uint64_t slot, void* p, int64_t nbytes);

 private:
  c10::intrusive_ptr<c10d::Backend> backend_;
};

// Connects a mesh of `size` ranks through `store` (keys under its prefix),
// with links on `ifname` or, when empty, on `hostname` (this host's address
// toward the master). `timeout` bounds the connection.
std::shared_ptr<Mesh> connect_gloo_mesh(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                        const std::string& ifname, const std::string& hostname,
                                        std::chrono::milliseconds timeout);

}  // namespace fsdp::comm
