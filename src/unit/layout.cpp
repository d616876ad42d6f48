// fsdp-cpp: a unit's flat layout — its parameters become one flat buffer
// and this rank keeps 1/N of it.
//
// defines: storage_slice, Unit::Unit (the layout), Unit::init_flat_param,
//          Unit::init_shard_from
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
// The constructor fixes the layout (const fields, each slot's offset and
// [lo, hi)); init_flat_param gives it its tensors. After it `full`'s storage
// is freed (FULL_SHARD, SHARD_GRAD_OP): the module's parameters keep their
// shapes but hold no bytes until Unit::unshard (unit.cpp).
#include "compat/torch_compat.h"
#include "common/collective_path.h"
#include "common/shard_math.h"
#include "fsdp/deferred.h"
#include "unit/engine.h"

namespace fsdp::detail {

// A tensor sharing `base`'s storage without being an autograd view (so
// optimizers may detach_() or replace its grad, and it can be a leaf).
torch::Tensor storage_slice(const torch::Tensor& base, int64_t offset, c10::IntArrayRef shape) {
  torch::NoGradGuard ng;
  auto t = torch::empty({0}, base.options());
  t.set_(base.storage(), base.storage_offset() + offset, shape, c10::contiguous_strides(shape));
  return t;
}

namespace {
int64_t total_numel(const std::vector<ParamSlot>& slots) {
  int64_t n = 0;
  for (auto& s : slots) n += s.param.numel();
  return n;
}
int count_grad_params(const std::vector<ParamSlot>& slots) {
  int n = 0;
  for (auto& s : slots) n += s.param.requires_grad() ? 1 : 0;
  return n;
}
bool is_no_shard(const FsdpOptions& o) { return o.strategy == ShardingStrategy::NO_SHARD; }
shard::FlatLayout layout_of(const std::vector<ParamSlot>& slots, const Communicator& group, const FsdpOptions& o) {
  return shard::flat_layout(total_numel(slots), group.world_size(), group.rank(), is_no_shard(o));
}
torch::ScalarType param_dtype_of(const FsdpOptions& o) {
  return o.mixed_precision.param_dtype.value_or(torch::kFloat32);
}
}  // namespace

Unit::Unit(int index, std::string name, torch::nn::Module* module, Unit* parent, Engine* owner, Communicator* comm,
           std::vector<ParamSlot> slots, const FsdpOptions& opts)
    : index(index),
      name(std::move(name)),
      module(module),
      parent(parent),
      owner(owner),
      comm(comm),
      device(opts.device),
      numel(total_numel(slots)),
      padded_numel(layout_of(slots, *comm, opts).padded_numel),
      shard_numel(layout_of(slots, *comm, opts).shard_numel),
      shard_begin(layout_of(slots, *comm, opts).shard_begin),
      param_dtype(param_dtype_of(opts)),
      reduce_dtype(opts.mixed_precision.reduce_dtype.value_or(param_dtype_of(opts))),
      reshard_after_forward(opts.strategy == ShardingStrategy::FULL_SHARD ||
                            opts.strategy == ShardingStrategy::HYBRID_SHARD),
      keeps_unsharded(is_no_shard(opts)),
      full_is_shard(is_no_shard(opts) && param_dtype_of(opts) == torch::kFloat32),
      host_shared(path::host_shared_unit({opts.strategy, opts.device.is_cpu(), total_numel(slots), comm->world_size(),
                                          comm->shares_host_memory()})),
      grads_in_peer_memory(path::grads_in_peer_memory(host_shared, param_dtype == reduce_dtype)),
      n_grad_params(count_grad_params(slots)),
      params_(std::move(slots)) {
  // Back to back in the flat buffer; this rank's [lo, hi) of each.
  int64_t offset = 0;
  for (auto& s : params_) {
    s.shape = s.param.sizes().vec();
    s.numel = s.param.numel();
    s.offset = offset;
    s.requires_grad = s.param.requires_grad();
    offset += s.numel;
    const shard::Range r = shard::param_range(s.offset, s.numel, shard_begin, shard_numel);
    s.lo = r.lo;
    s.hi = r.hi;
  }
}

// Whether `init` is fsdp::zeros_for_loading() (fsdp/hf.h; defined in
// src/unit/param_init.cpp): the shards stay zeros and no parameter is made
// at full size.
bool is_zeros_for_loading(const ParamInit& init);

void Unit::init_flat_param(const FsdpOptions& opts, const InitTargetOf& target_of) {
  torch::NoGradGuard ng;
  // Host-shared (unit.h): one copy per host that every rank maps, made
  // first. fp32: the master shard is this rank's slice of it, so the
  // optimizer's updates land where every rank reads them, and the values
  // are written there from the start (no private copy ever exists).
  torch::Tensor home;
  if (host_shared) {
    full = comm->shared_tensor(padded_numel, param_dtype, {display_name()});
    if (param_dtype == torch::kFloat32 && shard_numel > 0) home = full.narrow(0, shard_begin, shard_numel);
  }
  if (opts.param_init) {
    init_shard_from(opts.param_init, target_of, home);
  } else {
    for (auto& s : params_)
      if (is_deferred(s.param))
        throw Error("parameter '" + s.name + "' was built under fsdp::DeferredInit (it has no values yet), but "
                    "FsdpOptions::param_init is empty. Expected: a ParamInit that gives every parameter its "
                    "initial value. Fix: opts.param_init = fsdp::default_param_init(seed) (fsdp/param_init.h), "
                    "or build the model without DeferredInit.");
    // Rank 0's values, everywhere (sync_module_states): one broadcast per unit.
    auto flat = torch::zeros({padded_numel}, torch::TensorOptions(torch::kFloat32).device(device));
    for (auto& s : params_) flat.narrow(0, s.offset, s.numel).copy_(s.param.detach().reshape(-1));
    // Over the whole world (owner->comm): HYBRID's replicas start equal too.
    if (opts.sync_module_states && owner->world() > 1 && numel > 0)
      owner->comm->broadcast(flat, 0, {"sync_module_states " + display_name()})->wait();
    if (home.defined()) shard = home.copy_(flat.narrow(0, shard_begin, shard_numel));
    else shard = keeps_unsharded ? flat : flat.narrow(0, shard_begin, shard_numel).clone();
  }
  if (!host_shared)
    full = full_is_shard ? shard : torch::empty({padded_numel}, torch::TensorOptions(param_dtype).device(device));
  // NO_SHARD keeps the unsharded copy (shard is the whole flat buffer); the
  // sharded strategies free `full` below, so its values do not matter.
  if (!full_is_shard && keeps_unsharded) full.copy_(shard);

  for (auto& s : params_) {
    // set_data keeps the parameter's TensorImpl (modules hold it as a member)
    // but points it at `full`; a dtype change here drops the accumulator, so
    // the accumulator is taken only afterwards.
    s.param.set_data(storage_slice(full, s.offset, s.shape));
    const shard::Range r{s.lo, s.hi};  // laid out by the constructor
    s.shard_view = r.empty() ? storage_slice(shard, 0, {0}) : storage_slice(shard, s.offset + r.lo - shard_begin, {r.size()});
    s.shard_view.requires_grad_(s.requires_grad);
    if (s.requires_grad) {
      s.accumulator = compat::grad_accumulator(s.param);
      compat::add_post_hook(s.accumulator, [this] { owner->on_grad_ready(*this); });
    }
  }
  if (keeps_unsharded) {
    state_ = UnitState::UNSHARDED;
  } else if (host_shared) {
    state_ = UnitState::SHARDED;  // resident, not yet gathered: the first unshard is a barrier
  } else {
    compat::free_storage(full);
    state_ = UnitState::SHARDED;
  }
}

// Sharded construction: each original parameter is made once at full size
// (fp32), initialised by `init` from its name, and only this rank's slice
// kept; so a unit never exists unsharded here, and the ranks need no
// broadcast (the values are a function of the names). What they must agree
// on is checked instead: one checksum of the unit's full values per rank.
// `home`, when defined, is zeroed memory that becomes the shard (its slice
// of the host's shared copy); otherwise the shard is allocated here.
void Unit::init_shard_from(const ParamInit& init, const InitTargetOf& target_of, const torch::Tensor& home) {
  // Every rank of the world computes every value (HYBRID's replicas too), so
  // the check runs over the world, not only the shard group.
  Communicator& world = *owner->comm;
  const int N = world.world_size();
  shard = home.defined() ? home  // zeroed shared memory (Communicator::shared_tensor), untouched until written
                         : torch::zeros({keeps_unsharded ? padded_numel : shard_numel},
                                        torch::TensorOptions(torch::kFloat32).device(device));
  // Values that a checkpoint gives right after wrapping: zeros are the
  // shard as it is; nothing to compute or to agree on.
  if (is_zeros_for_loading(init)) return;
  uint64_t sum = 0;  // integer sums of the values' bits (mod 2^64): the same on every rank that agrees
  // One buffer of the largest parameter's size holds each full value in turn.
  int64_t largest = 0;
  for (auto& s : params_) largest = std::max(largest, s.numel);
  torch::Tensor buffer = torch::empty({largest}, torch::kFloat32);
  for (auto& s : params_) {
    const InitTarget target = target_of(s);
    torch::Tensor value = buffer.narrow(0, 0, s.numel).view(s.shape);
    init(target, value);
    FSDP_USER_CHECK(value.sizes().vec() == s.shape && value.scalar_type() == torch::kFloat32,
                    "param_init changed the shape or dtype of '", s.name, "'; expected it to write in place");
    sum += static_cast<uint64_t>(value.view(torch::kInt32).sum(torch::kLong).item<int64_t>()) *
           static_cast<uint64_t>(1 + s.offset % 7919);
    const shard::Range r = shard::param_range(s.offset, s.numel, shard_begin, shard_numel);
    if (!r.empty())
      shard.narrow(0, s.offset + r.lo - shard_begin, r.size()).copy_(value.view({-1}).narrow(0, r.lo, r.size()));
  }
  if (N <= 1 || numel == 0) return;
  // Three exact 21-bit pieces of the sum, gathered from every rank.
  auto mine = torch::empty({3}, torch::kFloat32);
  const uint64_t u = sum;
  for (int k = 0; k < 3; k++) mine[k] = static_cast<float>((u >> (21 * k)) & 0x1fffff);
  auto all = torch::empty({3 * N}, torch::kFloat32);
  world.all_gather(mine, all, {"param_init check " + display_name()})->wait();
  auto a = all.view({N, 3});
  std::vector<int> differ;
  for (int r = 1; r < N; r++)
    if (!a[r].equal(a[0])) differ.push_back(r);
  if (!differ.empty()) {
    std::string ranks;
    for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    throw Error("param_init gave unit '" + display_name() + "' different values on different ranks (ranks " + ranks +
                " differ from rank 0). Expected: initial values that depend only on the tensor's name and a "
                "seed. Fix: draw from fsdp::init_generator(seed, target.name) (fsdp/param_init.h), not from "
                "the global generator.");
  }
}

}  // namespace fsdp::detail
