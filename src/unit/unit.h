// fsdp-cpp: one unit — its flat buffers and its life through a step.
//
// defines: ParamSlot, UnitState, TrainingState, Unit, PendingReduce
//
// A Unit (like PyTorch FSDP2's FSDPParamGroup) owns one all-gather and one
// reduce-scatter: its parameters' flat buffer, its shard, and the two state
// machines below. Each transition is a method that checks the state it starts
// from; an illegal one is an internal error (file:line, rank, the unit, the
// state it was in and the states expected), never a silent return. What spans
// units (forward order, prefetch, pending reductions, no_sync, the
// end-of-backward callback) is the Engine's (src/unit/engine.h).
//
// Where it lives: the constructor (the layout) and init_flat_param (its
// first tensors) in src/unit/layout.cpp; every transition below in
// src/unit/unit.cpp.
#pragma once

#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/trace.h"

namespace fsdp::detail {

class Engine;
struct ParamSlot;
// The name, module and local name a ParamInit sees for a slot.
using InitTargetOf = std::function<InitTarget(const ParamSlot&)>;

// One original parameter inside a unit's flat buffer.
struct ParamSlot {
  std::string name;                     // canonical (first) name in the unwrapped model
  std::vector<std::string> tied_names;  // further names of the same tensor (tied weights)
  torch::Tensor param;               // the module's parameter; its TensorImpl is never replaced
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  // in the unit's flat buffer
  bool requires_grad = true;
  // Kept alive so the post-hook below fires (libtorch only fires hooks of
  // accumulators that someone holds).
  decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>())) accumulator;
  // This rank's slice of the flattened parameter: [lo, hi) in param-local
  // elements (shard::param_range); `shard_view` is the optimizer's leaf over
  // shard[offset + lo - shard_begin ..].
  int64_t lo = 0, hi = 0;
  torch::Tensor shard_view;
};

// Where the unit's parameters are.
enum class UnitState {
  SHARDED,     // only the shard is resident; `full` has no storage
  UNSHARDING,  // all-gather issued (prefetch); wait_for_unshard() before use
  UNSHARDED,   // `full` holds every rank's shard; module params are usable
};

// Where the unit is in the step.
enum class TrainingState {
  IDLE,
  FORWARD,        // inside its forward
  FORWARD_DONE,   // forward ran with grad enabled: a backward will come
  BACKWARD,       // in backward: autograd is writing the params' .grad
  BACKWARD_DONE,  // post-backward ran (reduced, or kept for no_sync)
};

const char* to_string(UnitState s);
const char* to_string(TrainingState s);

// A reduce-scatter (NO_SHARD: all-reduce; HYBRID: then an all-reduce) in flight. Its input, the unit's
// flat unsharded gradients, is held by the communicator alone and freed the
// moment the collective completes; `output` is then added into the unit's
// shard_grad (Unit::accept_reduced).
struct PendingReduce {
  class Unit* unit;
  WorkPtr work;
  torch::Tensor output;
  // HYBRID: the all-reduce (AVG) of `output` across the replicas, issued once
  // `work` completed (Engine::reduce_finished); null before and otherwise.
  WorkPtr replica_work;
  // GPU only: the reduce input (the unit's flat gradients), allocated on the
  // compute stream and read on the reduce stream (a bf16 widening, a
  // staging copy, a world of one's copy). Held until wait_reduce has
  // ordered compute after the reduce: freed earlier, its block could be
  // handed to the next unit's backward while the reduce still reads it.
  // On the CPU the communicator's thread holds it and frees it the moment
  // the transfer completed.
  torch::Tensor input;
  // Replica groups (fsdp/replicas.h): the mean of `output` across the
  // step's groups (Engine::across), issued once the stages before it
  // completed; null before, and when no step of replica groups runs.
  WorkPtr across_work;
};

class Unit {
 public:
  // Its place in the model (src/wrap/wrap.cpp), its parameters (each
  // slot's name, tied names and param; the constructor lays them out back
  // to back) and the options: everything below that is const is fixed here
  // (src/unit/layout.cpp). The tensors come with init_flat_param.
  Unit(int index, std::string name, torch::nn::Module* module, Unit* parent, Engine* owner, Communicator* comm,
       std::vector<ParamSlot> slots, const FsdpOptions& opts);
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  // --- Constant: given to the constructor ---
  const int index;
  const std::string name;  // module path; "" for the root
  torch::nn::Module* const module;
  Unit* const parent;    // enclosing unit (nullptr for the root)
  Engine* const owner;   // outlives the unit
  Communicator* const comm;  // the owner's shard group
  // Where its tensors live (FsdpOptions::device, resolved by the engine):
  // shard, shard_grad, full, full_grad and the reduce buffers.
  const c10::Device device;

