// fsdp-cpp: what each optimizer keeps per parameter — one row per optimizer
// kind libtorch ships, read by everything that must know: the ledger (its O),
// the checkpoints (which tensors, under which names, rebuilt how) and
// verify_optimizer (what cannot step on shards). Which tensors a kind keeps
// is the torch-free table of common/optimizer_table.h, which the planner
// reads too; a row here adds what needs libtorch (the class, its state's
// tensors, how to rebuild it).
//
// defines: TensorOf, OptimizerKind, optimizer_kinds, kind_of, checkpoint_kind,
//          saved_tensors, GroupOptions, optimizer_state_bytes,
//          state_tensors_per_param
//
//   kind     checkpoint type  state tensors per parameter (as saved)          step
//   SGD      sgd              momentum_buffer (zeros without momentum)         -
//   Adam     adam             exp_avg, exp_avg_sq [, max_exp_avg_sq: amsgrad]  step
//   AdamW    adamw            the same (fsdp::FusedAdamW is an AdamW)          step
//   Adagrad  adagrad          sum                                              step
//   RMSprop  rmsprop          square_avg [, momentum_buffer: momentum > 0]     step
//                             [, grad_avg: centered]
//   LBFGS    refused          one state for all parameters (its history of flattened
//                             directions): no checkpoint can slice it, and it cannot
//                             step on shards split across ranks
// A checkpoint names each tensor "<parameter>.<state tensor>" and records the
// type in its train state ({"optimizer": {"type": ..., "step": {...}}});
// another optimizer (a program's own subclass of torch::optim::Optimizer) is
// refused by every save and load that is given it, before anything is read
// or written, and counts nothing in the ledger.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/optimizer_table.h"

namespace fsdp::detail {

// A parameter's state tensor by name (what a load read for it).
using TensorOf = std::function<torch::Tensor(const std::string& name)>;

// One optimizer kind. Rows are constant, made once (optimizer_kinds()).
struct OptimizerKind {
  // Its row of the torch-free table: which tensors it keeps.
  const optim_table::Row* row;
  // The name a checkpoint records ("adamw") and the class messages name (the row's).
  const char* type;
  const char* cls;
  // Whether `opt` is of this kind (a subclass counts).
  bool (*is)(const torch::optim::Optimizer& opt);
  // Every state tensor one parameter may keep, in the order a checkpoint
  // lists them (the row's).
  std::vector<std::string> tensors;
  // What of a group's options changes the tensors its parameters keep.
  optim_table::Settings (*settings)(const torch::optim::OptimizerOptions& o);
  // Those a checkpoint saves for a parameter of a group with options `o`: a
  // subset of `tensors`, in the same order.
  std::vector<std::string> kept(const torch::optim::OptimizerOptions& o) const { return row->saved(settings(o)); }
  // Those such a parameter holds in memory (what the ledger's O counts).
  std::vector<std::string> held(const torch::optim::OptimizerOptions& o) const { return row->held(settings(o)); }
  // One state tensor of a parameter's state; undefined when it keeps none.
  torch::Tensor (*tensor)(const torch::optim::OptimizerParamState& st, const std::string& name);
  // The parameter's step count (0 for SGD, which counts none).
  int64_t (*step)(const torch::optim::OptimizerParamState& st);
  // A parameter's state rebuilt from its step and the tensors kept(o) names.
  std::unique_ptr<torch::optim::OptimizerParamState> (*make)(const torch::optim::OptimizerOptions& o, int64_t step,
                                                             const TensorOf& get);
  // A group's hyper-parameters, for a consolidated file's metadata.
  nlohmann::json (*hyper)(const torch::optim::OptimizerOptions& o);
  // Bytes the state holds beyond `tensors` (LBFGS's history); null: none.
  int64_t (*other_bytes)(const torch::optim::OptimizerParamState& st);
  // Why a checkpoint cannot hold this kind's state, and what to do; null when it can.
  const char* not_checkpointed;
  // Why this kind cannot step on parameters split across ranks, and what
  // to do; null when it can (it updates each element on its own).
  const char* not_on_shards;
};

// Every kind, SGD, Adam, AdamW, Adagrad, RMSprop, LBFGS.
const std::vector<OptimizerKind>& optimizer_kinds();
// The row `opt` is of; null for an optimizer libtorch does not ship.
const OptimizerKind* kind_of(const torch::optim::Optimizer& opt);
// The row of an optimizer a checkpoint can hold; null for no optimizer.
// Throws fsdp::Error (what is saved, what was given, what to do) for LBFGS
// and any other optimizer. The same on every rank: call it before the first
// collective.
const OptimizerKind* checkpoint_kind(const torch::optim::Optimizer* opt);
// The state tensors a checkpoint of `opt` holds per parameter: those any of
// its groups keeps, in the kind's order; empty without an optimizer.
std::vector<std::string> saved_tensors(const OptimizerKind* kind, const torch::optim::Optimizer* opt);
// The options of the group each parameter is in, looked up by the tensor;
// group 0's for a tensor in none. Holds pointers into `opt`, which outlives it.
class GroupOptions {
 public:
  explicit GroupOptions(const torch::optim::Optimizer& opt);
  const torch::optim::OptimizerOptions& of(const torch::Tensor& param) const;

 private:
  std::unordered_map<const c10::TensorImpl*, const torch::optim::OptimizerOptions*> by_param_;
  const torch::optim::OptimizerOptions* first_;
};
// Bytes of `param`'s state in `opt` (the ledger's O); 0 when it has none
// or the optimizer is not a kind of the table.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& opt, const torch::Tensor& param);
// The state tensors `opt` holds per parameter by the table, averaged over
// its parameters by their elements (groups may keep different ones: an
// RMSprop group with momentum beside one without); -1 for an optimizer the
// table does not have, or one whose state is not per parameter (LBFGS).
double state_tensors_per_param(const torch::optim::Optimizer& opt);

}  // namespace fsdp::detail
