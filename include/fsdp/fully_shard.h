// fsdp-cpp: the public FSDP API.
//
// defines: to_string(ShardingStrategy), parse_strategy, BackwardPrefetch, MixedPrecision, WrapPolicy,
//          RecomputePolicy (CheckpointPolicy, deprecated), FsdpOptions, UnitInfo, NamedShard, Ledger,
//          FullyShardedModel, Sharded<M>, fully_shard(), call(), verify_optimizer()
// (the templates behind call() are in fsdp/detail/routing.h and fsdp/detail/recompute.h)
//
//   auto comm  = fsdp::make_communicator_from_env();
//   auto model = fsdp::fully_shard(net, comm, opts);     // net: any module holder
//   torch::optim::AdamW opt(model->parameters(), ...);   // 1/N of the state
//   auto loss = model.forward(x).sum();                  // all-gathers unit by unit
//   loss.backward();                                     // reduce-scatters unit by unit
//   model->clip_grad_norm(1.0);  opt.step();  opt.zero_grad();
//
// Inside a custom module, a child that may be its own unit is called as
//   x = fsdp::call(block, x);          // == block->forward(x) without FSDP
// Sequential containers need no change: their children are routed for you.
//
// Vocabulary (docs/DESIGN.md): a unit's *original* parameters are flattened
// into one *flat* buffer, padded to a multiple of N (padded numel); rank r
// owns the *shard* [r*S, (r+1)*S) (S = padded/N) in fp32 (the master copy the
// optimizer updates). The *unsharded* flat buffer (all-gather output, in
// param_dtype) exists only while the unit computes; the module's parameters
// are views into it.
#pragma once

#include <torch/torch.h>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/detail/recompute.h"
#include "fsdp/detail/routing.h"
#include "fsdp/errors.h"
#include "fsdp/memory.h"
#include "fsdp/param_init.h"
#include "fsdp/strategy.h"

// Everything of fsdp-cpp, fully sharded data parallel training for libtorch.
// Start at init, make_communicator_from_env and fully_shard (the front page).
namespace fsdp {

// ShardingStrategy itself is in fsdp/strategy.h.
const char* to_string(ShardingStrategy s);
// Accepts full|grad-op|none|hybrid|hybrid-zero2 and the enum names (also in
// lower case); throws fsdp::Error otherwise.
ShardingStrategy parse_strategy(const std::string& text);

// When backward all-gathers the next unit ahead of need. NONE: not at all;
// BACKWARD_PRE: as the current unit's backward starts; BACKWARD_POST: once
// its gradients are computed (less memory held at once, less overlap).
enum class BackwardPrefetch { NONE, BACKWARD_PRE, BACKWARD_POST };
// "none", "pre", "post".
const char* to_string(BackwardPrefetch p);

// The dtypes of compute and communication. The shards the optimizer updates
// stay fp32 (the master copy) whatever is set here.
struct MixedPrecision {
  // Dtype of the unsharded parameters: compute and all-gather. Undefined: fp32.
  c10::optional<torch::ScalarType> param_dtype;
  // Dtype of the gradient reduce-scatter / all-reduce. Undefined: param_dtype.
  c10::optional<torch::ScalarType> reduce_dtype;
  // Dtype of floating-point buffers. Undefined: unchanged.
  c10::optional<torch::ScalarType> buffer_dtype;
  // Whether parameters or gradient reductions are cast at all.
  bool enabled() const { return param_dtype.has_value() || reduce_dtype.has_value(); }
};

// Decides which submodules become their own unit. Applied bottom-up (children
// first); `unwrapped_numel` counts the module's parameters not already inside
// a nested unit. The root module is always a unit holding the rest.
struct WrapPolicy {
  // Asked per module, children first: (its path, the module, its parameters
  // not yet in a unit) -> whether it becomes a unit.
  using Fn = std::function<bool(const std::string& name, const torch::nn::Module& m,
                                int64_t unwrapped_numel)>;
  Fn fn;                    // empty: no auto-wrap (the whole model is one unit)
  std::string description;  // for messages and the unit table

