// fsdp-cpp: failing together (see fail_together.h).
#include "comm/fail_together.h"

#include "fsdp/errors.h"

namespace fsdp::comm {

// One row per rank: its flag, then each word as two 16-bit halves (exact in
// fp32; a sum of one row's value and zeros is exact too).
std::vector<std::vector<uint32_t>> fail_together_sharing(
    Communicator& comm, const std::string& local_error, const std::vector<uint32_t>& words,
    const CollectiveInfo& info, const std::function<std::string(const std::vector<int>& failed_ranks)>& others_failed) {
  const int world = comm.world_size(), rank = comm.rank();
  const int64_t row = 1 + 2 * static_cast<int64_t>(words.size());
  auto table = torch::zeros({world * row}, torch::kFloat32);
  {
    auto acc = table.accessor<float, 1>();
    const int64_t at = rank * row;
    if (!local_error.empty()) acc[at] = 1.0f;
    for (size_t i = 0; i < words.size(); ++i) {
      acc[at + 1 + 2 * int64_t(i)] = static_cast<float>(words[i] >> 16);
      acc[at + 2 + 2 * int64_t(i)] = static_cast<float>(words[i] & 0xffffu);
    }
  }
  comm.all_reduce(table, ReduceOp::SUM, info)->wait();
  auto acc = table.accessor<float, 1>();
  std::vector<int> failed;
  for (int r = 0; r < world; ++r)
    if (acc[r * row] != 0.0f) failed.push_back(r);
  if (!failed.empty()) {
    if (!local_error.empty()) throw Error(local_error);
    throw Error(others_failed(failed));
  }
  std::vector<std::vector<uint32_t>> out(static_cast<size_t>(world), std::vector<uint32_t>(words.size()));
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < words.size(); ++i)
      out[size_t(r)][i] = (static_cast<uint32_t>(acc[r * row + 1 + 2 * int64_t(i)]) << 16) |
                          static_cast<uint32_t>(acc[r * row + 2 + 2 * int64_t(i)]);
  return out;
}

void fail_together(Communicator& comm, const std::string& local_error, const CollectiveInfo& info,
                   const std::function<std::string(const std::vector<int>& failed_ranks)>& others_failed) {
  fail_together_sharing(comm, local_error, {}, info, others_failed);
}

}  // namespace fsdp::comm
