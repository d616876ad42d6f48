// fsdp-cpp: shard — a unit's parameters become one flat buffer and 1/N of it.
//
// Layout of a unit (docs/DESIGN.md#vocabulary):
//   flat     = concat(param_0.flatten(), param_1.flatten(), ...) + zero padding
//   padded   = ceil(numel / N) * N        (NO_SHARD: numel, no padding)
//   shard    = flat[r*S, (r+1)*S), S = padded / N, fp32: the master copy
//   (the arithmetic is common/shard_math.h, shared with the planner and the
//   checkpoint code)
//   full     = the unsharded flat buffer in param_dtype (all-gather output);
//              each module parameter is re-pointed (set_data) at its slice of
//              `full`, so its TensorImpl — and the autograd identity — stay.
// After this, `full`'s storage is freed (FULL_SHARD, SHARD_GRAD_OP): the
// module's parameters keep their shapes but hold no bytes until unshard().
#include "compat/torch_compat.h"
#include "common/shard_math.h"
#include "unit/engine.h"

namespace fsdp::detail {

// A tensor sharing `base`'s storage without being an autograd view (so
// optimizers may detach_() or replace its grad, and it can be a leaf).
torch::Tensor alias(const torch::Tensor& base, int64_t offset, c10::IntArrayRef shape) {
  torch::NoGradGuard ng;
  auto t = torch::empty({0}, base.options());
  t.set_(base.storage(), base.storage_offset() + offset, shape, c10::contiguous_strides(shape));
  return t;
}

void Unit::init_flat_param(const FsdpOptions& opts) {
  torch::NoGradGuard ng;
  const int N = comm->world_size();
  const bool no_shard = opts.strategy == ShardingStrategy::NO_SHARD;
  param_dtype = opts.mixed_precision.param_dtype.value_or(torch::kFloat32);
  reduce_dtype = opts.mixed_precision.reduce_dtype.value_or(param_dtype);
  reshard_after_forward =
      opts.strategy == ShardingStrategy::FULL_SHARD || opts.strategy == ShardingStrategy::HYBRID_SHARD;
  keeps_unsharded = no_shard;
  aliased = no_shard && param_dtype == torch::kFloat32;
  const shard::FlatLayout layout = shard::flat_layout(numel, N, comm->rank(), no_shard);
  padded_numel = layout.padded_numel;
  shard_numel = layout.shard_numel;
  shard_begin = layout.shard_begin;

  // Rank 0's values, everywhere (sync_module_states): one broadcast per unit.
  auto flat = torch::zeros({padded_numel}, torch::kFloat32);
  for (auto& s : params) flat.narrow(0, s.offset, s.numel).copy_(s.param.detach().reshape(-1));
  // Over the whole world (owner->comm): HYBRID's replicas start equal too.
  if (opts.sync_module_states && owner->world() > 1 && numel > 0)
    owner->comm->broadcast(flat, 0, {"sync_module_states " + display_name()})->wait();

  shard = no_shard ? flat : flat.narrow(0, shard_begin, shard_numel).clone();
  full = aliased ? shard : torch::empty({padded_numel}, param_dtype);
  if (!aliased) full.copy_(flat);

  for (auto& s : params) {
    // set_data keeps the parameter's TensorImpl (modules hold it as a member)
    // but points it at `full`; a dtype change here drops the accumulator, so
    // the accumulator is taken only afterwards.
    s.param.set_data(alias(full, s.offset, s.shape));
    const shard::Range r = shard::param_range(s.offset, s.numel, shard_begin, shard_numel);
    s.lo = r.lo;
    s.hi = r.hi;
    s.shard_view = r.empty() ? alias(shard, 0, {0}) : alias(shard, s.offset + r.lo - shard_begin, {r.size()});
    s.shard_view.requires_grad_(s.requires_grad);
    if (s.requires_grad) {
      s.accumulator = compat::grad_accumulator(s.param);
      compat::add_post_hook(s.accumulator, [this] { owner->on_grad_ready(*this); });
    }
  }
  if (keeps_unsharded) {
    state_ = UnitState::UNSHARDED;
  } else {
    compat::free_storage(full);
    state_ = UnitState::SHARDED;
  }
}

}  // namespace fsdp::detail