  // No auto-wrap: the whole model is one unit, the root.
  static WrapPolicy none();
  // A unit per module with at least `min_num_params` parameters not already
  // inside a nested unit.
  static WrapPolicy size_based(int64_t min_num_params);
  // A unit per module `fn` accepts; `description` names the policy in messages.
  static WrapPolicy predicate(Fn fn, std::string description = "custom predicate");
  // One unit per module of type Impl (e.g. a transformer block).
  template <class Impl>
  static WrapPolicy module_type(std::string type_name = "module type") {
    return predicate([](const std::string&, const torch::nn::Module& m,
                        int64_t) { return dynamic_cast<const Impl*>(&m) != nullptr; },
                     "by " + type_name);
  }
  // "block" style helpers are in the examples; "size:N" parses to size_based.
};

// Which modules recompute their forward in backward instead of keeping
// their activations.
//
// Activation recomputation, also called activation checkpointing
// (docs/DESIGN.md#activation-checkpointing; not to be confused with the
// checkpoint files of fsdp/checkpoint.h): the selected modules keep only
// their inputs (and the CPU generator's state) from forward; their forward
// runs again in backward, right before autograd differentiates it, and
// their activations live only for that moment. The gradients are the same,
// bit for bit (torch.utils.checkpoint's semantics
// with use_reentrant=False: each parameter's gradient reaches its
// accumulator once, through the forward's graph, and torch::autograd::grad
// works too; the CPU generator is restored, so dropout draws the same
// masks). A selected module must be called through
// fsdp::call (or be a child of a Sequential), like a unit's root. When it is
// a unit, its recompute runs inside the unit's backward all-gather: one
// all-gather for recompute and backward together.
//
// `fn` is asked once per module of the tree (pre-order, the root excluded);
// of the modules it accepts, every `every`-th is recomputed: the 1st, the
// (every+1)-th, ... (every = 1: all of them).
struct RecomputePolicy {
  // Asked per module: (its path, the module) -> whether it is a candidate.
  using Fn = std::function<bool(const std::string& name, const torch::nn::Module& m)>;
  Fn fn;                    // empty: no recomputation
  int every = 1;            // >= 1
  // Names the policy in messages and the unit table.
  std::string description = "none";