  // --- Constant: the flat layout, fixed by the constructor from the
  // parameters, the options and the shard group (shard::flat_layout) ---
  const int64_t numel;         // the parameters' elements, back to back
  const int64_t padded_numel;  // numel rounded up to a multiple of the group (NO_SHARD: numel)
  const int64_t shard_numel;   // this rank's share of padded_numel
  const int64_t shard_begin;   // where this rank's shard starts in the padded buffer
  const torch::ScalarType param_dtype;
  const torch::ScalarType reduce_dtype;
  const bool reshard_after_forward;  // FULL_SHARD, HYBRID_SHARD
  const bool keeps_unsharded;        // NO_SHARD: `full` always resident
  const bool full_is_shard;          // NO_SHARD in fp32: full and shard are one tensor
  // The shard group's ranks share one host's memory (Communicator::
  // shares_host_memory; FULL_SHARD, SHARD_GRAD_OP, HYBRID's shard group, on
  // the CPU): `full` is one piece of memory per host that every rank maps,
  // never freed; in fp32 `shard` is this rank's slice of it (the optimizer
  // updates it in place), otherwise each rank casts its shard into its
  // slice. The all-gather is then a barrier, reshard frees nothing (it
  // only marks the unit SHARDED, so the collectives are those of every
  // other path), and the gradients go to the reduce in peer memory
  // (Communicator::peer_tensor), summed where they lie.
  const bool host_shared;
  // host_shared and the gradients are reduced in the parameter dtype (no
  // cast on the way): backward writes them where the reduce sums them.
  // full_grad is then a block of peer memory taken (zeroed) in
  // pre_backward, every .grad points into it, autograd accumulates there in
  // place, and post_backward hands that very buffer to the reduce: no copy.
  // Otherwise (a cast to reduce_dtype) the cast writes into peer memory.
  const bool grads_in_peer_memory;
  const int n_grad_params;           // parameters that require grad
  // The parameters in flat-buffer order, read-only: the layout is the
  // constructor's, the views and hooks init_flat_param's.
  const std::vector<ParamSlot>& params() const { return params_; }

  // --- Tensors (docs/DESIGN.md#vocabulary) ---
  torch::Tensor shard;       // fp32 [S]: the master shard, optimizer-owned through shard_views
  torch::Tensor shard_grad;  // fp32 [S]: reduced gradients, views handed to shard_views' .grad
  torch::Tensor full;        // param_dtype [padded]: all-gather output; storage freed when SHARDED
  // param_dtype [padded]: unsharded grads kept under no_sync, and in every
  // backward when grads_in_peer_memory (a block of peer memory, the reduce
  // input); undefined otherwise
  torch::Tensor full_grad;

  bool empty() const { return numel == 0; }
  std::string display_name() const { return name.empty() ? "<root>" : name; }
  UnitState state() const { return state_; }
  TrainingState training() const { return training_; }

  // --- Transitions. Called on the caller / autograd thread only; the comm
  // thread touches only the tensors it was handed until its Work completes.

  // Builds the flat buffer from the module's parameters (rank 0's values
  // everywhere when opts.sync_module_states: one broadcast), keeps this
  // rank's shard, points the parameters at `full` and frees it (NO_SHARD:
  // keeps it). Leaves SHARDED (NO_SHARD: UNSHARDED), IDLE.
  // With opts.param_init (sharded construction, fsdp/param_init.h) the
  // values come from it, parameter by parameter, and only this rank's slice
  // is kept: no broadcast, and the unit is never unsharded here (a checksum
  // per rank checks that the ranks agree).
  void init_flat_param(const FsdpOptions& opts, const InitTargetOf& target_of);

  // SHARDED -> UNSHARDING: allocates `full` and issues its all-gather.
  // Idempotent: a no-op when already UNSHARDING / UNSHARDED, for an empty
  // unit and for NO_SHARD (always UNSHARDED). `prefetch` marks an all-gather
  // issued ahead of the unit's own use.
  void unshard(bool prefetch = false);
  // UNSHARDING -> UNSHARDED: waits for the all-gather. Idempotent: a no-op
  // in any other state.
  void wait_for_unshard();
  // UNSHARDING | UNSHARDED -> SHARDED: frees `full`'s storage (waiting first
  // for an in-flight all-gather, which writes into it). Idempotent: a no-op
  // when SHARDED, for an empty unit and for NO_SHARD.
  void reshard();

  // IDLE | FORWARD_DONE -> FORWARD (FORWARD_DONE: a second call in the same
  // forward): refreshes NO_SHARD's low-precision copy, unshards and waits.
  void pre_forward();
  // FORWARD -> FORWARD_DONE (will_backward) or IDLE: reshards when the
  // strategy frees parameters after forward or no backward will come.
  // `in_recompute`: the call is part of a recomputed module's recompute
  // in backward, whose backward follows at once: the parameters stay.
  void post_forward(bool will_backward, bool in_recompute = false);
  // Any state -> IDLE, resharded: the forward threw. Runs while the
  // exception unwinds, so it checks nothing.
  void forward_failed();
  // FORWARD_DONE -> IDLE: a forward whose backward never came (the next
  // iteration began). A no-op in any other state.
  void forget_forward();

