// fsdp-cpp checkpoints: reading byte ranges of a file once, for a load. What
// the page cache holds is copied from it; what it does not is read with
// O_DIRECT, around the cache.
// defines: AlignedBuffer, RangeReader
//
// A cold read through the page cache costs the kernel a fresh page for every
// 4 KiB and a copy out of it: 1.3-2.2 s of CPU for 2.2 GB on a 2-core machine
// (bench/README.md, "Hugging Face checkpoints"), CPU the load needs for its
// own work (converting, filling the shards). With O_DIRECT the disk writes
// straight into the caller's buffer. Whether a range is cached is asked of
// the kernel (mincore over a mapping of the file that is never touched)
// before each read; it only chooses the path, both give the same bytes.
// Where O_DIRECT is refused (tmpfs, some network file systems), every read
// is buffered.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::ckpt::detail {

// A heap buffer aligned for O_DIRECT, grown on demand, never shrunk.
class AlignedBuffer {
 public:
  // At least n bytes (contents not kept when it grows).
  char* reserve(int64_t n);

 private:
  struct Free {
    void operator()(char* p) const;
  };
  std::unique_ptr<char, Free> p_;
  int64_t size_ = 0;
};

class RangeReader {
 public:
  // O_DIRECT's alignment of offsets, lengths and buffers used here.
  static constexpr int64_t kAlign = 4096;

  // Reads the open file `fd` (not owned; `path` names it in messages;
  // file_size bytes, as its header was checked against). direct: whether
  // ranges the page cache lacks may be read with O_DIRECT, through a second
  // descriptor of the same file (opened by /proc/self/fd, checked to be the
  // same inode: never another file that took the path).
  RangeReader(int fd, const std::string& path, int64_t file_size, bool direct);
  ~RangeReader();
  RangeReader(const RangeReader&) = delete;
  RangeReader& operator=(const RangeReader&) = delete;

  // Bytes [offset, offset + n) of the file: a pointer into `buf` (grown to
  // n + 2 kAlign), valid until `buf` is used again. Throws fsdp::Error on an
  // I/O error or a file shorter than offset + n.
  const char* read(int64_t offset, int64_t n, AlignedBuffer& buf);
  // The same bytes into dst: straight from the page cache when it holds
  // them, else through `buf` (n bytes at most, as for read).
  void read_to(int64_t offset, int64_t n, void* dst, AlignedBuffer& buf);

  // Bytes read from the file: the ranges asked for, and for direct reads
  // their rounding out to kAlign (at most 2 kAlign - 2 bytes each).
  int64_t bytes_read() const { return bytes_read_; }
  // Reads that went around the page cache.
  int64_t direct_reads() const { return direct_reads_; }

 private:
  // Whether most of [offset, offset + n) is in the page cache (true when
  // it cannot be told).
  bool cached(int64_t offset, int64_t n);
  // pread of [offset, offset + n) into dst, through the page cache.
  void read_buffered(int64_t offset, int64_t n, void* dst);
  // [offset, offset + n) rounded out to kAlign, read with O_DIRECT into buf;
  // the pointer to offset's byte, or nullptr when O_DIRECT was refused (then
  // no more direct reads of this file).
  const char* read_direct(int64_t offset, int64_t n, AlignedBuffer& buf);

  std::string path_;
  int64_t size_;
  int fd_ = -1;         // buffered (the caller's)
  int direct_fd_ = -1;  // O_DIRECT; -1: none (refused, or not asked for)
  void* map_ = nullptr; // PROT_READ mapping for mincore, never touched
  std::vector<unsigned char> residency_;
  int64_t bytes_read_ = 0, direct_reads_ = 0;
};

}  // namespace fsdp::ckpt::detail
