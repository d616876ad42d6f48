// fsdp-cpp: the table of optimizer kinds (see optimizer_state.h), and
// verify_optimizer, which refuses what cannot train on this model's shards.
#include "optim/optimizer_state.h"

#include <unordered_set>

#include "compat/torch_compat.h"
#include "fsdp/fully_shard.h"

namespace fsdp::detail {
namespace {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;

int64_t tensor_bytes(const torch::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

template <class Opt>
bool is(const torch::optim::Optimizer& opt) {
  return dynamic_cast<const Opt*>(&opt) != nullptr;
}

// --- Adam and AdamW: the same state, their own types ---

template <class Options>
optim_table::Settings adam_settings(const OptimizerOptions& o) {
  optim_table::Settings s;
  s.amsgrad = static_cast<const Options&>(o).amsgrad();
  return s;
}
template <class State>
torch::Tensor adam_tensor(const OptimizerParamState& st, const std::string& name) {
  auto& a = static_cast<const State&>(st);
  if (name == "exp_avg") return a.exp_avg();
  if (name == "exp_avg_sq") return a.exp_avg_sq();
  if (name == "max_exp_avg_sq") return a.max_exp_avg_sq();
  return {};
}
template <class State>
int64_t adam_step(const OptimizerParamState& st) {
  return static_cast<const State&>(st).step();
}
template <class Options, class State>
std::unique_ptr<OptimizerParamState> adam_make(const OptimizerOptions& o, int64_t step, const TensorOf& get) {
  auto a = std::make_unique<State>();
  a->step(step).exp_avg(get("exp_avg")).exp_avg_sq(get("exp_avg_sq"));
  if (static_cast<const Options&>(o).amsgrad()) a->max_exp_avg_sq(get("max_exp_avg_sq"));
  return a;
}
template <class Options>
nlohmann::json adam_hyper(const OptimizerOptions& opts) {
  auto& o = static_cast<const Options&>(opts);
  return {{"lr", o.lr()}, {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}}, {"eps", o.eps()},
          {"weight_decay", o.weight_decay()}, {"amsgrad", o.amsgrad()}};
}

// --- SGD: a momentum buffer, saved (zeros) even without momentum, as
// checkpoints always have ---

optim_table::Settings sgd_settings(const OptimizerOptions& o) {
  optim_table::Settings s;
  s.momentum = static_cast<const torch::optim::SGDOptions&>(o).momentum() > 0;
  return s;
}
torch::Tensor sgd_tensor(const OptimizerParamState& st, const std::string& name) {
  return name == "momentum_buffer" ? static_cast<const torch::optim::SGDParamState&>(st).momentum_buffer()
                                   : torch::Tensor();
}
int64_t no_step(const OptimizerParamState&) { return 0; }
std::unique_ptr<OptimizerParamState> sgd_make(const OptimizerOptions&, int64_t, const TensorOf& get) {
  auto s = std::make_unique<torch::optim::SGDParamState>();
  s->momentum_buffer(get("momentum_buffer"));
  return s;
}
nlohmann::json sgd_hyper(const OptimizerOptions& opts) {
  auto& o = static_cast<const torch::optim::SGDOptions&>(opts);
  return {{"lr", o.lr()}, {"momentum", o.momentum()}, {"dampening", o.dampening()},
          {"weight_decay", o.weight_decay()}, {"nesterov", o.nesterov()}};
}

// --- Adagrad: the sum of squared gradients (made by its constructor, filled
// with initial_accumulator_value) ---

optim_table::Settings no_settings(const OptimizerOptions&) { return {}; }
torch::Tensor adagrad_tensor(const OptimizerParamState& st, const std::string& name) {
  return name == "sum" ? static_cast<const torch::optim::AdagradParamState&>(st).sum() : torch::Tensor();
}
int64_t adagrad_step(const OptimizerParamState& st) {
  return static_cast<const torch::optim::AdagradParamState&>(st).step();
}
std::unique_ptr<OptimizerParamState> adagrad_make(const OptimizerOptions&, int64_t step, const TensorOf& get) {
  auto a = std::make_unique<torch::optim::AdagradParamState>();
  a->step(step).sum(get("sum"));
  return a;
}
nlohmann::json adagrad_hyper(const OptimizerOptions& opts) {
  auto& o = static_cast<const torch::optim::AdagradOptions&>(opts);
  return {{"lr", o.lr()}, {"lr_decay", o.lr_decay()}, {"weight_decay", o.weight_decay()},
          {"initial_accumulator_value", o.initial_accumulator_value()}, {"eps", o.eps()}};
}

// --- RMSprop: the running mean of squares, a momentum buffer with momentum,
// the running mean of gradients when centered (as its step makes them) ---

optim_table::Settings rmsprop_settings(const OptimizerOptions& opts) {
  auto& o = static_cast<const torch::optim::RMSpropOptions&>(opts);
  optim_table::Settings s;
  s.momentum = o.momentum() > 0;
  s.centered = o.centered();
  return s;
}
torch::Tensor rmsprop_tensor(const OptimizerParamState& st, const std::string& name) {
  auto& r = static_cast<const torch::optim::RMSpropParamState&>(st);
  if (name == "square_avg") return r.square_avg();
  if (name == "momentum_buffer") return r.momentum_buffer();
  if (name == "grad_avg") return r.grad_avg();
  return {};
}
int64_t rmsprop_step(const OptimizerParamState& st) {
  return static_cast<const torch::optim::RMSpropParamState&>(st).step();
}
std::unique_ptr<OptimizerParamState> rmsprop_make(const OptimizerOptions& opts, int64_t step, const TensorOf& get) {
  auto& o = static_cast<const torch::optim::RMSpropOptions&>(opts);
  auto r = std::make_unique<torch::optim::RMSpropParamState>();
  r->step(step).square_avg(get("square_avg"));
  if (o.momentum() > 0) r->momentum_buffer(get("momentum_buffer"));
  if (o.centered()) r->grad_avg(get("grad_avg"));
  return r;
}
nlohmann::json rmsprop_hyper(const OptimizerOptions& opts) {
  auto& o = static_cast<const torch::optim::RMSpropOptions&>(opts);
  return {{"lr", o.lr()}, {"alpha", o.alpha()}, {"eps", o.eps()}, {"weight_decay", o.weight_decay()},
          {"momentum", o.momentum()}, {"centered", o.centered()}};
}

// --- LBFGS: one state (keyed by the first parameter) for the whole model ---

torch::Tensor no_tensor(const OptimizerParamState&, const std::string&) { return {}; }
std::unique_ptr<OptimizerParamState> no_make(const OptimizerOptions&, int64_t, const TensorOf&) { return nullptr; }
nlohmann::json no_hyper(const OptimizerOptions&) { return nlohmann::json::object(); }
int64_t lbfgs_bytes(const OptimizerParamState& st) {
  auto& l = static_cast<const torch::optim::LBFGSParamState&>(st);
  int64_t n = tensor_bytes(l.d()) + tensor_bytes(l.H_diag()) + tensor_bytes(l.prev_flat_grad());
  for (auto* history : {&l.old_dirs(), &l.old_stps(), &l.ro()})
    for (auto& t : *history) n += tensor_bytes(t);
  if (l.al())
    for (auto& t : *l.al()) n += tensor_bytes(t);
  return n;
}

const char* const kLbfgsNotCheckpointed =
    "checkpoints save an optimizer's state per parameter, sliced like the shards, but torch::optim::LBFGS keeps one "
    "state for all parameters (its history of flattened directions over this rank's shards), which no checkpoint can "
    "slice or reshard. Expected: SGD, Adam, AdamW (fsdp::FusedAdamW), Adagrad or RMSprop. Fix: use one of those, or "
    "save the model alone (pass no optimizer) and let LBFGS begin its history again after a load.";
const char* const kLbfgsNotOnShards =
    "it cannot step on shards: its line search and its dot products span every element of the "
    "model, but each rank holds a different slice, so the ranks would choose different steps and call the closure "
    "a different number of times (their collectives would no longer match). Expected: an optimizer that updates "
    "each element on its own (SGD, Adam, AdamW, fsdp::FusedAdamW, Adagrad, RMSprop), or parameters every rank holds "
    "whole. Fix: use one of those optimizers, or FsdpOptions::strategy = NO_SHARD.";

// A kind: its row of the torch-free table, and what needs libtorch.
OptimizerKind kind(const char* type, bool (*is)(const torch::optim::Optimizer&),
                   optim_table::Settings (*settings)(const OptimizerOptions&),
                   torch::Tensor (*tensor)(const OptimizerParamState&, const std::string&),
                   int64_t (*step)(const OptimizerParamState&),
                   std::unique_ptr<OptimizerParamState> (*make)(const OptimizerOptions&, int64_t, const TensorOf&),
                   nlohmann::json (*hyper)(const OptimizerOptions&),
                   int64_t (*other_bytes)(const OptimizerParamState&) = nullptr,
                   const char* not_checkpointed = nullptr, const char* not_on_shards = nullptr) {
  const optim_table::Row* row = optim_table::find(type);
  FSDP_CHECK(row != nullptr, "optimizer kind '", type, "' has no row in common/optimizer_table.h");
  return {row, row->type, row->cls, is, row->tensors, settings, tensor, step, make, hyper, other_bytes,
          not_checkpointed, not_on_shards};
}

}  // namespace

const std::vector<OptimizerKind>& optimizer_kinds() {
  using namespace torch::optim;
  static const std::vector<OptimizerKind> table = {
      kind("sgd", is<SGD>, sgd_settings, sgd_tensor, no_step, sgd_make, sgd_hyper),
      kind("adam", is<Adam>, adam_settings<AdamOptions>, adam_tensor<AdamParamState>, adam_step<AdamParamState>,
           adam_make<AdamOptions, AdamParamState>, adam_hyper<AdamOptions>),
      kind("adamw", is<AdamW>, adam_settings<AdamWOptions>, adam_tensor<AdamWParamState>, adam_step<AdamWParamState>,
           adam_make<AdamWOptions, AdamWParamState>, adam_hyper<AdamWOptions>),
      kind("adagrad", is<Adagrad>, no_settings, adagrad_tensor, adagrad_step, adagrad_make, adagrad_hyper),
      kind("rmsprop", is<RMSprop>, rmsprop_settings, rmsprop_tensor, rmsprop_step, rmsprop_make, rmsprop_hyper),
      kind("lbfgs", is<LBFGS>, no_settings, no_tensor, no_step, no_make, no_hyper, lbfgs_bytes,
           kLbfgsNotCheckpointed, kLbfgsNotOnShards),
  };
  return table;
}

const OptimizerKind* kind_of(const torch::optim::Optimizer& opt) {
  for (const OptimizerKind& k : optimizer_kinds())
    if (k.is(opt)) return &k;
  return nullptr;
}

const OptimizerKind* checkpoint_kind(const torch::optim::Optimizer* opt) {
  if (!opt) return nullptr;
  const OptimizerKind* k = kind_of(*opt);
  if (!k)
    throw Error("checkpoints save the state of SGD, Adam, AdamW (fsdp::FusedAdamW), Adagrad and RMSprop; this "
                "optimizer is another type. Fix: use one of those, or save the model alone (pass no optimizer).");
  if (k->not_checkpointed) throw Error(k->not_checkpointed);
  return k;
}

std::vector<std::string> saved_tensors(const OptimizerKind* kind, const torch::optim::Optimizer* opt) {
  if (!kind || !opt) return {};
  std::unordered_set<std::string> kept;
  for (auto& g : opt->param_groups())
    for (auto& name : kind->kept(g.options())) kept.insert(name);
  std::vector<std::string> out;
  for (auto& name : kind->tensors)
    if (kept.count(name)) out.push_back(name);
  return out;
}

GroupOptions::GroupOptions(const torch::optim::Optimizer& opt) : first_(&opt.param_groups().at(0).options()) {
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) by_param_.emplace(p.unsafeGetTensorImpl(), &g.options());
}

