// fsdp-cpp: one step's state on a rank (see step_state.h).
#include "state/step_state.h"

#include <algorithm>
#include <map>

#include "compat/torch_compat.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "optim/optimizer_state.h"

namespace fsdp::state {

using json = nlohmann::json;

StepListing list_step(const FullyShardedModel& model, const torch::optim::Optimizer& opt) {
  StepListing l;
  l.kind = detail::checkpoint_kind(&opt);
  const auto names = detail::saved_tensors(l.kind, &opt);
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params()) l.params.push_back(p);
  for (const auto& b : model.module().buffers()) l.buffers.push_back(b);
  l.optimizer.resize(l.params.size());
  if (!l.kind) return l;
  for (size_t i = 0; i < l.params.size(); ++i) {
    auto it = opt.state().find(compat::optimizer_state_key(l.params[i]));
    if (it == opt.state().end()) continue;
    OptimizerRow& row = l.optimizer[i];
    row.present = true;
    row.step = l.kind->step(*it->second);
    for (const auto& n : names) {
      auto t = l.kind->tensor(*it->second, n);
      if (!t.defined()) continue;
      row.names.push_back(n);
      row.tensors.push_back(t);
    }
  }
  return l;
}

json StepListing::header() const {
  json h = json::array();
  for (const auto& row : optimizer)
    h.push_back(row.present ? json{{"step", row.step}, {"tensors", row.names}} : json(nullptr));
  return h;
}

std::vector<torch::Tensor> StepListing::tensors() const {
  std::vector<torch::Tensor> v;
  for (const auto& p : params) v.push_back(p.detach().contiguous());
  for (const auto& b : buffers) v.push_back(b.detach().contiguous());
  for (const auto& row : optimizer)
    for (const auto& t : row.tensors) v.push_back(t.contiguous());
  return v;
}

namespace {
int64_t bytes_of(const std::vector<torch::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}
}  // namespace

int64_t StepListing::bytes() const { return bytes_of(tensors()); }

StagedStep::StagedStep(const StepListing& live, const json& source_header) : live_(live), header_(source_header) {
  if (!header_.is_array() || header_.size() != live_.params.size())
    throw Error(detail::cat("the source's step state lists ", header_.is_array() ? header_.size() : 0,
                            " optimizer parameters, this rank's optimizer ", live_.params.size(),
                            ". Expected every replica group to build the same optimizer over the same model"));
  for (const auto& p : live_.params) staged_.push_back(torch::empty_like(p, torch::MemoryFormat::Contiguous));
  for (const auto& b : live_.buffers) staged_.push_back(torch::empty_like(b, torch::MemoryFormat::Contiguous));
  for (size_t i = 0; i < live_.params.size(); ++i) {
    const json& row = header_[i];
    if (row.is_null()) continue;
    if (!live_.kind || !row.is_object() || !row.contains("tensors") || !row["tensors"].is_array() ||
        !row.contains("step") || !row["step"].is_number_integer())
      throw Error(detail::cat("the source's step state has optimizer state for parameter ", i,
                              live_.kind ? " in a form this rank cannot read" : " and this rank's optimizer keeps none",
                              ". Expected every replica group to run the same optimizer"));
    for (const auto& n : row["tensors"]) {
      if (!n.is_string() ||
          std::find(live_.kind->tensors.begin(), live_.kind->tensors.end(), n.get<std::string>()) ==
              live_.kind->tensors.end())
        throw Error(detail::cat("the source's step state names the optimizer tensor ", n.dump(), " for parameter ", i,
                                ", which a ", live_.kind->cls, " does not keep. Expected every replica group to run "
                                "the same optimizer"));
      staged_.push_back(torch::empty_like(live_.params[i], torch::MemoryFormat::Contiguous));
    }
  }
}

int64_t StagedStep::bytes() const { return bytes_of(staged_); }

void StagedStep::install(torch::optim::Optimizer& opt) const {
  torch::NoGradGuard ng;
  size_t at = 0;
  for (const auto& p : live_.params) p.detach().copy_(staged_[at++]);
  for (const auto& b : live_.buffers) b.detach().copy_(staged_[at++]);
  const detail::GroupOptions groups(opt);
  for (size_t i = 0; i < live_.params.size(); ++i) {
    const auto& p = live_.params[i];
    const auto key = compat::optimizer_state_key(p);
    const json& row = header_[i];
    if (row.is_null()) {
      opt.state().erase(key);
      continue;
    }
    std::map<std::string, torch::Tensor> by_name;
    for (const auto& n : row["tensors"]) by_name[n.get<std::string>()] = staged_[at++];
    auto get = [&](const std::string& n) {
      auto it = by_name.find(n);
      return it == by_name.end() ? torch::zeros_like(p) : it->second;
    };
    opt.state()[key] = live_.kind->make(groups.of(p), row["step"].get<int64_t>(), get);
  }
}

}  // namespace fsdp::state
