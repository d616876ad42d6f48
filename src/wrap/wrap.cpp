// fsdp-cpp: wrap — which modules become units and which parameters each holds.
//
// defines: WrapPolicy::none, WrapPolicy::size_based, WrapPolicy::predicate,
//          describe_wrap
//
// A unit is a subtree whose parameters are all-gathered and reduce-scattered
// together. describe_wrap (wrap.h) is a pure function from the tree and the
// policy to unit descriptions: it reads the modules and their parameters,
// changes nothing and knows no engine. The engine materialises the
// descriptions into units (Engine::build_units, src/unit/engine.cpp).
#include "wrap/wrap.h"

#include <functional>
#include <unordered_map>
#include <unordered_set>

namespace fsdp {

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
    for (size_t k = 1; k < os.size(); ++k) d.tied_names.push_back(os[k].name);
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
  // Canonical order of the unwrapped model: named_parameters(), tied names included.
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    auto w = where.at(p.value().unsafeGetTensorImpl());
    out.named.push_back({p.key(), w.first, w.second});
  }
  return out;
}

}  // namespace detail
}  // namespace fsdp
