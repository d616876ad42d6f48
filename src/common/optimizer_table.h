// fsdp-cpp: what each optimizer kind keeps per parameter, torch-free — the one
// table read by the optimizer code (optim/optimizer_state.h: the tensors
// themselves, the checkpoints, verify_optimizer, the ledger's O and what it
// records for the report) and by the planner (plan/plan.cpp: O before a run).
//
// defines: optim_table::Settings, optim_table::Row, optim_table::rows,
//          optim_table::find
//
//   type     held in memory per parameter (what O counts)     saved by a checkpoint
//   sgd      momentum_buffer with momentum                     momentum_buffer (zeros without)
//   adam     exp_avg, exp_avg_sq [, max_exp_avg_sq: amsgrad]   the same
//   adamw    the same (fsdp::FusedAdamW is an AdamW)           the same
//   adagrad  sum                                               the same
//   rmsprop  square_avg [, momentum_buffer: momentum > 0]      the same
//            [, grad_avg: centered]
//   lbfgs    one state for all parameters (not per parameter)  refused
#pragma once

#include <string>
#include <vector>

namespace fsdp::optim_table {

// The options of a parameter group that change what its parameters keep.
struct Settings {
  bool momentum = false;  // SGD, RMSprop: momentum > 0
  bool amsgrad = false;   // Adam, AdamW
  bool centered = false;  // RMSprop
};

// One optimizer kind. Rows are constant, made once (rows()).
struct Row {
  const char* type;  // the name a checkpoint records and the planner's --optimizer reads
  const char* cls;   // the libtorch class, for messages
  // Every state tensor one parameter may keep, in the order a checkpoint lists them.
  std::vector<std::string> tensors;
  // Those a parameter of a group with settings `s` holds in memory, in that
  // order (what the ledger's O and the planner's O count).
  std::vector<std::string> (*held)(const Settings& s);
  // Those a checkpoint saves for it: held(s), except that SGD saves its
  // momentum buffer (zeros) even without momentum, as checkpoints always have.
  std::vector<std::string> (*saved)(const Settings& s);
  // False for LBFGS: one state for the whole model (its history of
  // flattened directions), not a tensor per parameter.
  bool per_parameter;
};

// sgd, adam, adamw, adagrad, rmsprop, lbfgs.
const std::vector<Row>& rows();
// The row of `type`; null for a type the table does not have.
const Row* find(const std::string& type);

}  // namespace fsdp::optim_table
