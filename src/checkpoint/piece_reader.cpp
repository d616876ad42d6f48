// fsdp-cpp checkpoints: checked reads of checkpoint pieces (see piece_reader.h).
#include "checkpoint/piece_reader.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"

namespace fsdp::ckpt::detail {
using fsdp::detail::cat;

std::vector<ReadOp> plan_reads(const std::string& what, const TensorMeta& t, int64_t lo, int64_t hi) {
  std::vector<ReadOp> ops;
  int64_t pos = lo;
  while (pos < hi) {
    // Pieces are sorted by lo; take the one covering pos that reaches furthest.
    size_t best = t.pieces.size();
    for (size_t i = 0; i < t.pieces.size() && t.pieces[i].lo <= pos; ++i)
      if (t.pieces[i].hi > pos && (best == t.pieces.size() || t.pieces[i].hi > t.pieces[best].hi)) best = i;
    if (best == t.pieces.size()) {
      int64_t next = hi;
      for (auto& p : t.pieces)
        if (p.lo > pos) next = std::min(next, p.lo);
      throw Error(cat(what, ": elements [", pos, ", ", next, ") are in no file of the checkpoint "
                      "(its metadata lists no piece for them). The checkpoint is incomplete; use another one."));
    }
    const PieceMeta& p = t.pieces[best];
    int64_t end = std::min(hi, p.hi);
    ops.push_back({best, pos - p.lo, end - p.lo, pos - lo});
    pos = end;
  }
  return ops;
}

struct PieceReader::Open {
  const FileMeta* meta;
  std::string path;
  std::unique_ptr<SafetensorsReader> st;
  FileHandle fh;
};

PieceReader::PieceReader(std::string dir, const Metadata& meta, bool verify)
    : dir_(std::move(dir)), meta_(meta), verify_(verify), open_(meta.files.size()) {}
PieceReader::~PieceReader() = default;

PieceReader::Open& PieceReader::open(int file) {
  FSDP_CHECK(file >= 0 && file < static_cast<int>(open_.size()), "file ", file);
  if (open_[file]) return *open_[file];
  auto f = std::make_unique<Open>();
  f->meta = &meta_.files[file];
  f->path = join_path(dir_, f->meta->name);
  if (!path_exists(f->path))
    throw Error(cat("checkpoint file '", f->path, "' (written by rank ", f->meta->rank, " of ", meta_.world_size,
                    ") is missing. The checkpoint directory is incomplete; copy it again or use another one."));
  f->fh = FileHandle::open(f->path);
  int64_t size = f->fh.size();
  if (size != f->meta->bytes)
    throw Error(cat("checkpoint file '", f->path, "': expected ", f->meta->bytes, " bytes (metadata.json), found ",
                    size, size < f->meta->bytes ? " — the file is truncated" : " — the file was modified",
                    ". Use another checkpoint or copy this one again."));
  // Check the header's chunks before parsing it, so damage there reads as a
  // checksum error rather than as a confusing parse error.
  if (verify_ && size >= 8) {
    unsigned char len[8];
    f->fh.pread_all(0, 8, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    int64_t hdr = static_cast<int64_t>(std::min<uint64_t>(n, static_cast<uint64_t>(size - 8))) + 8;
    std::vector<char> tmp(static_cast<size_t>(std::min<int64_t>(hdr, 8 << 20)));
    for (int64_t off = 0; off < hdr; off += static_cast<int64_t>(tmp.size()))
      read_checked(*f, off, std::min<int64_t>(hdr - off, tmp.size()), tmp.data());
  }
  f->st = std::make_unique<SafetensorsReader>(f->path);
  open_[file] = std::move(f);
  return *open_[file];
}

void PieceReader::read_checked(Open& f, int64_t offset, int64_t n, void* dst) {
  bytes_read_ += n;
  if (!verify_) {
    f.fh.pread_all(offset, static_cast<size_t>(n), dst);
    return;
  }
  const FileMeta& m = *f.meta;
  const int64_t C = m.chunk_bytes;
  char* out = static_cast<char*>(dst);
  int64_t end = offset + n;
  // Window of whole chunks, at most 16 at once: bounded staging memory.
  for (int64_t c = offset / C; c * C < end;) {
    int64_t c_end = std::min<int64_t>((end + C - 1) / C, c + 16);
    int64_t a = c * C, b = std::min(c_end * C, m.bytes);
    buf_.resize(static_cast<size_t>(std::max<int64_t>(buf_.size(), b - a)));
    f.fh.pread_all(a, static_cast<size_t>(b - a), buf_.data());
    for (int64_t k = c; k < c_end; ++k) {
      int64_t ka = k * C, kb = std::min((k + 1) * C, m.bytes);
      uint32_t got = crc32c(buf_.data() + (ka - a), static_cast<size_t>(kb - ka));
      if (got != m.chunk_crc32c[static_cast<size_t>(k)])
        throw Error(cat("checkpoint file '", f.path, "': checksum mismatch in bytes [", ka, ", ", kb,
                        ") (chunk ", k, "): expected CRC32C ", crc32c_hex(m.chunk_crc32c[static_cast<size_t>(k)]),
                        ", found ", crc32c_hex(got),
                        ". The file is damaged (disk or copy error); use another checkpoint."));
    }
    int64_t lo = std::max(offset, a), hi = std::min(end, b);
    std::memcpy(out + (lo - offset), buf_.data() + (lo - a), static_cast<size_t>(hi - lo));
    c = c_end;
  }
}

void PieceReader::read(const std::string& section, const std::string& name, const TensorMeta& t,
                       const PieceMeta& p, int64_t src_lo, int64_t src_hi, void* dst) {
  Open& f = open(p.file);
  const SafetensorsEntry* e = f.st->find(p.key);
  if (!e)
    throw Error(cat("checkpoint file '", f.path, "' has no tensor '", p.key, "' although metadata.json lists it (",
                    section, " '", name, "'). The checkpoint is inconsistent; use another one."));
  std::vector<int64_t> want_shape{p.hi - p.lo};
  if (e->dtype != t.dtype || e->shape != want_shape)
    throw Error(cat("checkpoint file '", f.path, "': tensor '", p.key, "' expected ", safetensors_dtype_name(t.dtype),
                    " ", shape_str(want_shape), " (metadata.json), found ", safetensors_dtype_name(e->dtype), " ",
                    shape_str(e->shape), ". The checkpoint is inconsistent; use another one."));
  FSDP_CHECK(src_lo >= 0 && src_lo <= src_hi && src_hi <= p.hi - p.lo, "range ", src_lo, " ", src_hi);
  int64_t es = element_size(t.dtype);
  read_checked(f, f.st->header_bytes() + e->begin + src_lo * es, (src_hi - src_lo) * es, dst);
}

void PieceReader::verify_file(int file) {
  Open& f = open(file);  // size and header chunks
  const FileMeta& m = *f.meta;
  std::vector<char> tmp(static_cast<size_t>(std::min<int64_t>(m.bytes, 16 << 20)));
  uint32_t crc = 0;
  bool saved = verify_;
  verify_ = true;
  for (int64_t off = 0; off < m.bytes; off += static_cast<int64_t>(tmp.size())) {
    int64_t n = std::min<int64_t>(m.bytes - off, tmp.size());
    read_checked(f, off, n, tmp.data());
    crc = crc32c_extend(crc, tmp.data(), static_cast<size_t>(n));
  }
  verify_ = saved;
  if (crc != m.crc32c)
    throw Error(cat("checkpoint file '", f.path, "': whole-file CRC32C expected ", crc32c_hex(m.crc32c), ", found ",
                    crc32c_hex(crc), ". The file is damaged; use another checkpoint."));
}

}  // namespace fsdp::ckpt::detail