const torch::optim::OptimizerOptions& GroupOptions::of(const torch::Tensor& param) const {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  return it == by_param_.end() ? *first_ : *it->second;
}

double state_tensors_per_param(const torch::optim::Optimizer& opt) {
  const OptimizerKind* k = kind_of(opt);
  if (!k || !k->row->per_parameter) return -1;
  double tensors = 0, elements = 0;
  for (auto& g : opt.param_groups()) {
    const double held = static_cast<double>(k->held(g.options()).size());
    for (auto& p : g.params()) {
      tensors += held * static_cast<double>(p.numel());
      elements += static_cast<double>(p.numel());
    }
  }
  return elements > 0 ? tensors / elements : static_cast<double>(k->held(opt.defaults()).size());
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& opt, const torch::Tensor& param) {
  const OptimizerKind* k = kind_of(opt);
  if (!k) return 0;
  auto it = opt.state().find(compat::optimizer_state_key(param));
  if (it == opt.state().end()) return 0;
  const OptimizerParamState& st = *it->second;
  int64_t n = k->other_bytes ? k->other_bytes(st) : 0;
  for (auto& name : k->tensors) n += tensor_bytes(k->tensor(st, name));
  return n;
}

}  // namespace fsdp::detail

namespace fsdp {

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
  // Parameters split across ranks: NO_SHARD, or a shard group of one, holds them whole.
  const detail::OptimizerKind* k = detail::kind_of(opt);
  const bool split = model.options().strategy != ShardingStrategy::NO_SHARD && model.shard_group()->world_size() > 1;
  if (k && k->not_on_shards && split)
    throw Error(detail::cat(k->cls, " with ", to_string(model.options().strategy), " over a shard group of ",
                            model.shard_group()->world_size(), " ranks: ", k->not_on_shards));
}

}  // namespace fsdp