  // Whether any module may be recomputed (fn is set).
  bool enabled() const { return static_cast<bool>(fn); }
  // No recomputation.
  static RecomputePolicy none() { return {}; }
  // Every module `fn` accepts; `description` names the policy in messages.
  static RecomputePolicy predicate(Fn fn, std::string description = "custom predicate") {
    return RecomputePolicy{std::move(fn), 1, std::move(description)};
  }
  // Every module of type Impl (e.g. each transformer block).
  template <class Impl>
  static RecomputePolicy module_type(std::string type_name = "module type") {
    return predicate([](const std::string&, const torch::nn::Module& m) { return dynamic_cast<const Impl*>(&m) != nullptr; },
                     "every " + type_name);
  }
  // Every k-th module of type Impl: the 1st, the (k+1)-th, ... (k = 1: all).
  template <class Impl>
  static RecomputePolicy every_kth(int k, std::string type_name = "module type") {
    RecomputePolicy p = module_type<Impl>(type_name);
    p.every = k;
    p.description = k == 1 ? "every " + type_name : "every " + std::to_string(k) + "th " + type_name;
    return p;
  }
};
// The former name of RecomputePolicy, kept for one release.
using CheckpointPolicy [[deprecated("renamed fsdp::RecomputePolicy")]] = RecomputePolicy;

// The type of the deprecated FsdpOptions::checkpoint: a RecomputePolicy
// whose setting warns, while options that hold it copy without a warning
// (FsdpOptions stays an aggregate: designated initializers work).
struct DeprecatedRecomputePolicy : RecomputePolicy {
  // Unset: no recomputation.
  DeprecatedRecomputePolicy() = default;
  // Setting it warns: the field is renamed FsdpOptions::recompute.
  [[deprecated("FsdpOptions::checkpoint is renamed FsdpOptions::recompute")]] DeprecatedRecomputePolicy(
      RecomputePolicy p)
      : RecomputePolicy(std::move(p)) {}
};

// How fully_shard wraps a model. The defaults: FULL_SHARD, the whole model
// one unit, fp32 throughout, no prefetch, no recomputation.
struct FsdpOptions {
  // What is sharded and what is replicated (fsdp/strategy.h).
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  // Where the flat parameters, the all-gather outputs, the gradient buffers
  // and the optimizer's shards live: the CPU, or a CUDA device (cuda:K;
  // "cuda" without an index: cuda:LOCAL_RANK, the communicator's
  // local_rank()). On a GPU, all-gathers and reduce-scatters run on streams
  // of their own, ordered against the compute stream with events; the
  // module's buffers move there too, and its inputs must be put there by
  // the program. CUDA support is loaded on this request (fsdp/device.h);
  // a device this process cannot use is an fsdp::Error.
  c10::Device device = c10::kCPU;
  // Which submodules become units: fewer, larger units mean fewer
  // collectives but a larger unsharded unit in memory (P_block).
  WrapPolicy wrap = WrapPolicy::none();
  // Compute and communication dtypes.
  MixedPrecision mixed_precision;
  // Overlap (docs/DESIGN.md#prefetch): all-gather the next unit early.
  BackwardPrefetch backward_prefetch = BackwardPrefetch::NONE;
  // In forward, all-gather the next unit (in the order of the first
  // forward) while the current one computes.
  bool forward_prefetch = false;
  // Units (other than the root) unsharded at once, the computing one included:
  // 2 lets one prefetch run ahead; 1 turns prefetch off.
  int limit_all_gathers = 2;
  // Broadcast parameters and buffers from rank 0 when wrapping.
  bool sync_module_states = true;
  // Reduce-scatter asynchronously; waited for before the optimizer needs it.
  bool async_reduce = true;
  // Initial values by name (fsdp/param_init.h), applied while wrapping, unit
  // by unit: each parameter is made at full size once, initialised, and only
  // this rank's slice kept; buffers are made and initialised in full. No
  // broadcast is needed (sync_module_states is then ignored): the ranks'
  // values agree by construction, which a checksum per unit verifies.
  // Required for a model built under fsdp::DeferredInit (fsdp/deferred.h);
  // empty: the module's own values (rank 0's, with sync_module_states).
  ParamInit param_init;
  // HYBRID_SHARD / HYBRID_SHARD_ZERO2: ranks per shard group, the groups
  // being consecutive ranks [g*S, (g+1)*S) (one host under `fsdp run
  // --nnodes`). 0: the communicator's local_world_size() (the ranks of one
  // host). Must divide the world size; ignored by the other strategies.
  int shard_group_size = 0;
  // Modules whose forward is recomputed in backward (activation
  // checkpointing).
  RecomputePolicy recompute = RecomputePolicy::none();
  // The former name of `recompute`, kept for one release and still honoured:
  // used when it is set and `recompute` is not; setting both to different
  // policies is an error (fully_shard and validate() throw fsdp::Error).
  // Two policies are the same when their `every`, their `description` and
  // the type of their `fn` agree (a std::function cannot be compared).
  // Setting it warns (-Wdeprecated-declarations); copying options does not.
  DeprecatedRecomputePolicy checkpoint;

