// fsdp-cpp checkpoints: reading pieces of a sharded checkpoint's files, with
// every byte read checked against its chunk's CRC32C.
// defines: ReadOp, plan_reads, PieceReader
//
// Checksums are per 1 MiB chunk of each file (docs/CHECKPOINT_FORMAT.md):
// a rank verifies exactly the chunks it reads (its ranges rounded out to chunk
// bounds, plus the header's chunks), so resharding keeps "read only what
// overlaps" and still detects a flipped byte in anything it loads. `fsdp ckpt
// verify` reads every chunk.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/metadata.h"
#include "fsdp/checkpoint.h"

namespace fsdp::ckpt::detail {

// Copy elements [src_lo, src_hi) of piece `piece` (indices relative to the
// piece) to element `dst_offset` of the destination.
struct ReadOp {
  size_t piece;
  int64_t src_lo, src_hi, dst_offset;
};

// Covers [lo, hi) of the tensor with pieces (overlaps allowed: the first
// piece reaching furthest wins). Throws fsdp::Error naming the hole.
std::vector<ReadOp> plan_reads(const std::string& what, const TensorMeta& t, int64_t lo, int64_t hi);

class PieceReader {
 public:
  PieceReader(std::string dir, const Metadata& meta, bool verify);
  ~PieceReader();

  // Reads elements [src_lo, src_hi) of `p` (a piece of `t`) into dst.
  void read(const std::string& section, const std::string& name, const TensorMeta& t, const PieceMeta& p,
            int64_t src_lo, int64_t src_hi, void* dst);
  // Reads and verifies a whole file (for verify): size, every chunk, the file
  // CRC, the header against metadata.
  void verify_file(int file);

  int64_t bytes_read() const { return bytes_read_; }

 private:
  struct Open;
  Open& open(int file);
  void read_checked(Open& f, int64_t offset, int64_t n, void* dst);

  // Constant after construction.
  std::string dir_;
  const Metadata& meta_;
  bool verify_;
  // Files opened so far (header checked), by index in meta_.files.
  std::vector<std::unique_ptr<Open>> open_;
  std::vector<char> buf_;  // chunk-aligned staging for checked reads
  int64_t bytes_read_ = 0;
};

}  // namespace fsdp::ckpt::detail
