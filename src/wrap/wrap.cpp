// fsdp-cpp: wrap — the module tree becomes units.
//
// A unit is a subtree whose parameters are all-gathered and reduce-scattered
// together (the FSDP guide's "档口"). The policy decides bottom-up which submodules
// become units; the root is always one and keeps every parameter not claimed
// by a nested unit. A parameter registered in several modules (tied weights)
// lives in exactly one unit: the one enclosing all its owners.
#include <unordered_map>
#include <unordered_set>

#include "unit/sharded_state.h"

namespace fsdp {

const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
  }
  return "?";
}

ShardingStrategy parse_strategy(const std::string& t) {
  if (t == "full" || t == "FULL_SHARD" || t == "full_shard") return ShardingStrategy::FULL_SHARD;
  if (t == "grad-op" || t == "SHARD_GRAD_OP" || t == "shard_grad_op") return ShardingStrategy::SHARD_GRAD_OP;
  if (t == "none" || t == "NO_SHARD" || t == "no_shard") return ShardingStrategy::NO_SHARD;
  throw Error("unknown sharding strategy '" + t + "': expected full, grad-op or none");
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
}

namespace detail {
namespace {

struct TreeNode {
  std::string path;
  torch::nn::Module* module;
  int parent;  // index, -1 for the root
  std::vector<int> children;
  bool is_unit = false;
  int unit = -1;  // index into units once assigned
};

void walk(torch::nn::Module& m, const std::string& path, int parent, std::vector<TreeNode>& nodes,
          std::unordered_set<const torch::nn::Module*>& seen) {
  int me = static_cast<int>(nodes.size());
  nodes.push_back({path, &m, parent, {}});
  if (parent >= 0) nodes[parent].children.push_back(me);
  seen.insert(&m);
  for (const auto& kv : m.named_children()) {
    if (seen.count(kv.value().get())) continue;  // a shared submodule belongs where first seen
    walk(*kv.value(), path.empty() ? kv.key() : path + "." + kv.key(), me, nodes, seen);
  }
}

std::string join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

}  // namespace

void ShardedState::build_units() {
  std::vector<TreeNode> nodes;
  std::unordered_set<const torch::nn::Module*> seen;
  walk(*root, "", -1, nodes, seen);

  for (auto& n : nodes)
    if (unit_of(n.module))
      throw Error("module '" + (n.path.empty() ? std::string("<root>") : n.path) +
                  "' is already part of a fully_shard()ed model: wrap a model once, at its root, "
                  "and let the wrap policy choose the units inside it");

  // Policy, bottom-up: children are decided before their parent, and a
  // parent only counts parameters its unit would really hold.
  std::unordered_set<const c10::TensorImpl*> counted;
  std::function<int64_t(int)> decide = [&](int i) -> int64_t {
    int64_t unwrapped = 0;
    for (int c : nodes[i].children) unwrapped += decide(c);
    for (const auto& p : nodes[i].module->named_parameters(/*recurse=*/false))
      if (counted.insert(p.value().unsafeGetTensorImpl()).second) unwrapped += p.value().numel();
    if (i != 0 && opts.wrap.fn && opts.wrap.fn(nodes[i].path, *nodes[i].module, unwrapped)) {
      nodes[i].is_unit = true;
      return 0;
    }
    return unwrapped;
  };
  decide(0);
  nodes[0].is_unit = true;

  // Units in pre-order (the root first); each knows its enclosing unit.
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto& n = nodes[i];
    if (n.is_unit) {
      auto u = std::make_unique<Unit>();
      u->index = static_cast<int>(units.size());
      u->name = n.path;
      u->module = n.module;
      u->owner = this;
      n.unit = u->index;
      if (n.parent >= 0) u->parent = units[nodes[n.parent].unit].get();
      units.push_back(std::move(u));
    } else {
      n.unit = nodes[n.parent].unit;
    }
  }

  // Parameters: every (name, owner) pair in named_parameters() order.
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
    for (Unit* u = units[b].get(); u; u = u->parent)
      if (u->index == a) return true;
    return false;
  };
  std::unordered_map<const c10::TensorImpl*, std::pair<int, size_t>> where;  // unit, slot
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
        msg += (k ? ", '" : "'") + os[k].name + "' (unit '" + units[os[k].unit]->display_name() + "')";
      msg += ", but the wrap policy puts its owners in sibling units, so one of them would compute "
             "on freed storage. Expected: every owner of a shared parameter inside one unit. "
             "Fix: exclude these modules from the policy, or wrap their common parent as a unit.";
      throw Error(msg);
    }
    Unit& u = *units[home];
    ParamSlot s;
    s.name = os[0].name;
    for (size_t k = 1; k < os.size(); ++k) s.aliases.push_back(os[k].name);
    s.param = tensors[impl];
    s.shape = s.param.sizes().vec();
    s.numel = s.param.numel();
    s.offset = u.numel;
    s.requires_grad = s.param.requires_grad();
    u.numel += s.numel;
    if (s.requires_grad) ++u.n_grad_params;
    where[impl] = {home, u.params.size()};
    u.params.push_back(std::move(s));
  }
  // Canonical order of the unwrapped model: named_parameters(), aliases included.
  for (const auto& p : root->named_parameters(/*recurse=*/true)) {
    auto w = where.at(p.value().unsafeGetTensorImpl());
    named_slots.emplace_back(p.key(), &units[w.first]->params[w.second]);
  }
}

}  // namespace detail
}  // namespace fsdp
