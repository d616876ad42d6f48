// fsdp-cpp: the engine of one wrapped model — what spans its units.
//
// defines: Engine
//
// The data's path through one step, and where each stage lives:
//   wrap       src/wrap/wrap.cpp         module tree -> unit descriptions (pure)
//   construct  src/unit/engine.cpp       descriptions -> units; the engine's tables
//   layout     src/unit/layout.cpp       flat buffer, padding (shard_math.h), views
//   unit       src/unit/unit.cpp         every checked transition of a unit
//   all-gather src/unit/prefetch.cpp     which unit unshards ahead of its use
//   compute    src/unit/unit_call.cpp    pre/post-forward, pre-backward hooks
//   reduce     src/unit/grad_reduce.cpp  the reductions in flight, no_sync, end of backward
//   hybrid     src/unit/hybrid.cpp       HYBRID's groups, the replicas' all-reduce
//   recompute  src/unit/recompute.cpp    activation recomputation: forward again in backward
//   optimizer  src/optim/                clipping, each optimizer's state (optimizer_state.h)
//   observe    src/unit/ledger.cpp       the ledger, measured, and the planner's prediction
//   checkpoint src/state/state_dict.cpp  shards <-> checkpoints (through engine_access.h)
//
// Each Unit (unit.h) owns its buffers and its state; the Engine keeps only
// what spans units: the units themselves, the forward order and the
// prefetch policy over it, the reductions in flight, no_sync, the
// end-of-backward callback. Its entry points are what the hooks call; each
// does the model-level part and runs the unit's checked transition.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint.h"
#include "unit/across.h"
#include "unit/device_streams.h"
#include "unit/memory_source.h"
#include "unit/unit.h"