  // Throws fsdp::Error naming the bad field.
  void validate() const;
};

// One unit of a wrapped model: the original parameters flattened into one
// buffer, and its sizes (FullyShardedModel::units).
struct UnitInfo {
  // Its position in units(); 0 is the root.
  int index = 0;
  std::string name;  // module path, "" for the root ("<root>" in tables)
  // The original parameters it holds, by the unwrapped model's names.
  std::vector<std::string> param_names;
  int64_t numel = 0;         // original parameters in this unit
  int64_t padded_numel = 0;  // multiple of world size
  int64_t shard_numel = 0;   // padded_numel / world size
  int64_t unsharded_bytes = 0;  // padded_numel * sizeof(param_dtype): its P_block
  int64_t shard_bytes = 0;      // shard_numel * 4 (fp32 master)
};

// This rank's slice of one original parameter: elements [lo, hi) of the
// flattened original tensor. `tensor` is what the optimizer owns (a 1-D leaf
// view into the unit's shard; may have 0 elements on some ranks).
struct NamedShard {
  std::string name;               // the unwrapped model's parameter name
  // The original tensor's shape.
  std::vector<int64_t> full_shape;
  // This rank's elements of the flattened original: [lo, hi), hi == lo for none.
  int64_t lo = 0, hi = 0;
  // The unit holding it (UnitInfo::index).
  int unit = 0;
  // The 1-D view the optimizer owns, into the unit's shard (its storage).
  torch::Tensor tensor;
};

// The FSDP guide's ledger (docs/GUIDE.md), measured on this rank (bytes).
struct Ledger {
  // Ranks of the run (N).
  int world_size = 1;
  // The sharding strategy's name (to_string).
  std::string strategy;
  int64_t total_numel = 0;    // original parameters of the whole model
  int64_t P_full = 0;         // unsharded parameter bytes (fp32)
  int64_t P = 0;              // resident parameter bytes on this rank (shards + kept replicas)
  int64_t G = 0;              // resident gradient bytes (sharded grads)
  int64_t O = 0;              // optimizer state bytes (when an optimizer is given)
  int64_t P_block = 0;        // largest unit's unsharded bytes
  std::string P_block_unit;   // its name
  int64_t A = 0;              // activation bytes of the last forward (measured)
  int64_t A_recompute = 0;    // the most one recompute (activation checkpointing) added in backward (measured;
                              // with units inside the checkpointed module, their gathered parameters too)
  int64_t C = 0;              // snapshot of the last background checkpoint save (CheckpointOptions::async),
                              // held while it writes, beside training's terms (measured)
  // The allocator of FsdpOptions::device that A, A_recompute and the three
  // below are measured on: "counting allocator" (CPU: fsdp's, 0 without
  // fsdp::init) or "caching allocator of cuda:K" (the GPU's own).
  std::string memory_source = "counting allocator";
  int64_t peak = 0;           // that allocator's peak held since reset
  int64_t current = 0;        // held now
  int64_t cached = 0;         // allocator cache now: freed blocks kept for reuse (not in peak/current)
  int64_t rss_peak = 0;       // the process's resident high-water mark (VmHWM; 0 where unknown)
  memory::ProcessMemory process;  // VmHWM's parts: libtorch at start, tensors, cache, comm, malloc, the rest
  // Bytes this rank sent so far (the world's counters, its groups included;
  // since the last reset_counters()), by tier: to ranks on this host / on others.
  int64_t sent_intra_host = 0, sent_inter_host = 0;
  int shard_group_size = 0;   // ranks a unit is sharded over (HYBRID: S; else N)
  // Host-shared units (Communicator::shares_host_memory): the units' full
  // parameters in the parameter dtype, held once per host and mapped by its
  // host_ranks ranks; this rank's share is shared_per_host / host_ranks (on
  // one host, in fp32, that share is P's shards, not more). 0: none.
  int64_t shared_per_host = 0;
  // The ranks of the shard group on this host, which map shared_per_host
  // (one host: shard_group_size; hosts composed in tiers: fewer).
  int host_ranks = 0;
  // Host-shared units: this rank's own memory that its host's peers read
  // the unsharded gradients from (Communicator::peer_memory_bytes): the
  // blocks backward writes each unit's gradients into, kept from step to
  // step for the next backward, so resident for the whole run (about the
  // gradient buffers in flight at once: the root unit's and two others', in
  // the reduce dtype, page-rounded). Not in the allocator's peak. 0: none.
  int64_t peer_memory = 0;
  // The planner's prediction (fsdp::plan::make_plan, the one place a peak is
  // computed) for this run's units and options, with O, A and A_recompute
  // as measured here.
  int64_t predicted_rest = 0;  // the plan's rest: (P+G+O)/N (NO_SHARD: P+G+O)
  int64_t predicted_peak = 0;  // the plan's peak: rest + its working set + A (+ C), at its worst moment
  // A measurement that cannot be (a negative A) or a prediction that could
  // not be made, said in plain words: the ledger reports it (str() prints
  // it) and plans with what it can; it never fails the run it measures.
  std::vector<std::string> notes;
  std::string str() const;     // the table printed by the examples
};

namespace trace {
class Span;
}
namespace detail {
class Engine;        // src/unit/engine.h
class Unit;          // src/unit/unit.h
class EngineAccess;  // src/unit/engine_access.h: the state-dict code's view
}  // namespace detail

// The engine of one wrapped model: owns the units, their flat buffers, the
// hooks. Obtained from fully_shard(); used through Sharded<M>'s operator->.
class FullyShardedModel {
 public:
  // Collective: every rank wraps the same module tree. Call fully_shard(),
  // which also keeps the module holder for forward.
  FullyShardedModel(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FsdpOptions opts);
  ~FullyShardedModel();
  FullyShardedModel(const FullyShardedModel&) = delete;
  FullyShardedModel& operator=(const FullyShardedModel&) = delete;

