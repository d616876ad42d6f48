// fsdp-cpp: every libtorch-version-specific call, in one place.
// defines: compat::free_storage, compat::alloc_storage, compat::storage_allocated,
//          compat::grad_accumulator, compat::add_post_hook, compat::queue_backward_callback,
//          compat::optimizer_state_key, compat::cpu_rng_state, compat::set_cpu_rng_state,
//          compat::graph_leaves
//
// Written against libtorch 2.x (the torch wheel pinned in the Makefile);
// what changed since 1.13 is listed in docs/DESIGN.md ("libtorch versions").
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace fsdp::compat {

// Frees a tensor's storage in place: every view (module parameters, tensors
// autograd saved such as weight.t()) keeps pointing at the same StorageImpl,
// which now holds no bytes. PyTorch FSDP does the same with
// untyped_storage().resize_(0).
inline void free_storage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

// Re-allocates the storage freed by free_storage (contents undefined), from
// the allocator of the tensor's device (the CPU's: the one c10 has now, the
// counting allocator after fsdp::init; CUDA's: the caching allocator, on
// the current stream).
inline void alloc_storage(const torch::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  c10::Allocator* a = t.is_cpu() ? c10::GetCPUAllocator() : c10::GetAllocator(t.device().type());
  s->set_data_ptr_noswap(a->allocate(nbytes));
  s->set_nbytes(nbytes);
}

inline bool storage_allocated(const torch::Tensor& t) {
  return t.defined() && t.storage().nbytes() > 0;
}

// An owning pointer to an autograd node (2.15: c10::intrusive_ptr; up to
// 2.14: std::shared_ptr), as the autograd API hands it out.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));

// The AccumulateGrad node of a leaf. A post-hook on it fires only while
// someone holds this pointer, so the caller must keep it.
inline NodePtr grad_accumulator(const torch::Tensor& leaf) { return torch::autograd::impl::grad_accumulator(leaf); }

class LambdaPostHook : public torch::autograd::FunctionPostHook {
 public:
  explicit LambdaPostHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

inline void add_post_hook(const NodePtr& node, std::function<void()> fn) {
  node->add_post_hook(std::make_unique<LambdaPostHook>(std::move(fn)));
}

// Runs fn once the current backward pass has finished (must be called from
// inside a backward, e.g. from a tensor hook).
inline void queue_backward_callback(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

// How torch::optim keys per-parameter state: the TensorImpl's address (2.x;
// 1.13 spelled that address as a string).
inline void* optimizer_state_key(const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }

// The default CPU generator's state (what dropout and other random kernels
// draw from), as torch.get_rng_state() / set_rng_state() (1.13 and 2.x:
// Generator::get_state / set_state under the generator's mutex).
inline torch::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
inline void set_cpu_rng_state(const torch::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The leaves (tensors that accumulate .grad) the graph of `roots` reaches:
// their AccumulateGrad nodes' variables, each once (1.13 and 2.x:
// torch::autograd::AccumulateGrad::variable).
inline std::vector<torch::Tensor> graph_leaves(const std::vector<torch::Tensor>& roots) {
  std::vector<torch::Tensor> out;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  for (auto& r : roots)
    if (r.defined() && r.grad_fn()) todo.push_back(r.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) out.push_back(acc->variable);
    for (const auto& e : n->next_edges())
      if (e.function) todo.push_back(e.function.get());
  }
  return out;
}

}  // namespace fsdp::compat
