// fsdp-cpp, implementation detail of fsdp/fully_shard.h: how fsdp::call
// routes a module's forward through its unit. Not public API: include
// fsdp/fully_shard.h (or fsdp/fsdp.h) instead.
//
// defines: detail::as_module, raw_module, is_module_holder, shared_module,
//          unit_of, UnitCall, collect, cast_arg, run_sequential
#pragma once

#include <torch/torch.h>

#include <exception>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fsdp {
namespace trace {
class Span;  // fsdp/trace.h
}  // namespace trace

namespace detail {
class Unit;  // src/unit/unit.h

// The module a holder or pointer refers to, as a shared module.
std::shared_ptr<torch::nn::Module> as_module(const std::shared_ptr<torch::nn::Module>& m);
// The module `m` points to (a holder or a pointer); nullptr when it is no module.
template <class M>
torch::nn::Module* raw_module(const M& m) {
  if constexpr (std::is_base_of_v<torch::nn::Module, std::remove_cv_t<std::remove_reference_t<decltype(*m)>>>)
    return const_cast<torch::nn::Module*>(static_cast<const torch::nn::Module*>(&*m));
  else
    return nullptr;
}
// Whether M is a module holder (it has ptr()), rather than a shared_ptr.
template <class M, class = void>
struct is_module_holder : std::false_type {};
// A module holder: it has ptr().
template <class M>
struct is_module_holder<M, std::void_t<decltype(std::declval<const M&>().ptr())>> : std::true_type {};

// The shared module of a holder or a shared_ptr.
template <class M>
std::shared_ptr<torch::nn::Module> shared_module(const M& m) {
  if constexpr (is_module_holder<M>::value)
    return m.ptr();
  else
    return m;
}

// Unit owning module `m` (nullptr when m is not a unit root).
Unit* unit_of(const torch::nn::Module* m);

// Pre-forward (unshard, state checks) and post-forward (reshard, register
// pre-backward hooks on the outputs) of one unit call; restores state when
// the forward throws, and explains use of freed parameters.
class UnitCall {
 public:
  // Enters the unit's forward (pre-forward).
  explicit UnitCall(Unit* u);
  ~UnitCall();
  // Leaves it (post-forward) with the forward's tensor outputs.
  void finish(const std::vector<torch::Tensor>& outputs);
  // Restores the unit's state after a failed forward, then throws `e` again
  // (explained when it used freed parameters).
  [[noreturn]] void rethrow(const std::exception_ptr& e);
  // Casts floating tensors to the unit's param dtype (mixed precision).
  torch::Tensor cast_input(const torch::Tensor& t) const;

 private:
  Unit* u_;
  bool finished_ = false;
  std::unique_ptr<trace::Span> span_;  // "forward" of this unit when tracing
};

// Appends the tensors of a forward's output to `out` (a tensor).
inline void collect(std::vector<torch::Tensor>& out, const torch::Tensor& t) { out.push_back(t); }
// Appends the tensors of a forward's output to `out` (a vector of tensors).
inline void collect(std::vector<torch::Tensor>& out, const std::vector<torch::Tensor>& v) {
  out.insert(out.end(), v.begin(), v.end());
}
// Appends the tensors of a forward's output to `out` (a tuple, recursively).
template <class... Ts>
void collect(std::vector<torch::Tensor>& out, const std::tuple<Ts...>& t) {
  std::apply([&](const auto&... x) { (collect(out, x), ...); }, t);
}
// Non-tensor outputs: nothing to hook.
template <class T>
void collect(std::vector<torch::Tensor>&, const T&) {}

// A forward argument as the unit computes on it: tensors cast to its param
// dtype, anything else passed on.
template <class T>
decltype(auto) cast_arg(UnitCall& c, T&& x) {
  if constexpr (std::is_same_v<std::decay_t<T>, torch::Tensor>)
    return c.cast_input(x);
  else
    return std::forward<T>(x);
}

// A Sequential's forward with each child routed through fsdp::call.
torch::nn::AnyValue run_sequential(torch::nn::SequentialImpl& seq, std::vector<torch::nn::AnyValue> inputs);

}  // namespace detail
}  // namespace fsdp