  // The local shards: what an optimizer owns (one 1-D leaf per original
  // parameter, in named_parameters() order; empty slices included so every
  // rank has the same list).
  std::vector<torch::Tensor> parameters() const;
  // The same shards with their original names, shapes and ranges (what
  // checkpoints and param_groups read), in the same order.
  std::vector<NamedShard> named_shards() const;

  // The scope no_sync() opens; it ends when the guard is destroyed.
  //
  // Gradient accumulation without communication: inside the scope gradients
  // stay unsharded and accumulate locally; the first backward outside it
  // reduce-scatters the sum. Costs the unsharded gradients' memory.
  class NoSyncGuard {
   public:
    // Starts the scope on `m`; no_sync() makes one.
    explicit NoSyncGuard(FullyShardedModel* m);
    ~NoSyncGuard();
    // Takes the scope over; the moved-from guard ends nothing.
    NoSyncGuard(NoSyncGuard&& o) noexcept : m_(o.m_), prev_(o.prev_) { o.m_ = nullptr; }
    NoSyncGuard(const NoSyncGuard&) = delete;

   private:
    FullyShardedModel* m_;
    bool prev_;
  };
  // Keep the guard alive across the accumulating micro-steps' backward.
  NoSyncGuard no_sync() { return NoSyncGuard(this); }

  // Waits for pending reductions, then scales all gradient shards so the
  // global norm (over all ranks) is at most max_norm. Returns the norm before
  // clipping. Collective: every rank must call it.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  // Blocks until every asynchronous reduce-scatter has landed in the shard
  // gradients. Called by clip_grad_norm and ledger; call it yourself before
  // reading gradients (optimizer.step() after backward() is safe: backward
  // waits at its end).
  void wait_pending();

  // The units, the root first.
  std::vector<UnitInfo> units() const;
  std::string describe_units() const;  // a table: unit, #params, bytes, shard
  // The modules whose forward is recomputed in backward (FsdpOptions::recompute), by path.
  std::vector<std::string> recomputed() const;
  // The former name of recomputed(), kept for one release.
  [[deprecated("renamed FullyShardedModel::recomputed")]] std::vector<std::string> checkpointed() const {
    return recomputed();
  }

  // Measured ledger; pass the optimizer to count its state O.
  Ledger ledger(const torch::optim::Optimizer* opt = nullptr) const;

  // Gathers the full parameters (and buffers) in the unwrapped model's names.
  // Only rank `to_rank` receives tensors (others get an empty list), unit by
  // unit so it never holds more than the output plus one unit; -1: all ranks.
  std::vector<std::pair<std::string, torch::Tensor>> full_state(int to_rank = 0) const;

  // The options it was wrapped with.
  const FsdpOptions& options() const;
  // The communicator it was wrapped with: every rank of the run.
  const CommPtr& comm() const;
  // The communicator of this rank's shard group (the units' all-gathers and
  // reduce-scatters): comm() itself except under HYBRID_SHARD*, where it is
  // the S ranks holding one copy of the model between them.
  const CommPtr& shard_group() const;
  // HYBRID_SHARD*: the R = N/S ranks that hold the same shard (one per
  // shard group), across which the shards' gradients are all-reduced; null
  // for the other strategies.
  const CommPtr& replica_group() const;
  // The wrapped module tree. Its forward is called through the units
  // (Sharded::forward, fsdp::call), not directly.
  torch::nn::Module& module() const;

