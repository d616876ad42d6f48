// fsdp-cpp: Engine — one wrapped model's construction: the arguments
// checked, the groups made, the wrap described and materialised into units,
// the units' tensors filled, and the engine's entries in the process's tables.
//
// defines: Engine::check, Engine::Engine, Engine::build_units,
//          Engine::name_slots, Engine::Registration, Engine::publish_trace_metadata
//
// The constant members are made by the constructor's initializers, in their
// order (engine.h); the body then fills the units' tensors (layout.cpp) and
// the buffers. Nothing is registered anywhere until the last line, so a
// construction that throws leaves nothing behind.
#include <unordered_map>
#include <unordered_set>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "fsdp/deferred.h"
#include "fsdp/device.h"
#include "fsdp/memory.h"
#include "unit/engine.h"
#include "wrap/wrap.h"

namespace fsdp::detail {

std::string explain_oom(const Engine& st, int64_t requested, const memory::Stats& s);  // oom.cpp
std::vector<std::pair<InitTarget, torch::Tensor>> init_targets(torch::nn::Module& root, bool buffers);  // param_init.cpp

namespace {

// A module can be in one wrapped model only (its unit registry entry would
// be overwritten, its parameters sharded twice).
void check_not_wrapped(torch::nn::Module& root) {
  for (const auto& m : root.named_modules(/*name_prefix=*/"", /*include_self=*/true))
    if (unit_of(m.value().get()))
      throw Error("module '" + (m.key().empty() ? std::string("<root>") : m.key()) +
                  "' is already part of a fully_shard()ed model: wrap a model once, at its root, "
                  "and let the wrap policy choose the units inside it");
}

// One Unit per description; the constructor lays its parameter slots out
// back to back in the flat buffer (offsets; padding comes with the shard).
std::unique_ptr<Unit> materialise(const UnitDesc& d, int index, Engine* owner,
                                  const std::vector<std::unique_ptr<Unit>>& earlier) {
  Unit* parent = d.parent >= 0 ? earlier[d.parent].get() : nullptr;
  std::vector<ParamSlot> slots;
  slots.reserve(d.params.size());
  for (auto& p : d.params) {
    ParamSlot s;
    s.name = p.name;
    s.tied_names = p.tied_names;
    s.param = p.tensor;
    slots.push_back(std::move(s));
  }
  return std::make_unique<Unit>(index, d.name, d.module, parent, owner,
                                owner->shard_comm.get(),  // HYBRID: the shard group
                                std::move(slots), owner->opts);
}

}  // namespace

struct Engine::Checked {
  std::shared_ptr<torch::nn::Module> root;
  CommPtr comm;
  FsdpOptions opts;
  Groups groups;
  WrapDescription wrap;
};

Engine::Checked Engine::check(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FsdpOptions opts) {
  FSDP_USER_CHECK(root, "fully_shard: the module is null");
  FSDP_USER_CHECK(comm, "fully_shard: the communicator is null (use fsdp::make_communicator_from_env())");
  opts = adopt_deprecated_checkpoint(std::move(opts));
  opts.validate();
  // The one place the device is resolved: "cuda" is this rank's GPU.
  if (opts.device.is_cuda() && !opts.device.has_index())
    opts.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(comm->local_rank()));
  require_device(opts.device, "FsdpOptions::device");
  // The constructing thread's current CUDA device becomes the job's (as
  // torch.cuda.set_device): what this rank allocates without naming a
  // device (pinned staging buffers, the CUDA context itself) then lands on
  // its own GPU, not every rank's on cuda:0. The one thread-wide setting
  // fsdp-cpp makes, and only for a CUDA device the program named
  // (docs/DESIGN.md, "Process-wide state").
  if (opts.device.is_cuda()) c10::impl::VirtualGuardImpl(opts.device.type()).setDevice(opts.device);
  Groups groups = make_groups(comm, opts);
  check_not_wrapped(*root);
  WrapDescription wrap = describe_wrap(*root, opts.wrap);
  return {std::move(root), std::move(comm), std::move(opts), std::move(groups), std::move(wrap)};
}

Engine::Engine(std::shared_ptr<torch::nn::Module> root_, CommPtr comm_, FsdpOptions opts_)
    : Engine(check(std::move(root_), std::move(comm_), std::move(opts_))) {}

