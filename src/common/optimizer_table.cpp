// fsdp-cpp: the optimizer table (see optimizer_table.h).
#include "common/optimizer_table.h"

namespace fsdp::optim_table {
namespace {

using Names = std::vector<std::string>;

Names sgd_held(const Settings& s) { return s.momentum ? Names{"momentum_buffer"} : Names{}; }
Names sgd_saved(const Settings&) { return {"momentum_buffer"}; }
Names adam_held(const Settings& s) {
  return s.amsgrad ? Names{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"} : Names{"exp_avg", "exp_avg_sq"};
}
Names adagrad_held(const Settings&) { return {"sum"}; }
Names rmsprop_held(const Settings& s) {
  Names kept = {"square_avg"};
  if (s.momentum) kept.push_back("momentum_buffer");
  if (s.centered) kept.push_back("grad_avg");
  return kept;
}
Names none(const Settings&) { return {}; }

}  // namespace

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      {"sgd", "torch::optim::SGD", {"momentum_buffer"}, sgd_held, sgd_saved, true},
      {"adam", "torch::optim::Adam", {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, adam_held, adam_held, true},
      {"adamw", "torch::optim::AdamW", {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, adam_held, adam_held, true},
      {"adagrad", "torch::optim::Adagrad", {"sum"}, adagrad_held, adagrad_held, true},
      {"rmsprop", "torch::optim::RMSprop", {"square_avg", "momentum_buffer", "grad_avg"}, rmsprop_held, rmsprop_held,
       true},
      {"lbfgs", "torch::optim::LBFGS", {}, none, none, false},
  };
  return table;
}

const Row* find(const std::string& type) {
  for (const Row& r : rows())
    if (type == r.type) return &r;
  return nullptr;
}

}  // namespace fsdp::optim_table
