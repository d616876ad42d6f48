// fsdp-cpp, implementation detail of fsdp/fully_shard.h: a forward whose
// activations are recomputed in backward (FsdpOptions::recompute;
// src/unit/recompute.cpp). Not public API: include fsdp/fully_shard.h (or
// fsdp/fsdp.h) instead.
//
// defines: detail::RecomputeSite (declared), recompute_site, RegionFn,
//          run_recomputed, recompute_unsupported, call_recomputed and the
//          argument and output traits it uses
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fsdp::detail {

// A module selected by FsdpOptions::recompute (src/unit/engine.h).
struct RecomputeSite;
// The site of `m` when m is selected and its call is to be recomputed now
// (grad mode on); nullptr otherwise.
RecomputeSite* recompute_site(const torch::nn::Module* m);
// The module's forward on `inputs` (its tensor arguments, in order), as one
// function of tensors to tensors.
using RegionFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;
// Runs fn(inputs) without keeping its activations; backward runs it again.
std::vector<torch::Tensor> run_recomputed(RecomputeSite& site, RegionFn fn, std::vector<torch::Tensor> inputs);
// Throws fsdp::Error: the selected module's forward cannot be recomputed (why).
[[noreturn]] void recompute_unsupported(const RecomputeSite& site, const char* why);

// Whether T is a tensor (after decay).
template <class T>
inline constexpr bool is_tensor_v = std::is_same_v<std::decay_t<T>, torch::Tensor>;
// Whether T holds tensors without being one (an optional or a vector of
// them): such an argument cannot be saved for the recompute.
template <class T>
struct holds_tensors : std::false_type {};
// An optional tensor holds one.
template <>
struct holds_tensors<c10::optional<torch::Tensor>> : std::true_type {};
// A vector of tensors holds them.
template <>
struct holds_tensors<std::vector<torch::Tensor>> : std::true_type {};
// A list of tensors holds them.
template <>
struct holds_tensors<torch::TensorList> : std::true_type {};
// Arguments a recomputed forward takes: tensors (saved for the recompute)
// and copyable values without tensors inside (copied into it).
template <class T>
inline constexpr bool recompute_arg_ok_v =
    is_tensor_v<T> || (!holds_tensors<std::decay_t<T>>::value && std::is_copy_constructible_v<std::decay_t<T>>);
// What the recompute passes for each argument.
template <class T>
using recompute_arg_t = std::conditional_t<is_tensor_v<T>, const torch::Tensor&, std::decay_t<T>&>;
// What the recompute keeps of a tensor argument besides the saved tensor: nothing.
struct recompute_none {};
// What the recompute keeps of each argument: a copy of a value, nothing of a tensor.
template <class T>
using recompute_kept_t = std::conditional_t<is_tensor_v<T>, recompute_none, std::decay_t<T>>;
// The kept copy of one argument.
template <class T>
recompute_kept_t<T> recompute_keep(const T& x) {
  if constexpr (is_tensor_v<T>)
    return {};
  else
    return x;
}
// Outputs a recomputed forward may return: a tensor, a vector or a tuple of
// tensors; to_list / from_list convert them to and from the list of tensors
// the recompute's autograd node passes.
template <class R>
struct recompute_out : std::false_type {};
// One tensor.
template <>
struct recompute_out<torch::Tensor> : std::true_type {
  static std::vector<torch::Tensor> to_list(torch::Tensor t) { return {std::move(t)}; }
  static torch::Tensor from_list(std::vector<torch::Tensor> v) { return std::move(v.at(0)); }
};
// A vector of tensors.
template <>
struct recompute_out<std::vector<torch::Tensor>> : std::true_type {
  static std::vector<torch::Tensor> to_list(std::vector<torch::Tensor> v) { return v; }
  static std::vector<torch::Tensor> from_list(std::vector<torch::Tensor> v) { return v; }
};
// A tuple of tensors (anything else in the tuple: unsupported).
template <class... Ts>
struct recompute_out<std::tuple<Ts...>> : std::bool_constant<(std::is_same_v<Ts, torch::Tensor> && ...)> {
  static std::vector<torch::Tensor> to_list(const std::tuple<Ts...>& t) {
    return std::apply([](const auto&... x) { return std::vector<torch::Tensor>{x...}; }, t);
  }
  static std::tuple<Ts...> from_list(std::vector<torch::Tensor> v) {
    return from_list(v, std::index_sequence_for<Ts...>{});
  }
  template <size_t... I>
  static std::tuple<Ts...> from_list(std::vector<torch::Tensor>& v, std::index_sequence<I...>) {
    return std::tuple<Ts...>(std::move(v.at(I))...);
  }
};
// Position of each argument among the tensor arguments (-1: not a tensor).
template <class... As>
constexpr std::array<int, sizeof...(As)> recompute_slots() {
  constexpr bool tensor[] = {is_tensor_v<As>..., false};
  std::array<int, sizeof...(As)> out{};
  int k = 0;
  for (size_t i = 0; i < sizeof...(As); ++i) out[i] = tensor[i] ? k++ : -1;
  return out;
}
// The argument the recompute passes in position of A: the S-th saved
// tensor, or the kept copy.
template <class A, int S, class K>
decltype(auto) recompute_pick(K& kept, const std::vector<torch::Tensor>& in) {
  if constexpr (is_tensor_v<A>)
    return static_cast<const torch::Tensor&>(in.at(S));
  else
    return static_cast<K&>(kept);
}
// Whether M's forward accepts the arguments as the recompute passes them.
template <class Void, class M, class... As>
struct recompute_callable : std::false_type {};
// It does.
template <class M, class... As>
struct recompute_callable<std::void_t<decltype(std::declval<M&>()->forward(std::declval<recompute_arg_t<As>>()...))>, M,
                          As...> : std::true_type {};
// The module's forward again, on the saved tensors and the kept values.
template <class... As, class M, class Kept, size_t... I>
auto recompute_invoke(M& module, Kept& kept, const std::vector<torch::Tensor>& in, std::index_sequence<I...>) {
  constexpr auto slots = recompute_slots<As...>();
  return module->forward(recompute_pick<As, slots[I]>(std::get<I>(kept), in)...);
}

// module->forward(args...) with its activations recomputed in backward.
template <class M, class... Args>
auto call_recomputed(RecomputeSite& site, M module, Args&&... args)
    -> std::decay_t<decltype(module->forward(std::forward<Args>(args)...))> {
  using R = std::decay_t<decltype(module->forward(std::forward<Args>(args)...))>;
  if constexpr (!recompute_out<R>::value) {
    recompute_unsupported(site, "its forward returns something other than a tensor, a vector or a tuple of tensors");
  } else if constexpr (!(recompute_arg_ok_v<Args> && ...) || !recompute_callable<void, M, Args...>::value) {
    recompute_unsupported(site,
                          "its forward takes an argument that is neither a tensor nor a copyable value "
                          "without tensors inside (e.g. an optional or a vector of tensors)");
  } else {
    std::vector<torch::Tensor> tensors;
    auto add = [&](const auto& a) {
      if constexpr (is_tensor_v<decltype(a)>) tensors.push_back(a);
    };
    (add(args), ...);
    auto kept = std::make_shared<std::tuple<recompute_kept_t<Args>...>>(recompute_keep(args)...);
    RegionFn fn = [module, kept](const std::vector<torch::Tensor>& in) mutable {
      return recompute_out<R>::to_list(recompute_invoke<Args...>(module, *kept, in, std::index_sequence_for<Args...>{}));
    };
    return recompute_out<R>::from_list(run_recomputed(site, std::move(fn), std::move(tensors)));
  }
}


}  // namespace fsdp::detail