// The constant members, in their order: each initializer may read the ones
// above it (build_units reads opts and shard_comm; build_recompute_sites the
// units). The body then fills the units' tensors and the buffers.
Engine::Engine(Checked c)
    : root(std::move(c.root)),
      comm(std::move(c.comm)),
      opts(std::move(c.opts)),
      shard_comm(std::move(c.groups.shard)),
      replica_comm(std::move(c.groups.replica)),
      units(build_units(c.wrap)),
      named_slots(name_slots(c.wrap, units)),
      recompute_sites(build_recompute_sites()) {
  // What a ParamInit sees for each slot: its canonical name, its module.
  std::unordered_map<std::string, InitTarget> targets;
  if (opts.param_init)
    for (auto& [t, tensor] : init_targets(*root, /*buffers=*/false)) targets.emplace(t.name, t);
  const InitTargetOf target_of = [&](const ParamSlot& s) { return targets.at(s.name); };
  for (auto& u : units) u->init_flat_param(opts, target_of);
  // Buffers are replicated: made and initialised in full by param_init, or
  // rank 0's values everywhere; cast if asked.
  torch::NoGradGuard ng;
  if (opts.param_init) {
    std::unordered_set<const c10::TensorImpl*> done;
    for (auto& [t, b] : init_targets(*root, /*buffers=*/true)) {
      if (!b.defined() || !done.insert(b.unsafeGetTensorImpl()).second) continue;
      auto value = torch::empty(b.sizes(), b.options().memory_format(at::MemoryFormat::Contiguous));
      opts.param_init(t, value);
      b.set_data(value);
    }
  }
  for (auto& b : root->named_buffers(/*recurse=*/true)) {
    torch::Tensor t = b.value();
    if (!is_deferred(t) && t.device() != opts.device) t.set_data(t.to(opts.device));
    if (is_deferred(t))
      throw Error("buffer '" + b.key() + "' was built under fsdp::DeferredInit (it has no values yet), but "
                  "FsdpOptions::param_init is empty. Expected: a ParamInit for every parameter and buffer. Fix: "
                  "opts.param_init = fsdp::default_param_init(seed), or build the model without DeferredInit.");
    if (!opts.param_init && opts.sync_module_states && world() > 1 && t.numel() > 0) {
      auto tmp = t.contiguous().clone();
      comm->broadcast(tmp, 0, {"sync_module_states buffer " + b.key()})->wait();
      t.copy_(tmp);
    }
    if (opts.mixed_precision.buffer_dtype && t.is_floating_point())
      t.set_data(t.to(*opts.mixed_precision.buffer_dtype));
  }
  publish_trace_metadata();
  // The ledger's peak is about training: forget the wrap-time transients
  // (the original parameters, the broadcast buffers).
  memory_source->reset_peak();
  registration_.emplace(*this);  // last: nothing below may throw
}

Engine::Registration::Registration(Engine& engine) : e(engine) {
  for (auto& u : e.units) register_unit(u->module, u.get());
  e.register_recompute_sites();
  memory::set_oom_explainer([&eng = e](int64_t n, const memory::Stats& s) { return explain_oom(eng, n, s); });
}

Engine::Registration::~Registration() {
  memory::set_oom_explainer(nullptr);
  e.unregister_recompute_sites();
  for (auto& u : e.units) unregister_unit(u->module);
}

void Engine::publish_trace_metadata() const {
  nlohmann::json us = nlohmann::json::array();
  for (auto& u : units) {
    nlohmann::json ps = nlohmann::json::array();
    for (auto& s : u->params()) ps.push_back({{"name", s.name}, {"shape", s.shape}, {"offset", s.offset}, {"numel", s.numel}});
    const int64_t pb = static_cast<int64_t>(c10::elementSize(u->param_dtype));
    us.push_back({{"index", u->index}, {"name", u->name}, {"numel", u->numel}, {"padded_numel", u->padded_numel},
                  {"shard_numel", u->shard_numel}, {"unsharded_bytes", u->padded_numel * pb},
                  {"shard_bytes", u->shard_numel * 4}, {"params", ps}});
  }
  const auto pd = opts.mixed_precision.param_dtype.value_or(torch::kFloat32);
  const auto rd = opts.mixed_precision.reduce_dtype.value_or(pd);
  trace::set_metadata("units", us);
  trace::set_metadata("strategy", to_string(opts.strategy));
  // HYBRID: the units' shards are over the group; the report groups ranks by host.
  trace::set_metadata("shard_group_size", shard_world());
  trace::set_metadata("hosts", comm->hosts());
  trace::set_metadata("param_dtype", pd == torch::kFloat32 ? "fp32" : pd == torch::kBFloat16 ? "bf16" : "fp16");
  trace::set_metadata("param_bytes_per_elem", static_cast<int>(c10::elementSize(pd)));
  trace::set_metadata("master_bytes_per_elem", 4);
  trace::set_metadata("reduce_bytes_per_elem", static_cast<int>(c10::elementSize(rd)));
}

Engine::~Engine() = default;  // registration_ goes first (engine.h)

std::vector<std::unique_ptr<Unit>> Engine::build_units(const WrapDescription& d) {
  std::vector<std::unique_ptr<Unit>> built;
  for (size_t i = 0; i < d.units.size(); ++i) built.push_back(materialise(d.units[i], static_cast<int>(i), this, built));
  return built;
}

std::vector<std::pair<std::string, const ParamSlot*>> Engine::name_slots(
    const WrapDescription& d, const std::vector<std::unique_ptr<Unit>>& built) {
  std::vector<std::pair<std::string, const ParamSlot*>> named;
  named.reserve(d.named.size());
  for (auto& n : d.named) named.emplace_back(n.name, &built[n.unit]->params()[n.param]);
  return named;
}

}  // namespace fsdp::detail
