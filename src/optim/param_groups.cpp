// fsdp-cpp: parameter groups by original name and shape (see include/fsdp/optim.h).
#include "fsdp/optim.h"

namespace fsdp {

bool is_matrix(const std::string&, const std::vector<int64_t>& full_shape) { return full_shape.size() >= 2; }

std::vector<torch::optim::OptimizerParamGroup> param_groups(const FullyShardedModel& model,
                                                            const ParamPredicate& select,
                                                            const torch::optim::OptimizerOptions& selected,
                                                            const torch::optim::OptimizerOptions& rest) {
  FSDP_USER_CHECK(select, "param_groups: expected a predicate, found an empty std::function");
  std::vector<torch::Tensor> yes, no;
  for (const NamedShard& s : model.named_shards()) (select(s.name, s.full_shape) ? yes : no).push_back(s.tensor);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(yes), selected.clone());
  groups.emplace_back(std::move(no), rest.clone());
  return groups;
}

}  // namespace fsdp
