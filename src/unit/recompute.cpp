// fsdp-cpp: activation recomputation (also called activation checkpointing;
// not the checkpoint files of src/checkpoint/) — a module's forward again in
// backward.
//
// A recomputed call (fsdp::call on a module FsdpOptions::recompute
// selected, with grad mode on) becomes one autograd node, RecomputeNode:
//
//   forward:  the module's forward runs without recording a graph (no
//             activations kept); the node saves its tensor inputs and the
//             state of the generators its kernels draw from (the CPU's and,
//             on a GPU, the device's: CUDA dropout draws from the latter). Its inputs are the call's tensors AND
//             the module's parameters that require grad, so the node's
//             edges lead to the parameters' own AccumulateGrad nodes. On a
//             GPU it also saves that device's generator (CUDA dropout draws
//             from it, not from the CPU's).
//   backward: the hook on the node's outputs has already run the unit's
//             pre_backward (all-gather: the parameters are unsharded); the
//             node restores the generators, runs the forward again with grad
//             mode on, on detached copies of its inputs (the recompute), and
//             differentiates that graph with torch::autograd::grad w.r.t.
//             the inputs and the parameters, so nothing accumulates inside:
//             the gradients leave through the node's edges and every
//             parameter's accumulator (and FSDP's post-hook on it) runs once
//             per backward, as without recomputation. The generators are
//             put back afterwards (torch.random.fork_rng, devices included).
//
// The same kernels on the same values give the same bits: the recomputed
// forward equals the first one, its graph is the one autograd would have
// kept, and each gradient is the same sum in the same order (a parameter
// used both inside and outside one recomputed call is the exception:
// its contributions from inside are summed first; with two uses the order
// cannot matter, docs/DESIGN.md).
//
// The unit's side (unit.h): begin_recompute requires BACKWARD and UNSHARDED,
// so the recompute reuses pre_backward's all-gather (one all-gather for
// recompute and backward: the redundant second one of pytorch#105635 cannot
// happen), and the unit refuses to reshard until end_recompute. Units called
// inside a recomputed module: in its first forward (grad mode off) they
// end FORWARD_DONE as after a forward with grad (SHARD_GRAD_OP keeps them
// gathered for the recompute); in the recompute they keep their parameters
// after their forward (their backward follows at once) and prefetch nothing
// forward. So every unit is gathered as often as without recomputation.
#include <unordered_map>
#include <unordered_set>

#include "compat/torch_compat.h"
#include "fsdp/memory.h"
#include "unit/engine.h"

namespace fsdp {

std::vector<std::string> FullyShardedModel::recomputed() const {
  std::vector<std::string> out;
  for (auto& s : engine_->recompute_sites) out.push_back(s->name);
  return out;
}

namespace detail {
namespace {

std::mutex g_sites_mu;
std::unordered_map<const torch::nn::Module*, RecomputeSite*>& sites() {
  static std::unordered_map<const torch::nn::Module*, RecomputeSite*> m;
  return m;
}

}  // namespace

// --- The engine's side (the unit's, begin_recompute / end_recompute: unit.cpp) ---

std::vector<std::unique_ptr<RecomputeSite>> Engine::build_recompute_sites() {
  std::vector<std::unique_ptr<RecomputeSite>> built;
  const RecomputePolicy& p = opts.recompute;
  if (!p.enabled()) return built;
  std::unordered_map<const torch::nn::Module*, Unit*> unit_at;
  for (auto& u : units) unit_at[u->module] = u.get();
  std::unordered_set<const torch::nn::Module*> seen;
  int matched = 0;
  // Pre-order, as the wrap walks the tree (a shared submodule where first seen).
  std::function<void(torch::nn::Module&, const std::string&, Unit*)> walk = [&](torch::nn::Module& m,
                                                                                const std::string& path, Unit* in) {
    seen.insert(&m);
    auto it = unit_at.find(&m);
    Unit* here = it != unit_at.end() ? it->second : in;
    if (&m != root.get() && p.fn(path, m) && matched++ % p.every == 0) {
      std::vector<torch::Tensor> params;
      std::unordered_set<const c10::TensorImpl*> distinct;
      for (auto& t : m.parameters(/*recurse=*/true))
        if (t.requires_grad() && distinct.insert(t.unsafeGetTensorImpl()).second) params.push_back(t);
      built.push_back(std::unique_ptr<RecomputeSite>(new RecomputeSite{this, &m, path, here, std::move(params)}));
    }
    for (const auto& kv : m.named_children()) {
      if (seen.count(kv.value().get())) continue;
      walk(*kv.value(), path.empty() ? kv.key() : path + "." + kv.key(), here);
    }
  };
  walk(*root, "", units.front().get());
  return built;
}

void Engine::register_recompute_sites() {
  std::lock_guard<std::mutex> g(g_sites_mu);
  for (auto& s : recompute_sites) sites()[s->module] = s.get();
}

void Engine::unregister_recompute_sites() {
  std::lock_guard<std::mutex> g(g_sites_mu);
  for (auto& s : recompute_sites) {
    auto it = sites().find(s->module);
    if (it != sites().end() && it->second == s.get()) sites().erase(it);
  }
}

void Engine::check_recompute_routed() {
  if (warned_unrouted || recompute_sites.empty() || recomputed_calls > 0) return;
  warned_unrouted = true;
  std::fprintf(stderr,
               "fsdp: warning: FsdpOptions.recompute (%s) selected %zu module(s) (e.g. '%s') but this training "
               "forward recomputed none: a recomputed module must be called through fsdp::call(module, x) "
               "(or be a child of a Sequential); called as module->forward(x) it keeps its activations.\n",
               opts.recompute.description.c_str(), recompute_sites.size(), recompute_sites.front()->name.c_str());
}

void Engine::begin_recompute(RecomputeSite& s) {
  Unit& u = *s.unit;
  // The outer backward's end-of-backward callback, queued in the outer graph
  // task (the recompute's backward is a nested one).
  if (!callback_queued) {
    callback_queued = true;
    compat::queue_backward_callback([this] { end_of_backward(); });
  }
  // Normally the hook on the node's outputs ran pre_backward already; when
  // the gradient reached the node some other way, this is where the unit
  // enters its backward (and gathers its parameters).
  if (u.training() == TrainingState::IDLE || u.training() == TrainingState::FORWARD_DONE) pre_backward(u);
  u.begin_recompute();
  ++recompute_depth;
}

void Engine::end_recompute(RecomputeSite& s) {
  --recompute_depth;
  s.unit->end_recompute();
}

namespace {

// The states of the generators a forward on `device` draws from: the CPU's
// (always: CPU kernels and CPU-side sampling) and the device's own default
// generator (CUDA dropout's), as torch.utils.checkpoint saves both.
struct RngStates {
  torch::Tensor cpu;
  torch::Tensor device;  // undefined on the CPU

