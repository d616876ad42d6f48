// fsdp-cpp: initial values from names (fsdp/param_init.h).
#include "fsdp/param_init.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <unordered_set>

#include "fsdp/deferred.h"
#include "fsdp/errors.h"
#include "fsdp/hf.h"
#include "unit/engine.h"

namespace fsdp {
namespace {

uint64_t mix(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the name
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull;  // splitmix64 of the seed
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return h ^ z;
}

bool is_norm(const torch::nn::Module& m) { return m.name().find("Norm") != std::string::npos; }

int64_t conv_fan_in(const torch::Tensor& weight) {
  // [out, in/groups, k...]: fan_in = in/groups * prod(k)
  int64_t f = weight.dim() >= 2 ? weight.size(1) : 1;
  for (int64_t i = 2; i < weight.dim(); i++) f *= weight.size(i);
  return f;
}

}  // namespace

at::Generator init_generator(uint64_t seed, const std::string& name) {
  const uint64_t h = mix(seed, name);
  // The CPU generator seeds its mt19937 with 32 bits: fold the hash.
  return at::make_generator<at::CPUGeneratorImpl>((h ^ (h >> 32)) & 0xffffffffull);
}

namespace detail {
namespace {
void leave_zero(const InitTarget&, torch::Tensor& v) { v.zero_(); }
}  // namespace
bool is_zeros_for_loading(const ParamInit& init) {
  auto* f = init.target<void (*)(const InitTarget&, torch::Tensor&)>();
  return f && *f == &leave_zero;
}
}  // namespace detail

ParamInit zeros_for_loading() { return &detail::leave_zero; }

ParamInit default_param_init(uint64_t seed) {
  return [seed](const InitTarget& t, torch::Tensor& v) {
    torch::NoGradGuard ng;
    const torch::nn::Module& m = *t.module;
    auto fail = [&]() {
      throw Error("default_param_init: no default for '" + t.name + "' (" + t.local_name + " of a " + m.name() +
                  "). Expected: parameters and buffers of Linear, Conv1d/2d/3d, Embedding or *Norm modules. Fix: "
                  "pass FsdpOptions::param_init a function of your own that handles this tensor (and calls "
                  "default_param_init(seed) for the rest).");
    };
    if (!v.is_floating_point()) {
      if (t.local_name == "num_batches_tracked") {
        v.zero_();
        return;
      }
      fail();
    }
    if (auto* lin = dynamic_cast<const torch::nn::LinearImpl*>(&m)) {
      const double b = 1.0 / std::sqrt(double(std::max<int64_t>(1, lin->options.in_features())));
      if (t.local_name != "weight" && t.local_name != "bias") fail();
      v.uniform_(-b, b, init_generator(seed, t.name));
      return;
    }
    const bool conv = dynamic_cast<const torch::nn::Conv1dImpl*>(&m) || dynamic_cast<const torch::nn::Conv2dImpl*>(&m) ||
                      dynamic_cast<const torch::nn::Conv3dImpl*>(&m);
    if (conv) {
      auto named = m.named_parameters(/*recurse=*/false);
      const torch::Tensor* w = named.find("weight");
      if (!w || (t.local_name != "weight" && t.local_name != "bias")) fail();
      const double b = 1.0 / std::sqrt(double(std::max<int64_t>(1, conv_fan_in(*w))));
      v.uniform_(-b, b, init_generator(seed, t.name));
      return;
    }
    if (dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) {
      if (t.local_name != "weight") fail();
      v.normal_(0.0, 1.0, init_generator(seed, t.name));
      auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(&m);
      if (auto pad = e->options.padding_idx()) {
        const int64_t row = *pad < 0 ? *pad + v.size(0) : *pad;
        v[row].zero_();
      }
      return;
    }
    if (is_norm(m)) {
      if (t.local_name == "weight" || t.local_name == "running_var") return void(v.fill_(1.0));
      if (t.local_name == "bias" || t.local_name == "running_mean") return void(v.zero_());
    }
    fail();
  };
}

namespace detail {

std::vector<std::pair<InitTarget, torch::Tensor>> init_targets(torch::nn::Module& root, bool buffers) {
  std::vector<std::pair<InitTarget, torch::Tensor>> out;
  // The root itself first (it may live on the stack: named_modules with
  // include_self needs a shared_ptr), then its descendants in pre-order.
  std::vector<std::pair<std::string, const torch::nn::Module*>> modules = {{"", &root}};
  for (auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    modules.emplace_back(item.key(), item.value().get());
  for (auto& [path, mp] : modules) {
    const std::string prefix = path.empty() ? "" : path + ".";
    const torch::nn::Module& m = *mp;
    auto list = buffers ? m.named_buffers(/*recurse=*/false) : m.named_parameters(/*recurse=*/false);
    for (auto& p : list) {
      InitTarget t;
      t.name = prefix + p.key();
      t.local_name = p.key();
      t.module = &m;
      t.is_buffer = buffers;
      out.emplace_back(std::move(t), p.value());
    }
  }
  return out;
}

}  // namespace detail

void initialize(torch::nn::Module& module, const ParamInit& init) {
  FSDP_USER_CHECK(static_cast<bool>(init), "fsdp::initialize: the ParamInit is empty");
  torch::NoGradGuard ng;
  // A tensor registered twice (tied weights) is initialised once, under its
  // first name, as fully_shard names it.
  std::unordered_set<const c10::TensorImpl*> done;
  for (bool buffers : {false, true})
    for (auto& [target, t] : detail::init_targets(module, buffers)) {
      if (!t.defined() || !done.insert(t.unsafeGetTensorImpl()).second) continue;
      torch::Tensor value = t;
      if (is_deferred(t) || !t.is_contiguous()) {
        value = torch::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
        init(target, value);
        t.set_data(value);
      } else {
        init(target, value);
      }
    }
}

}  // namespace fsdp