 private:
  friend class detail::EngineAccess;
  std::unique_ptr<detail::Engine> engine_;
};

// Throws fsdp::Error when `opt` holds tensors that are not this model's
// shards (e.g. an optimizer built on the unwrapped model's parameters, which
// FSDP frees between steps: it would train nothing), or when it cannot step
// on shards: LBFGS, whose line search and dot products span every element,
// with a strategy that splits the parameters across ranks.
void verify_optimizer(const FullyShardedModel& model, const torch::optim::Optimizer& opt);

// Runs module->forward(args...) through its unit when it is one; a plain call
// otherwise (so model code reads the same with and without FSDP).
template <class M, class... Args>
auto call(M module, Args&&... args) {  // M: a module holder or (shared) pointer, copied cheaply
  using Impl = std::remove_cv_t<std::remove_reference_t<decltype(*module)>>;
  if constexpr (std::is_base_of_v<torch::nn::SequentialImpl, Impl>) {
    std::vector<torch::nn::AnyValue> in;
    (in.emplace_back(torch::nn::AnyValue(std::forward<Args>(args))), ...);
    auto& seq = static_cast<torch::nn::SequentialImpl&>(*module);
    return detail::run_sequential(seq, std::move(in)).template get<torch::Tensor>();
  } else {
    torch::nn::Module* raw = detail::raw_module(module);
    detail::Unit* u = detail::unit_of(raw);
    detail::RecomputeSite* ck = detail::recompute_site(raw);  // FsdpOptions::recompute
    auto run = [&](auto&&... a) -> std::decay_t<decltype(module->forward(std::forward<decltype(a)>(a)...))> {
      if (ck) return detail::call_recomputed(*ck, module, std::forward<decltype(a)>(a)...);
      return module->forward(std::forward<decltype(a)>(a)...);
    };
    if (!u) return run(std::forward<Args>(args)...);
    detail::UnitCall c(u);
    try {
      auto out = run(detail::cast_arg(c, std::forward<Args>(args))...);
      std::vector<torch::Tensor> ts;
      detail::collect(ts, out);
      c.finish(ts);
      return out;
    } catch (...) {
      c.rethrow(std::current_exception());
    }
  }
}

// A wrapped model: forward() routes through the root unit; -> reaches the
// FullyShardedModel (parameters, no_sync, clip_grad_norm, ledger, ...).
template <class M>
class Sharded {
 public:
  // Made by fully_shard().
  Sharded(M module, std::shared_ptr<FullyShardedModel> impl)
      : module_(std::move(module)), impl_(std::move(impl)) {}
  // The module's forward through the root unit (fsdp::call).
  template <class... Args>
  auto forward(Args&&... args) {
    return call(module_, std::forward<Args>(args)...);
  }
  // The same as forward().
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  // The engine: parameters(), no_sync(), clip_grad_norm(), ledger(), ...
  FullyShardedModel* operator->() const { return impl_.get(); }
  // The engine, for functions that take a FullyShardedModel&.
  FullyShardedModel& operator*() const { return *impl_; }
  // The module holder it wraps.
  const M& module() const { return module_; }
  // The engine, shared: it lives as long as its last holder.
  std::shared_ptr<FullyShardedModel> shared() const { return impl_; }

 private:
  M module_;
  std::shared_ptr<FullyShardedModel> impl_;
};

// Wraps `module` (a module holder such as torch::nn::Sequential or a
// TORCH_MODULE, or a std::shared_ptr<Impl>): decides the units, broadcasts
// rank 0's parameters, shards them and frees the unsharded copies.
template <class M>
Sharded<M> fully_shard(M module, CommPtr comm, FsdpOptions opts = {}) {
  auto impl = std::make_shared<FullyShardedModel>(detail::shared_module(module), std::move(comm),
                                                  std::move(opts));
  return Sharded<M>(std::move(module), std::move(impl));
}

}  // namespace fsdp