  static RngStates capture(const c10::Device& device) {
    RngStates r;
    r.cpu = compat::cpu_rng_state();
    if (!device.is_cpu()) {
      at::Generator gen = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      r.device = gen.get_state();
    }
    return r;
  }
  void restore(const c10::Device& device) const {
    compat::set_cpu_rng_state(cpu);
    if (device.is_cpu()) return;
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(this->device);
  }
};

// What a recomputed call keeps for its recompute (the node's saved data).
struct RecomputeState : torch::CustomClassHolder {
  RecomputeSite* site = nullptr;
  RegionFn fn;
  RngStates rng;  // the generators' states before the forward
  size_t n_inputs = 0;
};

// Restores the generators and the engine's recompute state, also on errors.
struct RecomputeScope {
  RecomputeSite& site;
  const c10::Device device;
  RngStates rng_after;
  bool begun = false;
  RecomputeScope(RecomputeSite& s, const RngStates& rng_before)
      : site(s), device(s.engine->opts.device), rng_after(RngStates::capture(device)) {
    site.engine->begin_recompute(site);
    begun = true;
    rng_before.restore(device);
  }
  ~RecomputeScope() {
    rng_after.restore(device);
    if (begun) site.engine->end_recompute(site);
  }
};

std::string leaf_names(const RecomputeSite& site, const std::vector<torch::Tensor>& leaves) {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (auto& kv : site.engine->root->named_parameters(true)) names.emplace(kv.value().unsafeGetTensorImpl(), kv.key());
  std::string out;
  for (auto& t : leaves) {
    auto it = names.find(t.unsafeGetTensorImpl());
    out += (out.empty() ? "'" : ", '") + (it != names.end() ? it->second : std::string("<a tensor>")) + "'";
  }
  return out;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RecomputeNode : torch::autograd::Function<RecomputeNode> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<RecomputeState> st, torch::TensorList inputs,
                               torch::TensorList params) {
    ctx->set_materialize_grads(false);
    st->rng = RngStates::capture(st->site->engine->opts.device);
    st->n_inputs = inputs.size();
    ctx->save_for_backward(inputs.vec());
    Engine& engine = *st->site->engine;
    ++engine.recompute_forward_depth;
    std::vector<torch::Tensor> out;
    try {
      out = st->fn(inputs.vec());  // grad mode is off here: no graph, no activations
    } catch (...) {
      --engine.recompute_forward_depth;
      throw;
    }
    --engine.recompute_forward_depth;
    for (auto& o : out) {
      // A view (of an input, say) cannot take this node as its grad_fn: a copy can.
      bool is_input = false;
      for (auto& i : inputs) is_input = is_input || (o.defined() && i.defined() && o.is_same(i));
      if (o.defined() && (o.is_view() || is_input)) o = o.clone();
    }
    ctx->saved_data["fsdp_recompute"] = c10::IValue::make_capsule(st);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto st = c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data.at("fsdp_recompute").toCapsule());
    RecomputeSite& site = *st->site;
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const size_t n_in = st->n_inputs, n_par = site.params.size();
    variable_list result(1 + n_in + n_par);  // [the state (no gradient), inputs..., params...]
    bool any_needed = false;
    for (size_t i = 0; i < n_in + n_par; ++i) any_needed = any_needed || ctx->needs_input_grad(i);
    bool any_grad = false;
    for (auto& g : grad_outputs) any_grad = any_grad || g.defined();
    if (!any_needed || !any_grad) return result;
    const bool create_graph = torch::GradMode::is_enabled();  // double backward

