// fsdp-cpp: what load_hf and save_hf share — the model's parameters as
// pieces of HF tensors, and the small durable-file helpers of the export.
// defines: hf::rows_of, hf::inner_of, hf::Piece, hf::owned_range, hf::join_names,
//          hf::write_durable, hf::fsync_path
//
// A model parameter P (row-major, [R, ...]) is stacked along its first
// dimension from pieces; piece k gives rows [dst_row, dst_row + rows) of P
// from rows [src_row, src_row + rows) of an HF tensor with the same trailing
// dimensions, so in flat elements it is one contiguous range on both sides
// (inner = the product of the trailing dimensions). A transposed piece is
// the whole 2-D tensor on both sides (P = T^T).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/hf.h"
#include "unit/unit.h"

namespace fsdp::detail::hf {

// Rows of a shape (a scalar is one row of one element).
inline int64_t rows_of(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }
// Elements per row: the product of the trailing dimensions.
inline int64_t inner_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// One HF tensor's share of a model parameter (see above).
struct Piece {
  std::string hf_name;
  bool transpose = false;
  int64_t src_row = 0, dst_row = 0, rows = 0;
};

// The elements [lo, hi) of slot `s` this rank writes, in a checkpoint and in
// an export alike: its slice, except that NO_SHARD's replicas split each
// parameter evenly and HYBRID's replica groups other than the first write
// nothing (each byte is written once; a load reads each rank's [lo, hi)
// whatever wrote it). The one definition (hf_load.cpp); state_dict.cpp asks it.
std::pair<int64_t, int64_t> owned_range(const FullyShardedModel& m, const ParamSlot& s);

// "'a', 'b' and 3 more", for messages.
std::string join_names(const std::vector<std::string>& v, size_t most = 6);

}  // namespace fsdp::detail::hf
