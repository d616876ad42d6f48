// fsdp-cpp: deferred construction — build a model no rank could hold.
// defines: DeferredInit, is_deferred, deferred_blocks_alive
//
//   fsdp::init();                       // the counting allocator, first
//   gpt::GPT net{nullptr};
//   {
//     fsdp::DeferredInit deferred;      // tensors made here get no memory
//     net = gpt::GPT(cfg);              // shapes only
//   }
//   fsdp::FsdpOptions opts;
//   opts.param_init = fsdp::default_param_init(seed);  // fsdp/param_init.h
//   auto model = fsdp::fully_shard(net, comm, opts);   // unit by unit: init, shard, free
//
// libtorch's C++ module constructors allocate on the CPU whatever device
// guard is active, and their options have no device, so a meta-device
// construction is not available to C++ users (docs/DESIGN.md "Deferred
// construction" has the probe). Instead, inside a DeferredInit scope every
// tensor the calling thread allocates shares one block of a reserved,
// never-committed scratch mapping: the module tree, its names, shapes and
// dtypes are real, the values are garbage, and the process holds about the
// largest single tensor (the pages a constructor's default initialisation
// writes), not the model. fully_shard() recognises such tensors
// (is_deferred) and gives each parameter and buffer real memory and its
// initial value from FsdpOptions::param_init, unit by unit, keeping only this
// rank's shard.
//
// Rules: only the constructing thread is affected (communication threads
// allocate normally); nothing may read a deferred tensor's values (they are
// garbage; fully_shard replaces them); a deferred model must be wrapped by
// fully_shard with a param_init before use. Needs the counting allocator
// (fsdp::init); throws fsdp::Error without it.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace fsdp {

// A scope in which this thread's new tensors get shapes but no memory. A
// model no rank can hold is built so, for fully_shard to give it memory
// unit by unit (the rules of deferred.h).
class DeferredInit {
 public:
  DeferredInit();   // throws fsdp::Error when the counting allocator is not installed
  ~DeferredInit();  // leaves the scope; the last scope drops the scratch pages
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;

  // What this thread deferred since the scope began: bytes the tensors would
  // have held, and their number.
  int64_t bytes() const;
  // The number of tensors deferred since the scope began.
  int64_t tensors() const;

 private:
  int64_t bytes_before_ = 0, count_before_ = 0;
};

// True when t's storage is a deferred block (allocated inside a DeferredInit
// scope and not yet given memory of its own).
bool is_deferred(const torch::Tensor& t);

// Deferred blocks still referenced by some tensor (for tests and checks).
int64_t deferred_blocks_alive();

}  // namespace fsdp