    trace::Span span("recompute", "backward");
    if (span.active()) span.arg("unit", site.unit->name).arg("module", site.name);
    RecomputeScope scope(site, st->rng);
    std::vector<torch::Tensor> det(n_in);
    for (size_t i = 0; i < n_in; ++i) {
      if (!saved[i].defined()) continue;
      det[i] = saved[i].detach();
      if (ctx->needs_input_grad(i)) det[i].requires_grad_(true);
    }
    std::vector<torch::Tensor> out;
    {
      const int64_t before = site.engine->memory_source->read().training();
      torch::AutoGradMode grad_on(true);
      out = st->fn(det);
      site.engine->recompute_bytes =
          std::max(site.engine->recompute_bytes, site.engine->memory_source->read().training() - before);
    }
    FSDP_CHECK(out.size() == grad_outputs.size(), "recompute of '", site.name, "' returned ", out.size(),
               " outputs, the forward ", grad_outputs.size());
    std::vector<torch::Tensor> roots, root_grads;
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i].defined() && out[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(out[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    // Every leaf the recomputed graph reaches must be an input of this node:
    // a gradient to any other would be computed here and then lost.
    std::unordered_set<const c10::TensorImpl*> known;
    for (auto& d : det)
      if (d.defined()) known.insert(d.unsafeGetTensorImpl());
    for (auto& p : site.params) known.insert(p.unsafeGetTensorImpl());
    std::vector<torch::Tensor> foreign;
    for (auto& leaf : compat::graph_leaves(roots))
      if (!known.count(leaf.unsafeGetTensorImpl())) foreign.push_back(leaf);
    if (!foreign.empty())
      throw Error("activation checkpointing of '" + site.name + "': its forward uses " + leaf_names(site, foreign) +
                  ", which require grad but are not its parameters or tensor arguments, so their gradients "
                  "could not leave the recompute. Expected: a recomputed module computes on its own "
                  "(registered) parameters and its tensor arguments. Fix: register the tensor in the module "
                  "(register_parameter / register_module), pass it as a tensor argument, or exclude the module "
                  "from FsdpOptions::recompute.");
    std::vector<torch::Tensor> want;
    std::vector<size_t> where;  // index into result
    for (size_t i = 0; i < n_in; ++i)
      if (det[i].defined() && det[i].requires_grad()) want.push_back(det[i]), where.push_back(1 + i);
    for (size_t j = 0; j < n_par; ++j)
      if (ctx->needs_input_grad(n_in + j)) want.push_back(site.params[j]), where.push_back(1 + n_in + j);
    if (roots.empty() || want.empty()) return result;
    auto grads = torch::autograd::grad(roots, want, root_grads, /*retain_graph=*/false, create_graph,
                                       /*allow_unused=*/true);
    for (size_t k = 0; k < want.size(); ++k) result[where[k]] = grads[k];
    return result;
  }
};

}  // namespace

RecomputeSite* recompute_site(const torch::nn::Module* m) {
  if (!m || !torch::GradMode::is_enabled()) return nullptr;
  std::lock_guard<std::mutex> g(g_sites_mu);
  if (sites().empty()) return nullptr;
  auto it = sites().find(m);
  return it == sites().end() ? nullptr : it->second;
}

void recompute_unsupported(const RecomputeSite& site, const char* why) {
  throw Error("activation checkpointing of '" + site.name + "': " + why +
              ". Fix: exclude the module from FsdpOptions::recompute or recompute a module around it.");
}

std::vector<torch::Tensor> run_recomputed(RecomputeSite& site, RegionFn fn, std::vector<torch::Tensor> inputs) {
  ++site.engine->recomputed_calls;
  auto st = c10::make_intrusive<RecomputeState>();
  st->site = &site;
  st->fn = std::move(fn);
  return RecomputeNode::apply(st, torch::TensorList(inputs), torch::TensorList(site.params));
}

}  // namespace detail
}  // namespace fsdp
