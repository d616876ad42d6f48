// fsdp-cpp: failing together (see fail_together.h).
#include "comm/fail_together.h"

#include "fsdp/errors.h"

namespace fsdp::comm {

void fail_together(Communicator& comm, const std::string& local_error, const CollectiveInfo& info,
                   const std::function<std::string(const std::vector<int>& failed_ranks)>& others_failed) {
  const int world = comm.world_size();
  auto flags = torch::zeros({world}, torch::kFloat32);
  if (!local_error.empty()) flags[comm.rank()] = 1.0f;
  comm.all_reduce(flags, ReduceOp::SUM, info)->wait();
  std::vector<int> failed;
  auto acc = flags.accessor<float, 1>();
  for (int r = 0; r < world; ++r)
    if (acc[r] != 0.0f) failed.push_back(r);
  if (failed.empty()) return;
  if (!local_error.empty()) throw Error(local_error);
  throw Error(others_failed(failed));
}

}  // namespace fsdp::comm
