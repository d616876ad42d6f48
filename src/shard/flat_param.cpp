// fsdp-cpp: shard — a unit's parameters become one flat buffer and 1/N of it.
//
// Layout of a unit (docs/DESIGN.md#vocabulary):
//   flat     = concat(param_0.flatten(), param_1.flatten(), ...) + zero padding
//   padded   = ceil(numel / N) * N        (NO_SHARD: numel, no padding)
//   shard    = flat[r*S, (r+1)*S), S = padded / N, fp32: the master copy
//   full     = the unsharded flat buffer in param_dtype (all-gather output);
//              each module parameter is re-pointed (set_data) at its slice of
//              `full`, so its TensorImpl — and the autograd identity — stay.
// After this, `full`'s storage is freed (FULL_SHARD, SHARD_GRAD_OP): the
// module's parameters keep their shapes but hold no bytes until unshard().
#include "compat/torch_compat.h"
#include "unit/sharded_state.h"

namespace fsdp::detail {

// A tensor sharing `base`'s storage without being an autograd view (so
// optimizers may detach_() or replace its grad, and it can be a leaf).
torch::Tensor alias(const torch::Tensor& base, int64_t offset, c10::IntArrayRef shape) {
  torch::NoGradGuard ng;
  auto t = torch::empty({0}, base.options());
  t.set_(base.storage(), base.storage_offset() + offset, shape, c10::contiguous_strides(shape));
  return t;
}

void ShardedState::init_flat_params(Unit& u) {
  torch::NoGradGuard ng;
  const int N = world(), r = rank();
  const bool no_shard = opts.strategy == ShardingStrategy::NO_SHARD;
  u.param_dtype = opts.mixed_precision.param_dtype.value_or(torch::kFloat32);
  u.reduce_dtype = opts.mixed_precision.reduce_dtype.value_or(u.param_dtype);
  u.reshard_after_forward = opts.strategy == ShardingStrategy::FULL_SHARD;
  u.keeps_unsharded = no_shard;
  u.aliased = no_shard && u.param_dtype == torch::kFloat32;
  u.padded_numel = no_shard ? u.numel : (u.numel + N - 1) / N * N;
  u.shard_numel = no_shard ? u.numel : u.padded_numel / N;
  const int64_t base = no_shard ? 0 : int64_t(r) * u.shard_numel;

  // Rank 0's values, everywhere (sync_module_states): one broadcast per unit.
  auto flat = torch::zeros({u.padded_numel}, torch::kFloat32);
  for (auto& s : u.params) flat.narrow(0, s.offset, s.numel).copy_(s.param.detach().reshape(-1));
  if (opts.sync_module_states && N > 1 && u.numel > 0)
    comm->broadcast(flat, 0, {"sync_module_states " + u.display_name()})->wait();

  u.shard = no_shard ? flat : flat.narrow(0, base, u.shard_numel).clone();
  u.full = u.aliased ? u.shard : torch::empty({u.padded_numel}, u.param_dtype);
  if (!u.aliased) u.full.copy_(flat);

  for (auto& s : u.params) {
    // set_data keeps the parameter's TensorImpl (modules hold it as a member)
    // but points it at `full`; a dtype change here drops the accumulator, so
    // the accumulator is taken only afterwards.
    s.param.set_data(alias(u.full, s.offset, s.shape));
    const int64_t lo_g = std::max(s.offset, base);
    const int64_t hi_g = std::min(s.offset + s.numel, base + u.shard_numel);
    if (lo_g < hi_g) {
      s.lo = lo_g - s.offset;
      s.hi = hi_g - s.offset;
      s.shard_view = alias(u.shard, lo_g - base, {hi_g - lo_g});
    } else {
      s.lo = s.hi = std::clamp<int64_t>(base - s.offset, 0, s.numel);
      s.shard_view = alias(u.shard, 0, {0});
    }
    s.shard_view.requires_grad_(s.requires_grad);
    if (s.requires_grad) {
      s.accumulator = compat::grad_accumulator(s.param);
      Unit* up = &u;
      compat::add_post_hook(s.accumulator, [this, up] { on_grad_ready(*up); });
    }
  }
  if (u.keeps_unsharded) {
    u.state = UnitState::UNSHARDED;
  } else {
    compat::free_storage(u.full);
    u.state = UnitState::SHARDED;
  }
}

}  // namespace fsdp::detail
