// fsdp-cpp: initial values that depend on the seed and a tensor's name only.
// defines: InitTarget, ParamInit, default_param_init, init_generator, initialize
//
// A run's result must not change because it was started on more machines:
// with a ParamInit every parameter and buffer gets its initial value from
// its fully qualified name (and a seed), whatever the world size, whichever
// rank builds which unit and in whatever order. fully_shard() applies
// FsdpOptions::param_init unit by unit (the only way to initialise a model
// built under fsdp::DeferredInit, fsdp/deferred.h); initialize() applies the
// same function to an eagerly built module, so both constructions give
// bitwise the same weights.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>

namespace fsdp {

// One tensor to initialise.
struct InitTarget {
  std::string name;        // fully qualified, as named_parameters() / named_buffers() spell it
  std::string local_name;  // within its module: "weight", "bias", "running_mean", ...
  const torch::nn::Module* module = nullptr;  // the module registering it
  // A buffer (running_mean, ...), not a parameter.
  bool is_buffer = false;
};

// Writes the initial value of `target` into `value` (its full shape and
// dtype, contiguous, CPU) in place. Must depend only on the target (name,
// module type, shape) and values captured at creation (a seed): every rank
// calls it for every tensor it initialises and fully_shard checks that the
// ranks agree (one checksum per unit).
using ParamInit = std::function<void(const InitTarget& target, torch::Tensor& value)>;

// libtorch's default initialisation for its module types, each tensor drawn
// from its own generator (init_generator(seed, name)):
//   Linear, Conv{1,2,3}d: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))
//     (kaiming_uniform_ with a = sqrt(5), as Linear::reset_parameters);
//   Embedding: weight ~ N(0, 1);
//   *Norm* modules (LayerNorm, BatchNorm, GroupNorm, InstanceNorm): weight 1,
//     bias 0, running_mean 0, running_var 1, num_batches_tracked 0.
// Any other tensor throws fsdp::Error naming it and its module type: give a
// ParamInit of your own (which may call this one for the rest).
ParamInit default_param_init(uint64_t seed);

// The generator of one tensor: the same (seed, name) gives the same stream.
at::Generator init_generator(uint64_t seed, const std::string& name);

// Applies `init` to every parameter and buffer of an eagerly built module
// (in place, no gradient recorded). Deferred tensors get memory of their own
// first, so this also materialises a small deferred model in full.
void initialize(torch::nn::Module& module, const ParamInit& init);

}  // namespace fsdp
