// fsdp-cpp: wrap — the module tree becomes units.
//
// A unit is a subtree whose parameters are all-gathered and reduce-scattered
// together. Two steps: describe_wrap (wrap.h), a pure function from the tree
// and the policy to unit descriptions, then Engine::build_units, which turns
// each description into a Unit. Also here: the options' names and checks.
#include <unordered_map>
#include <unordered_set>

#include "common/strategy_names.h"
#include "unit/engine.h"
#include "wrap/wrap.h"

namespace fsdp {

const char* to_string(ShardingStrategy s) { return detail::strategy_name(s); }

ShardingStrategy parse_strategy(const std::string& t) {
  if (auto s = detail::strategy_from_name(t)) return *s;
  throw Error("unknown sharding strategy '" + t + "': expected full, grad-op, none, hybrid or hybrid-zero2");
}

const char* to_string(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::NONE: return "none";
    case BackwardPrefetch::BACKWARD_PRE: return "pre";
    case BackwardPrefetch::BACKWARD_POST: return "post";
  }
  return "?";
}

WrapPolicy WrapPolicy::none() { return WrapPolicy{nullptr, "none (one unit)"}; }

WrapPolicy WrapPolicy::size_based(int64_t min_num_params) {
  if (min_num_params < 1)
    throw Error("size-based wrap policy: min_num_params must be >= 1, found " +
                     std::to_string(min_num_params));
  return WrapPolicy{[min_num_params](const std::string&, const torch::nn::Module&, int64_t n) {
                      return n >= min_num_params;
                    },
                    "size >= " + std::to_string(min_num_params) + " params"};
}

WrapPolicy WrapPolicy::predicate(Fn fn, std::string description) {
  return WrapPolicy{std::move(fn), std::move(description)};
}

void FsdpOptions::validate() const {
  if (!device.is_cpu() && !device.is_cuda())
    throw Error("FsdpOptions.device is " + device.str() + "; expected cpu or cuda:K (a CUDA device)");
  if (limit_all_gathers < 1)
    throw Error("FsdpOptions.limit_all_gathers must be >= 1 (units unsharded at once), found " +
                std::to_string(limit_all_gathers));
  auto ok_float = [](const c10::optional<torch::ScalarType>& t, const char* what) {
    if (t && !(*t == torch::kFloat32 || *t == torch::kBFloat16 || *t == torch::kFloat16))
      throw Error(std::string("FsdpOptions.mixed_precision.") + what +
                  " must be float32, bfloat16 or float16, found " + c10::toString(*t));
  };
  ok_float(mixed_precision.param_dtype, "param_dtype");
  ok_float(mixed_precision.reduce_dtype, "reduce_dtype");
  ok_float(mixed_precision.buffer_dtype, "buffer_dtype");
  if (shard_group_size < 0)
    throw Error("FsdpOptions.shard_group_size must be >= 0 (0: the ranks of one host), found " +
                std::to_string(shard_group_size));
  const RecomputePolicy recompute_policy = detail::adopt_deprecated_checkpoint(*this).recompute;
  if (recompute_policy.enabled() && recompute_policy.every < 1)
    throw Error("FsdpOptions.recompute.every must be >= 1 (recompute every k-th selected module), found " +
                std::to_string(recompute_policy.every));
}

namespace detail {
namespace {

// Whether `p` differs from RecomputePolicy::none().
bool is_set(const RecomputePolicy& p) {
  return p.enabled() || p.every != 1 || p.description != RecomputePolicy::none().description;
}

// Whether two policies select the same modules, as far as can be told: a
// std::function cannot be compared, so its target's type stands for it.
bool same_policy(const RecomputePolicy& a, const RecomputePolicy& b) {
  return a.every == b.every && a.description == b.description && a.fn.target_type() == b.fn.target_type();
}

std::string describe(const RecomputePolicy& p) {
  return "'" + p.description + "' (every " + std::to_string(p.every) + (p.enabled() ? "" : ", no predicate") + ")";
}

}  // namespace

FsdpOptions adopt_deprecated_checkpoint(FsdpOptions o) {
  RecomputePolicy& old = o.checkpoint;  // renamed FsdpOptions::recompute; honoured for one release
  if (is_set(old)) {
    if (!is_set(o.recompute))
      o.recompute = old;
    else if (!same_policy(old, o.recompute))
      throw Error("FsdpOptions.checkpoint (deprecated: renamed FsdpOptions.recompute) and FsdpOptions.recompute "
                  "are both set, to different policies: checkpoint = " + describe(old) + ", recompute = " +
                  describe(o.recompute) + ". Expected: the policy in FsdpOptions.recompute only. Fix: set "
                  "FsdpOptions.recompute and leave FsdpOptions.checkpoint at its default.");
  }
  old = RecomputePolicy::none();
  return o;
}

}  // namespace detail