  // IDLE | FORWARD_DONE -> BACKWARD: unshards (waiting for a prefetch), runs
  // `after_unshard` (the engine's prefetch and folding of finished
  // reductions), then points .grad into full_grad when gradients accumulate
  // under no_sync or are written in peer memory (grads_in_peer_memory: a
  // zeroed block taken here). Idempotent: returns false (and does nothing) when already
  // BACKWARD or BACKWARD_DONE, as the hook on each output fires it.
  bool pre_backward(const std::function<void()>& after_unshard);
  // One parameter's gradient landed (its accumulator's post-hook). Returns
  // true when this completes the unit's gradients (BACKWARD only). A
  // gradient that arrives without the pre-backward hook (its parameters were
  // used outside the outputs' graph) moves IDLE | FORWARD_DONE -> BACKWARD,
  // to be collected at the end of backward; other states ignore it.
  bool grad_ready();
  // FORWARD_DONE -> BACKWARD without unsharding (end of backward: a unit
  // that ran forward with grad but got no gradient still reduces, zeros).
  void join_backward();
  // BACKWARD -> BACKWARD_DONE: reshards (parameters first: their bytes go
  // before the gradient buffer arrives), then the gradients become the
  // reduce input: a zero-padded [padded] buffer in the reduce dtype, the
  // params' .grad dropped (grads_in_peer_memory: full_grad itself, where
  // backward wrote it). Under no_sync they are collected into full_grad
  // instead and the result is undefined; so it is without gradients.
  torch::Tensor post_backward(bool no_sync);
  // Issues the reduce-scatter (NO_SHARD: all-reduce, AVG) of `grads`, the
  // result of post_backward. Only the communicator keeps the input.
  PendingReduce reduce(torch::Tensor grads);
  // Adds a finished reduction's output into shard_grad (adopting it when the
  // optimizer dropped the previous gradients).
  void accept_reduced(const torch::Tensor& output);
  // IDLE | BACKWARD_DONE -> IDLE, resharded: the end-of-backward callback.
  void end_backward();

  // Activation recomputation: a recomputed module computing on this unit's
  // parameters runs its forward again in backward. BACKWARD and UNSHARDED
  // (pre_backward's all-gather, which the recompute shares with the
  // backward) -> the same, recomputing; nested recomputes count. While it
  // recomputes the unit must not reshard (an internal error). end_recompute
  // undoes one begin_recompute.
  void begin_recompute();
  void end_recompute();
  bool recomputing() const { return recompute_depth_ > 0; }

 private:
  [[noreturn]] void illegal(const char* file, int line, const char* transition, const std::string& was,
                            const std::string& expected) const;
  void expect(const char* file, int line, const char* transition, std::initializer_list<TrainingState> ok) const;
  void collect_into_full_grad();
  void init_shard_from(const ParamInit& init, const InitTargetOf& target_of, const torch::Tensor& home);
  torch::Tensor flat_grads_for_reduce();

  // Written by the constructor (layout) and init_flat_param (shard views,
  // accumulators) only.
  std::vector<ParamSlot> params_;
  // --- Protected by the caller's thread ---
  UnitState state_ = UnitState::SHARDED;
  TrainingState training_ = TrainingState::IDLE;
  WorkPtr gather_work_;         // the all-gather into `full` while UNSHARDING
  torch::Tensor gather_input_;  // param_dtype [S] cast of `shard`, alive until gather_work_ completes
  int grads_ready_ = 0;
  bool prefetched_ = false;
  int recompute_depth_ = 0;
  std::unique_ptr<trace::Span> backward_span_;  // pre_backward .. post_backward
};

// A tensor over elements [offset, offset + numel(shape)) of `base`'s storage,
// without being an autograd view of `base` (so optimizers may detach_() or
// replace its grad, and it can be a leaf): a parameter pointed into `full`,
// a shard view into `shard`, a .grad into `full_grad` or `shard_grad`. It
// keeps the storage alive, not `base`.
torch::Tensor storage_slice(const torch::Tensor& base, int64_t offset, c10::IntArrayRef shape);

// Labels the engine's own large allocations (a unit's all-gather output, its
// unsharded gradients) for the out-of-memory diagnosis (oom.cpp).
extern thread_local const char* g_alloc_purpose;
extern thread_local const Unit* g_alloc_unit;
struct AllocPurpose {
  AllocPurpose(const char* what, const Unit& u) {
    g_alloc_purpose = what;
    g_alloc_unit = &u;
  }
  ~AllocPurpose() {
    g_alloc_purpose = nullptr;
    g_alloc_unit = nullptr;
  }
};

// Registry of unit roots (module -> unit), filled at wrap, emptied at
// destruction (unit_call.cpp).
void register_unit(const torch::nn::Module* m, Unit* u);
void unregister_unit(const torch::nn::Module* m);

}  // namespace fsdp::detail
