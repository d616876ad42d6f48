// fsdp-cpp: FullyShardedModel — the public face of the engine.
#include <cmath>
#include <iomanip>
#include <sstream>
#include <unordered_set>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "compat/torch_compat.h"
#include "fsdp/deferred.h"
#include "fsdp/device.h"
#include "fsdp/memory.h"
#include "unit/engine.h"
#include "unit/engine_access.h"
#include "wrap/wrap.h"

namespace fsdp {
namespace detail {

std::string explain_oom(const Engine& st, int64_t requested, const memory::Stats& s);  // oom.cpp
std::vector<std::pair<InitTarget, torch::Tensor>> init_targets(torch::nn::Module& root, bool buffers);  // param_init.cpp

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
  WrapDescription wrap = describe_new_wrap(*root, opts.wrap);
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

}  // namespace detail

using detail::Engine;
using detail::Unit;

FullyShardedModel::FullyShardedModel(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FsdpOptions opts)
    : engine_(std::make_unique<Engine>(std::move(root), std::move(comm), std::move(opts))) {}

FullyShardedModel::~FullyShardedModel() = default;

std::vector<torch::Tensor> FullyShardedModel::parameters() const {
  std::vector<torch::Tensor> out;
  std::unordered_set<const detail::ParamSlot*> seen;
  for (auto& [name, slot] : engine_->named_slots)
    if (seen.insert(slot).second) out.push_back(slot->shard_view);
  return out;
}

std::vector<NamedShard> FullyShardedModel::named_shards() const {
  std::vector<NamedShard> out;
  std::unordered_set<const detail::ParamSlot*> seen;
  for (auto& [name, slot] : engine_->named_slots) {
    if (!seen.insert(slot).second) continue;
    int unit = 0;
    for (auto& u : engine_->units)
      if (&u->params().front() <= slot && slot <= &u->params().back()) unit = u->index;
    out.push_back({slot->name, slot->shape, slot->lo, slot->hi, unit, slot->shard_view});
  }
  return out;
}

FullyShardedModel::NoSyncGuard::NoSyncGuard(FullyShardedModel* m) : m_(m), prev_(m->engine_->no_sync) {
  m_->engine_->no_sync = true;
}
FullyShardedModel::NoSyncGuard::~NoSyncGuard() {
  if (m_) m_->engine_->no_sync = prev_;
}

void FullyShardedModel::wait_pending() { engine_->wait_pending(); }

double FullyShardedModel::clip_grad_norm(double max_norm, double norm_type) {
  FSDP_USER_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, found ", max_norm);
  FSDP_USER_CHECK(norm_type == 2.0 || std::isinf(norm_type),
                  "clip_grad_norm: norm_type must be 2 or infinity, found ", norm_type);
  engine_->wait_pending();
  FSDP_TRACE_SPAN("clip_grad_norm", "optim");
  torch::NoGradGuard ng;
  const bool replicated = engine_->opts.strategy == ShardingStrategy::NO_SHARD;
  const bool inf = std::isinf(norm_type);
  // On the shards' device, with no host sync per unit: each unit's sum of
  // squares (max) in fp32, accumulated in fp64 in unit order (the same
  // additions the host did before, so the same bits), one all-reduce over
  // the group, and one read of the result.
  const auto f64 = torch::TensorOptions(torch::kFloat64).device(engine_->opts.device);
  torch::Tensor local = torch::zeros({}, f64);
  for (auto& u : engine_->units) {
    if (!u->shard_grad.defined()) continue;
    const auto& g = u->shard_grad;
    local = inf ? torch::maximum(local, g.abs().max().to(torch::kFloat64)) : local + g.pow(2).sum().to(torch::kFloat64);
  }
  double total = 0;
  // Over the shard group: HYBRID's replicas hold the same shards (their
  // gradients all-reduced), so summing over all N ranks would count each
  // element R times; every group computes the same norm.
  Communicator& group = *engine_->shard_comm;
  if (!replicated && group.world_size() > 1) {
    auto in = local.to(torch::kFloat32).reshape({1});
    if (inf) {
      auto all = torch::empty({group.world_size()}, in.options());
      group.all_gather(in, all, {"clip_grad_norm"})->wait();
      total = all.max().item<double>();
    } else {
      group.all_reduce(in, ReduceOp::SUM, {"clip_grad_norm"})->wait();
      total = in.item<double>();
    }
  } else {
    total = local.item<double>();
  }
  double norm = inf ? total : std::sqrt(total);
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (auto& u : engine_->units)
      if (u->shard_grad.defined()) u->shard_grad.mul_(coef);
  return norm;
}

std::vector<UnitInfo> FullyShardedModel::units() const {
  std::vector<UnitInfo> out;
  for (auto& u : engine_->units) {
    UnitInfo i;
    i.index = u->index;
    i.name = u->name;
    for (auto& s : u->params()) i.param_names.push_back(s.name);
    i.numel = u->numel;
    i.padded_numel = u->padded_numel;
    i.shard_numel = u->shard_numel;
    i.unsharded_bytes = u->padded_numel * static_cast<int64_t>(c10::elementSize(u->param_dtype));
    i.shard_bytes = u->shard_numel * 4;
    out.push_back(std::move(i));
  }
  return out;
}

std::string FullyShardedModel::describe_units() const {
  std::ostringstream os;
  os << "FSDP units (" << to_string(engine_->opts.strategy) << ", world " << engine_->world()
     << ", wrap: " << engine_->opts.wrap.description << ")\n";
  os << std::left << std::setw(4) << "#" << std::setw(22) << "unit" << std::right << std::setw(12)
     << "params" << std::setw(12) << "padded" << std::setw(12) << "shard" << std::setw(14) << "unsharded"
     << "\n";
  for (auto& i : units())
    os << std::left << std::setw(4) << i.index << std::setw(22) << (i.name.empty() ? "<root>" : i.name)
       << std::right << std::setw(12) << i.numel << std::setw(12) << i.padded_numel << std::setw(12)
       << i.shard_numel << std::setw(14) << memory::format_bytes(i.unsharded_bytes) << "\n";
  return os.str();
}

namespace {
int64_t tensor_bytes(const torch::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

int64_t optimizer_state_bytes(const torch::optim::Optimizer& opt, const torch::Tensor& p) {
  auto it = opt.state().find(compat::optimizer_state_key(p));
  if (it == opt.state().end()) return 0;
  const auto* st = it->second.get();
  if (auto* a = dynamic_cast<const torch::optim::AdamParamState*>(st))
    return tensor_bytes(a->exp_avg()) + tensor_bytes(a->exp_avg_sq()) + tensor_bytes(a->max_exp_avg_sq());
  if (auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(st))
    return tensor_bytes(a->exp_avg()) + tensor_bytes(a->exp_avg_sq()) + tensor_bytes(a->max_exp_avg_sq());
  if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(st)) return tensor_bytes(s->momentum_buffer());
  if (auto* r = dynamic_cast<const torch::optim::RMSpropParamState*>(st))
    return tensor_bytes(r->square_avg()) + tensor_bytes(r->momentum_buffer()) + tensor_bytes(r->grad_avg());
  if (auto* g = dynamic_cast<const torch::optim::AdagradParamState*>(st)) return tensor_bytes(g->sum());
  return 0;
}
}  // namespace

Ledger FullyShardedModel::ledger(const torch::optim::Optimizer* opt) const {
  engine_->wait_pending();
  Ledger l;
  l.world_size = engine_->world();
  l.strategy = to_string(engine_->opts.strategy);
  for (auto& u : engine_->units) {
    l.total_numel += u->numel;
    l.P_full += u->numel * 4;
    l.P += tensor_bytes(u->shard);
    if (u->keeps_unsharded && !u->aliased) l.P += tensor_bytes(u->full);
    l.G += tensor_bytes(u->shard_grad);
    const int64_t block = u->padded_numel * static_cast<int64_t>(c10::elementSize(u->param_dtype));
    if (block > l.P_block) {
      l.P_block = block;
      l.P_block_unit = u->display_name();
    }
    if (opt)
      for (auto& s : u->params()) l.O += optimizer_state_bytes(*opt, s.shard_view);
  }
  l.A = engine_->activation_bytes;
  l.A_recompute = engine_->recompute_bytes;
  l.C = engine_->snapshot_bytes;
  const detail::MemoryReading ms = engine_->memory_source->read();
  l.memory_source = engine_->memory_source->name();
  l.peak = ms.peak;
  l.current = ms.current;
  l.cached = ms.cached;
  l.process = memory::process_memory();
  l.rss_peak = l.process.vmhwm;
  const CommCounters sent = engine_->comm->counters();
  l.sent_intra_host = sent.total_bytes_intra_host();
  l.sent_inter_host = sent.total_bytes_inter_host();
  l.shard_group_size = engine_->shard_world();
  const int64_t N = engine_->shard_world();  // HYBRID: the shard group's S
  int64_t padded_bytes = 0;
  for (auto& u : engine_->units) padded_bytes += u->padded_numel * 4;
  // The FSDP guide's formulas with this run's sizes: G = P, O as measured (Adam: 2P).
  const double o_ratio = l.P > 0 ? double(l.O) / double(l.P) : 0.0;
  if (engine_->opts.strategy == ShardingStrategy::NO_SHARD) {
    l.predicted_rest = l.P + l.G + l.O;
    // + the unsharded gradient buffer being filled and reduced.
    l.predicted_peak = l.predicted_rest + l.P_block + l.A + l.A_recompute + l.C;
  } else {
    l.predicted_rest = static_cast<int64_t>(padded_bytes * (2.0 + o_ratio)) / N;
    const int in_flight = (engine_->opts.forward_prefetch || engine_->opts.backward_prefetch != BackwardPrefetch::NONE)
                              ? engine_->opts.limit_all_gathers
                              : 1;
    // Resting state + the units unsharded at once + the unsharded gradient
    // of the unit in backward (same size as its parameters) + activations.
    // (+ one recompute's activations with activation checkpointing.)
    // (+ a background checkpoint's snapshot, held while training goes on.)
    l.predicted_peak = l.predicted_rest + (in_flight + 1) * l.P_block + l.A + l.A_recompute + l.C;
  }
  trace::set_metadata("ledger", {{"P_full", l.P_full}, {"P", l.P}, {"G", l.G}, {"O", l.O}, {"P_block", l.P_block},
                                 {"P_block_unit", l.P_block_unit}, {"A", l.A}, {"A_recompute", l.A_recompute}, {"C", l.C},
                                 {"predicted_rest", l.predicted_rest},
                                 {"predicted_peak", l.predicted_peak}});
  if (l.process.at_start > 0) {
    const memory::ProcessMemory& m = l.process;
    trace::set_metadata("process_memory", {{"vmhwm", m.vmhwm}, {"at_start", m.at_start}, {"code_since", m.code_since},
                                           {"tensors", m.tensors}, {"comm", m.comm}, {"cache", m.cache},
                                           {"malloc_used", m.malloc_other}, {"malloc_free", m.malloc_free},
                                           {"unexplained", m.unexplained}, {"sample", m.sample},
                                           {"elsewhere", m.elsewhere}, {"comm_high", m.comm_high}});
  }
  return l;
}

std::string Ledger::str() const {
  using memory::format_bytes;
  std::ostringstream os;
  auto row = [&](const std::string& k, int64_t v, const std::string& note) {
    os << "  " << std::left << std::setw(10) << k << std::right << std::setw(14) << format_bytes(v) << "   "
       << note << "\n";
  };
  os << "ledger (this rank, " << strategy << ", N=" << world_size
     << (shard_group_size > 0 && shard_group_size < world_size ? ", shard group S=" + std::to_string(shard_group_size)
                                                               : std::string())
     << ", " << total_numel << " params)\n";
  row("P_full", P_full, "unsharded parameters (fp32)");
  row("P", P, "parameters resident here (shards; replicas for NO_SHARD)");
  row("G", G, "gradients resident here");
  row("O", O, "optimizer state here");
  // HYBRID shards over its group: the guide's divisor is S there.
  const std::string div = shard_group_size > 0 && shard_group_size < world_size ? "S" : "N";
  row("P+G+O", P + G + O, "model state at rest  | guide: (P+G+O)/" + div + " = " + format_bytes(predicted_rest));
  row("P_block", P_block, "largest unit unsharded: '" + P_block_unit + "'");
  row("A", A, "activations of the last forward (measured)");
  if (A_recompute > 0) row("A_recomp", A_recompute, "activations of one recompute in backward (activation checkpointing)");
  if (C > 0) row("C", C, "snapshot of the last background checkpoint save, held while it writes");
  row("peak", peak, "measured peak (" + memory_source + ") | guide: (P+G+O)/" + div + " + P_block (+ its grad) + A" +
                        (A_recompute > 0 ? " + A_recomp" : "") + (C > 0 ? " + C" : "") + " = " +
                        format_bytes(predicted_peak));
  row("cached", cached, "freed blocks the allocator keeps for reuse (not in the terms above)");
  if (rss_peak > 0 && process.at_start > 0)
    row("VmHWM", rss_peak,
        "the process's resident high-water mark: " + format_bytes(process.at_start) + " at start (libtorch), " +
            format_bytes(process.tensors + process.comm + process.cache) + " allocator (tensors, comm, cache), " +
            format_bytes(process.fixed() - process.at_start) + " else");
  else if (rss_peak > 0)
    row("VmHWM", rss_peak, "the process's resident high-water mark (libraries, cache included)");
  row("sent", sent_intra_host + sent_inter_host,
      "bytes sent so far by tier: intra-host " + format_bytes(sent_intra_host) + ", inter-host " +
          format_bytes(sent_inter_host));
  return os.str();
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedModel::full_state(int to_rank) const {
  engine_->wait_pending();
  torch::NoGradGuard ng;
  const int r = engine_->rank();
  const bool keep = to_rank < 0 || r == to_rank;
  std::unordered_map<const detail::ParamSlot*, torch::Tensor> values;
  for (auto& u : engine_->units) {
    if (u->empty()) continue;
    torch::Tensor full = detail::gather_flat(*u, u->shard, to_rank, "full_state");
    if (keep)
      for (auto& s : u->params()) values[&s] = full.narrow(0, s.offset, s.numel).view(s.shape).clone();
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (!keep) return out;
  for (auto& [name, slot] : engine_->named_slots) out.emplace_back(name, values.at(slot));
  for (auto& b : engine_->root->named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value().clone());
  return out;
}

namespace detail {

EngineAccess::EngineAccess(const FullyShardedModel& m) : engine_(m.engine_.get()) {}
std::vector<const Unit*> EngineAccess::units() const {
  std::vector<const Unit*> out;
  out.reserve(engine_->units.size());
  for (auto& u : engine_->units) out.push_back(u.get());
  return out;
}
std::vector<const ParamSlot*> EngineAccess::slots() const {
  std::vector<const ParamSlot*> out;
  std::unordered_set<const ParamSlot*> seen;
  for (auto& [name, slot] : engine_->named_slots)
    if (seen.insert(slot).second) out.push_back(slot);
  return out;
}
void EngineAccess::finish_pending_reductions() const { engine_->wait_pending(); }

CommPtr EngineAccess::checkpoint_comm() const {
  if (!engine_->checkpoint_comm)
    engine_->checkpoint_comm = engine_->comm->split(0, {"checkpoint", std::chrono::milliseconds(0)});
  return engine_->checkpoint_comm;
}

std::unique_ptr<ckpt::BackgroundSave> EngineAccess::take_background_save() const {
  return std::move(engine_->background_save);
}

void EngineAccess::keep_background_save(std::unique_ptr<ckpt::BackgroundSave> s) const {
  FSDP_CHECK(!engine_->background_save, "a background save is kept already");
  engine_->snapshot_bytes = s->snapshot_bytes();
  engine_->background_save = std::move(s);
}

void EngineAccess::wait_for_snapshot() const { engine_->wait_for_snapshot(); }

void EngineAccess::use_memory_source(std::unique_ptr<MemorySource> source) const {
  FSDP_CHECK(source != nullptr, "use_memory_source: a null source");
  engine_->memory_source = std::move(source);
}

}  // namespace detail

const FsdpOptions& FullyShardedModel::options() const { return engine_->opts; }
const CommPtr& FullyShardedModel::comm() const { return engine_->comm; }
const CommPtr& FullyShardedModel::shard_group() const { return engine_->shard_comm; }
const CommPtr& FullyShardedModel::replica_group() const { return engine_->replica_comm; }
torch::nn::Module& FullyShardedModel::module() const { return *engine_->root; }

void verify_optimizer(const FullyShardedModel& model, const torch::optim::Optimizer& opt) {
  std::unordered_set<const c10::TensorImpl*> ours, originals;
  for (auto& t : model.parameters()) ours.insert(t.unsafeGetTensorImpl());
  for (auto& p : model.module().parameters()) originals.insert(p.unsafeGetTensorImpl());
  int64_t foreign = 0, unwrapped = 0, total = 0;
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) {
      ++total;
      if (ours.count(p.unsafeGetTensorImpl())) continue;
      if (originals.count(p.unsafeGetTensorImpl())) ++unwrapped;
      else ++foreign;
    }
  if (unwrapped)
    throw Error("the optimizer holds " + std::to_string(unwrapped) + " of the unwrapped model's parameters: "
                "FSDP frees those between steps, so it would train nothing. Expected: an optimizer built on "
                "the wrapped model's shards. Fix: torch::optim::AdamW opt(model->parameters(), ...) (or "
                "groups from model->named_shards()).");
  if (foreign)
    throw Error("the optimizer holds " + std::to_string(foreign) + " tensors that are not this model's shards "
                "(of " + std::to_string(total) + "). Fix: build it from model->parameters().");
}

}  // namespace fsdp
