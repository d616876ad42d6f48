// fsdp-cpp: one step's state on a rank, listed once — the tensors that make
// a training step what it is: the shards the optimizer steps, the module's
// buffers and each parameter's optimizer state. A heal copies exactly these
// from a peer (src/replicas/); the checkpoints save the same rows.
// defines: OptimizerRow, StepListing, list_step, StagedStep
//
// Transfer order (the same on every rank of every group, so two ranks can
// move a listing as one sequence of tensors): every parameter shard in the
// optimizer's order (its param groups, then each group's params), every
// buffer in module().buffers() order, then for each parameter that has
// state its tensors in the optimizer kind's order (optimizer_state.h).
// The header (StepListing::header) says which parameters have state, their
// step counts and which tensors: what a receiver must know to allocate.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace fsdp {
class FullyShardedModel;
namespace detail {
struct OptimizerKind;
}

namespace state {

// One parameter's optimizer state as listed.
struct OptimizerRow {
  bool present = false;                // the optimizer holds state for this parameter
  int64_t step = 0;                    // its step count (0 for a kind that counts none)
  std::vector<std::string> names;      // the state tensors it keeps, in the kind's order
  std::vector<torch::Tensor> tensors;  // the same order; the optimizer's own (live) tensors
};

// A rank's step state, by reference: the tensors are the live ones.
struct StepListing {
  const detail::OptimizerKind* kind = nullptr;  // null: an optimizer with no table row keeps nothing listed
  std::vector<torch::Tensor> params;            // the optimizer's parameters (the shard views)
  std::vector<torch::Tensor> buffers;           // the module's buffers
  std::vector<OptimizerRow> optimizer;          // one per params[i]

  // Per parameter: null (no state) or {"step": n, "tensors": [names]}.
  nlohmann::json header() const;
  // Every tensor in transfer order (contiguous: a tensor that is not is
  // copied, so write into the live ones through StagedStep only).
  std::vector<torch::Tensor> tensors() const;
  // Bytes of tensors().
  int64_t bytes() const;
};

// The listing of `model` trained by `opt` (built on model.parameters()).
// Throws fsdp::Error when `opt` keeps state no rank can copy (LBFGS, an
// optimizer without a row: optimizer_state.h says what to do).
StepListing list_step(const FullyShardedModel& model, const torch::optim::Optimizer& opt);

// Another rank's step state, received into fresh tensors: the live state is
// untouched until install(), so a copy that fails half way leaves nothing
// torn. Holds the live listing's tensors (the model and the optimizer
// outlive it).
class StagedStep {
 public:
  // Fresh tensors shaped like `live`'s, with the optimizer rows the
  // source's header names. Throws fsdp::Error when the header does not
  // describe a step of this model and optimizer (another parameter count,
  // a state tensor this optimizer does not keep).
  StagedStep(const StepListing& live, const nlohmann::json& source_header);
  // The tensors to fill, in transfer order (contiguous).
  const std::vector<torch::Tensor>& tensors() const { return staged_; }
  int64_t bytes() const;
  // Copies the parameters and buffers into the live ones and replaces the
  // optimizer's state of every parameter. No collective; call it once every
  // tensor arrived.
  void install(torch::optim::Optimizer& opt) const;

 private:
  StepListing live_;
  nlohmann::json header_;
  std::vector<torch::Tensor> staged_;
};

}  // namespace state
}  // namespace fsdp