namespace fsdp::detail {

// A module selected by FsdpOptions::recompute (src/unit/recompute.cpp).
// Made by Engine::build_recompute_sites; its fields never change after.
struct RecomputeSite {
  Engine* const engine;
  torch::nn::Module* const module;
  const std::string name;  // module path ("" never: the root is not recomputed)
  // The unit whose parameters its forward computes on: its own when it is a
  // unit's root, else the enclosing one. Its recompute runs while this unit
  // is unsharded for backward.
  Unit* const unit;
  // Its parameters that require grad, distinct: inputs of the recompute's
  // autograd node, so their gradients reach their accumulators once, as
  // without recomputation.
  const std::vector<torch::Tensor> params;
};

struct WrapDescription;  // src/wrap/wrap.h

class Engine {
 public:
  Engine(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FsdpOptions opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // --- Entry points of the hooks (unit_call.cpp, grad_reduce.cpp) ---
  void pre_forward(Unit& u);  // fsdp::call, before the module's forward
  void post_forward(Unit& u, const std::vector<torch::Tensor>& outputs);
  void forward_failed(Unit& u);
  void pre_backward(Unit& u);   // tensor hook on the unit's outputs (and a recompute's start)
  void on_grad_ready(Unit& u);  // accumulator post-hook of each parameter
  void end_of_backward();       // autograd engine's final callback
  // Activation recomputation (recompute.cpp): the recompute of `s`'s forward
  // in backward. begin: its unit is (made) BACKWARD and unsharded, nothing
  // is gathered again; while it runs, units called inside it keep their
  // parameters for the backward that follows at once and prefetch nothing.
  void begin_recompute(RecomputeSite& s);
  void end_recompute(RecomputeSite& s);
  // Waits for every pending reduction and folds it into the shard grads.
  void wait_pending();
  // Waits until the kept background save's snapshot is copied (its thread
  // copies it with CheckpointOptions::snapshot_on_thread): end_of_backward,
  // before the optimizer step that follows can change a shard.
  void wait_for_snapshot();

  // --- Constant: made by the constructor's initializers, in this order,
  // before the engine is registered anywhere ---
  const std::shared_ptr<torch::nn::Module> root;
  const CommPtr comm;  // the world it was wrapped on: buffers, state dicts, checkpoint files
  // The options, validated, the deprecated FsdpOptions::checkpoint already
  // folded into `recompute` (adopt_deprecated_checkpoint, below).
  const FsdpOptions opts;
  // GPU: the all-gather and reduce streams (device_streams.h); inactive on
  // the CPU.
  DeviceStreams streams{opts.device};
  // The allocator of opts.device: what the ledger's measured terms read
  // (memory_source.h). Replaced only by a test (EngineAccess).
  std::unique_ptr<MemorySource> memory_source{memory_source_for(opts.device)};
  const CommPtr shard_comm;    // the units' collectives: comm, or HYBRID's shard group (make_groups)
  const CommPtr replica_comm;  // HYBRID: the ranks holding this rank's shard; null otherwise
  // Pre-order; units[0] is the root (build_units). The set is fixed; each
  // unit's state is its own.
  const std::vector<std::unique_ptr<Unit>> units;
  // Names of the unwrapped model, in named_parameters() order (name_slots).
  const std::vector<std::pair<std::string, const ParamSlot*>> named_slots;
  // The modules whose forward is recomputed in backward, in pre-order
  // (build_recompute_sites).
  const std::vector<std::unique_ptr<RecomputeSite>> recompute_sites;

  // --- Protected by the caller's thread ---
  std::vector<Unit*> forward_order;  // recorded in the first forward
  bool forward_order_final = false;
  std::vector<PendingReduce> pending;  // issue order
  bool no_sync = false;
  // A unit finished a backward under no_sync: gradients accumulate unsharded
  // across micro-steps in this job (what the ledger plans with).
  bool accumulated_no_sync = false;
  bool callback_queued = false;
  int depth = 0;  // nesting of unit calls on this thread
  int64_t root_forward_start_bytes = 0;
  int64_t activation_bytes = 0;  // measured A of the last root forward
  // Activation recomputation.
  int recompute_depth = 0;       // recomputes running on this thread (nested ones count)
  // First forwards of recomputed modules running (grad mode off, their
  // backward comes with the recompute): units called inside one are treated
  // as having a backward to come (SHARD_GRAD_OP keeps them gathered for it).
  int recompute_forward_depth = 0;
  int64_t recompute_bytes = 0;   // the most one recompute's forward added (measured)
  int64_t recomputed_calls = 0;  // calls of selected modules that ran recomputable
  bool warned_unrouted = false;

  // --- Background checkpoints (state_dict.cpp, CheckpointOptions::async) ---
  // Split from `comm` at the first background save; carries only those.
  CommPtr checkpoint_comm;
  // The newest background save, until it is waited for (the next save or
  // load, wait_for_checkpoint, or this engine's destruction).
  std::unique_ptr<ckpt::BackgroundSave> background_save;
  int64_t snapshot_bytes = 0;  // the last background save's snapshot: the ledger's C

  Unit& root_unit() { return *units.front(); }
  int world() const { return comm->world_size(); }
  int rank() const { return comm->rank(); }
  // Ranks a unit is sharded over: N, or HYBRID's group size S.
  int shard_world() const { return shard_comm->world_size(); }
  // The rank of shard_comm that is global rank `world_rank`; -1 when that
  // rank is in another shard group.
  int shard_rank_of(int world_rank) const;
  // Whether a pending reduction is complete: HYBRID issues the shard's
  // all-reduce across replicas here once its reduce-scatter finished (in
  // pending order, so every replica issues them in the same order).
  bool reduce_finished(PendingReduce& p);
  // Waits for it (issuing the stages after the reduce first); rethrows its
  // error.
  void wait_reduce(PendingReduce& p);
  // Issues the stages after the reduce that can start: HYBRID's all-reduce
  // across the replicas once a reduce-scatter completed, the mean across
  // replica groups once the stage before it completed. Each stage in issue
  // order: one is never issued before every older reduction's (the ranks
  // it meets issue them in the same order).
  void issue_stages();
  // Replica groups (fsdp/replicas.h, src/replicas): the mean of a unit's
  // reduced shard across the step's groups, as backward goes on. Set by
  // ReplicaGroups for a step (unit/across.h), empty
  // otherwise. Its work never throws: a failure is the step's vote.
  AcrossFn across;

  // recompute.cpp: entered in (removed from) the process's table of sites
  // that fsdp::call looks modules up in (Registration).
  void register_recompute_sites();
  void unregister_recompute_sites();
  // A training forward ran no recomputed call although the policy selected
  // modules: warns once (they were not called through fsdp::call).
  void check_recompute_routed();

 private:
  // The constructor's arguments checked and validated (engine.cpp), the
  // groups made and the wrap described: what the constant members are
  // initialised from.
  struct Checked;
  static Checked check(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FsdpOptions opts);
  explicit Engine(Checked c);
  struct Groups {
    CommPtr shard, replica;
  };
  // hybrid.cpp: shard_comm and replica_comm (HYBRID splits the world).
  static Groups make_groups(const CommPtr& comm, const FsdpOptions& opts);
  // engine.cpp: the described units, materialised (after the groups).
  std::vector<std::unique_ptr<Unit>> build_units(const WrapDescription& d);
  // engine.cpp: named_parameters() order -> the slots of `built`.
  static std::vector<std::pair<std::string, const ParamSlot*>> name_slots(
      const WrapDescription& d, const std::vector<std::unique_ptr<Unit>>& built);
  // recompute.cpp: FsdpOptions::recompute -> sites (after the units).
  std::vector<std::unique_ptr<RecomputeSite>> build_recompute_sites();

  // prefetch.cpp: the prefetch policy over the recorded forward order.
  int unsharded_prefetch_count() const;
  void prefetch_after(Unit& u, bool backward);
  // grad_reduce.cpp
  void post_backward(Unit& u);
  void fold_finished_reduces();      // the ones already completed
  void finish_reduces(size_t count);  // the oldest `count`, waiting
  void publish_trace_metadata() const;  // engine.cpp: the unit table for the report

  // The engine's entries in the process's tables (units by module for
  // fsdp::call, recompute sites, the OOM explainer). Made by the last line
  // of the constructor, once nothing can throw any more, and declared last
  // so it is destroyed first: a construction that fails leaves no entry
  // behind, and a destroyed engine none either.
  struct Registration {
    explicit Registration(Engine& e);
    ~Registration();
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    Engine& e;
  };
  std::optional<Registration> registration_;
};

// `o` with the deprecated FsdpOptions::checkpoint folded into
// FsdpOptions::recompute (which it replaces when only it is set) and reset
// to its default. Throws fsdp::Error when both are set to different
// policies. The one place the library reads the deprecated field
// (options.cpp; FsdpOptions::validate and Engine::check call it).
FsdpOptions adopt_deprecated_checkpoint(FsdpOptions o);

}  // namespace fsdp::detail
