// fsdp-cpp: the engine's state — units, their flat buffers, the step's phases.
//
// defines: ParamSlot, Unit, UnitState, TrainingState, ShardedState
//
// The data's path through one step, and where each stage lives:
//   wrap       src/wrap/wrap.cpp         module tree -> units (policy, tied params)
//   shard      src/shard/flat_param.cpp  flat buffer, padding, shard, views
//   all-gather src/unit/unshard.cpp      unshard / reshard, prefetch
//   compute    src/unit/unit_call.cpp    pre/post-forward, pre-backward hooks
//   reduce     src/unit/reduce.cpp       post-backward reduce-scatter, no_sync
//   optimizer  src/unit/model.cpp        shard grads, global-norm clipping
//   observe    src/unit/model.cpp        the FSDP guide's ledger, measured
//   checkpoint src/unit/state_dict.cpp   shards <-> checkpoints; full state to one rank
#pragma once

#include <torch/torch.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/fully_shard.h"
#include "fsdp/trace.h"

namespace fsdp::detail {

// One original parameter inside a unit's flat buffer.
struct ParamSlot {
  std::string name;                  // canonical (first) name in the unwrapped model
  std::vector<std::string> aliases;  // further names of the same tensor (tied weights)
  torch::Tensor param;               // the module's parameter; its TensorImpl is never replaced
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  // in the unit's flat buffer
  bool requires_grad = true;
  // Kept alive so the post-hook below fires (libtorch only fires hooks of
  // accumulators that someone holds).
  std::shared_ptr<torch::autograd::Node> accumulator;
  // This rank's slice of the flattened parameter: [lo, hi) in param-local
  // elements; `shard_view` is the optimizer's leaf over shard[lo+offset-r*S ..].
  int64_t lo = 0, hi = 0;
  torch::Tensor shard_view;
};

enum class UnitState {
  SHARDED,     // only the shard is resident; `full` has no storage
  UNSHARDING,  // all-gather issued (prefetch); wait on `gather_work` before use
  UNSHARDED,   // `full` holds every rank's shard; module params are usable
};

enum class TrainingState {
  IDLE,
  FORWARD,        // inside its forward
  FORWARD_DONE,   // forward ran with grad enabled: a backward will come
  BACKWARD,       // pre-backward hook fired: autograd is writing the params' .grad
  BACKWARD_DONE,  // post-backward ran (reduced, or kept for no_sync)
};

struct Unit {
  // Constant after construction.
  int index = 0;
  std::string name;  // module path; "" for the root
  torch::nn::Module* module = nullptr;
  Unit* parent = nullptr;  // enclosing unit (nullptr for the root)
  class ShardedState* owner = nullptr;
  std::vector<ParamSlot> params;
  int64_t numel = 0, padded_numel = 0, shard_numel = 0;
  torch::ScalarType param_dtype = torch::kFloat32;
  torch::ScalarType reduce_dtype = torch::kFloat32;
  bool reshard_after_forward = true;  // FULL_SHARD
  bool keeps_unsharded = false;       // NO_SHARD: `full` always resident
  bool aliased = false;               // NO_SHARD in fp32: full and shard are one tensor
  int n_grad_params = 0;

  // Tensors (docs/DESIGN.md#vocabulary).
  torch::Tensor shard;       // fp32 [S]: the master shard, optimizer-owned through shard_views
  torch::Tensor shard_grad;  // fp32 [S]: reduced gradients, views handed to shard_views' .grad
  torch::Tensor full;        // param_dtype [padded]: all-gather output; storage freed when SHARDED
  torch::Tensor full_grad;   // param_dtype [padded]: unsharded grads kept under no_sync; undefined otherwise
  torch::Tensor gather_input;  // param_dtype [S] cast of `shard` while an all-gather is in flight

  // Protected by the caller's thread (hooks and forward run on the
  // autograd / caller thread; the comm thread only touches tensors it was
  // handed, until its Work completes).
  UnitState state = UnitState::SHARDED;
  TrainingState training = TrainingState::IDLE;
  WorkPtr gather_work;
  int grads_ready = 0;
  bool prefetched = false;
  std::unique_ptr<trace::Span> backward_span;  // pre_backward .. post_backward

  bool empty() const { return numel == 0; }
  std::string display_name() const { return name.empty() ? "<root>" : name; }
};

// A reduce-scatter (NO_SHARD: all-reduce) in flight. Its input, the unit's
// flat unsharded gradients, is held by the communicator alone and freed the
// moment the collective completes; `output` is then added into the unit's
// shard_grad (src/unit/reduce.cpp).
struct PendingReduce {
  Unit* unit;
  WorkPtr work;
  torch::Tensor output;
};

class ShardedState {
 public:
  ShardedState(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FsdpOptions opts);
  ~ShardedState();

  // --- stages (each defined in the file named in the header comment) ---
  void build_units();                        // wrap.cpp
  void init_flat_params(Unit& u);            // flat_param.cpp
  void unshard(Unit& u);                     // unshard.cpp: blocking
  void unshard_async(Unit& u);               // unshard.cpp: issue only
  void wait_unsharded(Unit& u);              // unshard.cpp
  void reshard(Unit& u);                     // unshard.cpp
  void prefetch_after(Unit& u, bool backward);  // unshard.cpp
  void pre_forward(Unit& u);                 // unit_call.cpp
  void post_forward(Unit& u, const std::vector<torch::Tensor>& outputs);
  void forward_failed(Unit& u);
  void pre_backward(Unit& u);                // unit_call.cpp (tensor hook)
  void on_grad_ready(Unit& u);               // reduce.cpp (accumulator post-hook)
  void post_backward(Unit& u);               // reduce.cpp
  void end_of_backward();                    // reduce.cpp (engine final callback)
  void wait_pending();                       // reduce.cpp
  void finish_reduces(size_t count);         // reduce.cpp: the oldest `count` pending
  void prepare_grads(Unit& u);               // reduce.cpp
  // state_dict.cpp: unit u's fp32 flat buffer [padded] assembled from every
  // rank's `shard_flat` [shard_numel] (the master shard, or optimizer state
  // laid out like it), on `to_rank` only (every rank when to_rank < 0);
  // undefined elsewhere. NO_SHARD: shard_flat is already the whole.
  torch::Tensor gather_unit(Unit& u, const torch::Tensor& shard_flat, int to_rank, const std::string& what);

  // --- data ---
  std::shared_ptr<torch::nn::Module> root;
  CommPtr comm;
  FsdpOptions opts;
  std::vector<std::unique_ptr<Unit>> units;  // units[0] is the root
  std::vector<Unit*> forward_order;           // recorded in the first forward
  bool forward_order_final = false;
  std::vector<PendingReduce> pending;
  bool no_sync = false;
  bool callback_queued = false;
  int depth = 0;  // nesting of unit calls on this thread
  int64_t root_forward_start_bytes = 0;
  int64_t activation_bytes = 0;  // measured A of the last root forward
  // Names of the unwrapped model, in named_parameters() order.
  std::vector<std::pair<std::string, ParamSlot*>> named_slots;

  Unit& root_unit() { return *units.front(); }
  int world() const { return comm->world_size(); }
  int rank() const { return comm->rank(); }
  int unsharded_prefetch_count() const;
  void publish_trace_metadata() const;  // model.cpp: the unit table for the report
};

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

// Registry of unit roots (module -> unit), filled at wrap, emptied at destruction.
void register_unit(const torch::nn::Module* m, Unit* u);
void unregister_unit(const torch::nn::Module* m);

}  // namespace fsdp::detail