namespace detail {
namespace {

// --- describe_wrap's stages ---

struct TreeNode {
  std::string path;
  torch::nn::Module* module;
  int parent;  // index, -1 for the root
  std::vector<int> children;
  bool is_unit = false;
  int unit = -1;  // index into the units once assigned
};

std::string join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

// The module tree in pre-order; a shared submodule belongs where first seen.
void walk(torch::nn::Module& m, const std::string& path, int parent, std::vector<TreeNode>& nodes,
          std::unordered_set<const torch::nn::Module*>& seen) {
  int me = static_cast<int>(nodes.size());
  nodes.push_back({path, &m, parent, {}});
  if (parent >= 0) nodes[parent].children.push_back(me);
  seen.insert(&m);
  for (const auto& kv : m.named_children()) {
    if (seen.count(kv.value().get())) continue;
    walk(*kv.value(), join(path, kv.key()), me, nodes, seen);
  }
}

// The policy, bottom-up: children are decided before their parent, and a
// parent only counts parameters its unit would really hold. The root is
// always a unit.
void decide_units(std::vector<TreeNode>& nodes, const WrapPolicy& policy) {
  std::unordered_set<const c10::TensorImpl*> counted;
  std::function<int64_t(int)> decide = [&](int i) -> int64_t {
    int64_t unwrapped = 0;
    for (int c : nodes[i].children) unwrapped += decide(c);
    for (const auto& p : nodes[i].module->named_parameters(/*recurse=*/false))
      if (counted.insert(p.value().unsafeGetTensorImpl()).second) unwrapped += p.value().numel();
    if (i != 0 && policy.fn && policy.fn(nodes[i].path, *nodes[i].module, unwrapped)) {
      nodes[i].is_unit = true;
      return 0;
    }
    return unwrapped;
  };
  decide(0);
  nodes[0].is_unit = true;
}

// Units in pre-order (the root first); each node learns the unit it is in,
// each unit its enclosing unit.
std::vector<UnitDesc> number_units(std::vector<TreeNode>& nodes) {
  std::vector<UnitDesc> units;
  for (auto& n : nodes) {
    if (!n.is_unit) {
      n.unit = nodes[n.parent].unit;
      continue;
    }
    n.unit = static_cast<int>(units.size());
    UnitDesc u;
    u.name = n.path;
    u.module = n.module;
    u.parent = n.parent >= 0 ? nodes[n.parent].unit : -1;
    units.push_back(std::move(u));
  }
  return units;
}

std::string display(const std::string& name) { return name.empty() ? "<root>" : name; }

// Each parameter goes to the first of its owners' units that encloses all the
// others, in order of first appearance; returns (unit, param) per tensor.
std::unordered_map<const c10::TensorImpl*, std::pair<int, int>> place_params(const std::vector<TreeNode>& nodes,
                                                                            std::vector<UnitDesc>& units) {
  // Every (name, owner) pair in walk order.
  struct Owner {
    std::string name;
    int unit;
  };
  std::vector<const c10::TensorImpl*> order;
  std::unordered_map<const c10::TensorImpl*, std::vector<Owner>> owners;
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> tensors;
  for (auto& n : nodes) {
    for (const auto& p : n.module->named_parameters(/*recurse=*/false)) {
      auto* impl = p.value().unsafeGetTensorImpl();
      if (!owners.count(impl)) {
        order.push_back(impl);
        tensors[impl] = p.value();
      }
      owners[impl].push_back({join(n.path, p.key()), n.unit});
    }
  }
  auto is_ancestor = [&](int a, int b) {  // unit a encloses unit b (or a == b)
    for (int u = b; u >= 0; u = units[u].parent)
      if (u == a) return true;
    return false;
  };
  std::unordered_map<const c10::TensorImpl*, std::pair<int, int>> where;
  for (auto* impl : order) {
    auto& os = owners[impl];
    int home = -1;
    for (auto& cand : os) {
      bool encloses_all = true;
      for (auto& o : os) encloses_all = encloses_all && is_ancestor(cand.unit, o.unit);
      if (encloses_all) {
        home = cand.unit;
        break;
      }
    }
    if (home < 0) {
      std::string msg = "parameter '" + os[0].name + "' is shared by ";
      for (size_t k = 0; k < os.size(); ++k)
        msg += (k ? ", '" : "'") + os[k].name + "' (unit '" + display(units[os[k].unit].name) + "')";
      msg += ", but the wrap policy puts its owners in sibling units, so one of them would compute "
             "on freed storage. Expected: every owner of a shared parameter inside one unit. "
             "Fix: exclude these modules from the policy, or wrap their common parent as a unit.";
      throw Error(msg);
    }
    ParamDesc d;
    d.name = os[0].name;
    for (size_t k = 1; k < os.size(); ++k) d.aliases.push_back(os[k].name);
    d.tensor = tensors[impl];
    where[impl] = {home, static_cast<int>(units[home].params.size())};
    units[home].params.push_back(std::move(d));
  }
  return where;
}

}  // namespace

WrapDescription describe_wrap(torch::nn::Module& root, const WrapPolicy& policy) {
  std::vector<TreeNode> nodes;
  std::unordered_set<const torch::nn::Module*> seen;
  walk(root, "", -1, nodes, seen);
  decide_units(nodes, policy);
  WrapDescription out;
  out.units = number_units(nodes);
  const auto where = place_params(nodes, out.units);
  // Canonical order of the unwrapped model: named_parameters(), aliases included.
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    auto w = where.at(p.value().unsafeGetTensorImpl());
    out.named.push_back({p.key(), w.first, w.second});
  }
  return out;
}

// --- A new engine's units: check and describe (describe_new_wrap), then
// materialise (Engine::build_units) ---

namespace {

// A module can be in one wrapped model only (its unit registry entry would
// be overwritten, its parameters sharded twice).
void check_not_wrapped(torch::nn::Module& root) {
  std::vector<TreeNode> nodes;
  std::unordered_set<const torch::nn::Module*> seen;
  walk(root, "", -1, nodes, seen);
  for (auto& n : nodes)
    if (unit_of(n.module))
      throw Error("module '" + display(n.path) +
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
    s.aliases = p.aliases;
    s.param = p.tensor;
    slots.push_back(std::move(s));
  }
  return std::make_unique<Unit>(index, d.name, d.module, parent, owner,
                                owner->shard_comm.get(),  // HYBRID: the shard group
                                std::move(slots), owner->opts);
}

}  // namespace

WrapDescription describe_new_wrap(torch::nn::Module& root, const WrapPolicy& policy) {
  check_not_wrapped(root);
  return describe_wrap(root, policy);
}

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

}  // namespace detail
}  // namespace fsdp
