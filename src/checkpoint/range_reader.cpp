// fsdp-cpp checkpoints: byte ranges read from the page cache or around it
// (see range_reader.h).
#include "checkpoint/range_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "checkpoint/file_io.h"
#include "fsdp/errors.h"

namespace fsdp::ckpt::detail {
using fsdp::detail::cat;

void AlignedBuffer::Free::operator()(char* p) const { std::free(p); }

char* AlignedBuffer::reserve(int64_t n) {
  if (n > size_) {
    const int64_t size = (n + RangeReader::kAlign - 1) / RangeReader::kAlign * RangeReader::kAlign;
    p_.reset(static_cast<char*>(std::aligned_alloc(RangeReader::kAlign, static_cast<size_t>(size))));
    if (!p_) throw std::bad_alloc();
    size_ = size;
  }
  return p_.get();
}

RangeReader::RangeReader(int fd, const std::string& path, int64_t file_size, bool direct)
    : path_(path), size_(file_size), fd_(fd) {
  if (!direct || size_ <= 0) return;
  // The same file with O_DIRECT: -1 (EINVAL) where the file system refuses it.
  direct_fd_ = fsdp::detail::env().reopen_direct(fd);
  if (direct_fd_ < 0) return;
  map_ = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
  if (map_ == MAP_FAILED) {  // residency cannot be told: read through the cache
    map_ = nullptr;
    ::close(direct_fd_);
    direct_fd_ = -1;
  }
}

RangeReader::~RangeReader() {
  if (map_) ::munmap(map_, static_cast<size_t>(size_));
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

bool RangeReader::cached(int64_t offset, int64_t n) {
  if (!map_ || n <= 0) return true;
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t a = offset / page * page, b = std::min(size_, (offset + n + page - 1) / page * page);
  const size_t pages = static_cast<size_t>((b - a + page - 1) / page);
  residency_.resize(pages);
  if (::mincore(static_cast<char*>(map_) + a, static_cast<size_t>(b - a), residency_.data()) != 0) return true;
  size_t in = 0;
  for (unsigned char r : residency_) in += r & 1;
  return 2 * in >= pages;
}

const char* RangeReader::read_direct(int64_t offset, int64_t n, AlignedBuffer& buf) {
  const int64_t a = offset / kAlign * kAlign, b = (offset + n + kAlign - 1) / kAlign * kAlign;
  char* p = buf.reserve(b - a + kAlign);
  int64_t got = 0;
  while (a + got < offset + n) {
    const ssize_t k = ::pread(direct_fd_, p + got, static_cast<size_t>(b - a - got), a + got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno == EINVAL && got == 0) {  // this file (system) takes no O_DIRECT after all
      ::close(direct_fd_);
      direct_fd_ = -1;
      return nullptr;
    }
    if (k < 0)
      throw Error(cat("reading '", path_, "' (bytes [", a + got, ", ", b, "), O_DIRECT) failed: ", std::strerror(errno),
                      ". Check the disk."));
    if (k == 0) throw_truncated(path_, offset, offset + n, a + got);
    got += k;
  }
  bytes_read_ += got;
  ++direct_reads_;
  return p + (offset - a);
}

const char* RangeReader::read(int64_t offset, int64_t n, AlignedBuffer& buf) {
  if (direct_fd_ >= 0 && !cached(offset, n))
    if (const char* p = read_direct(offset, n, buf)) return p;
  char* p = buf.reserve(n);
  read_buffered(offset, n, p);
  return p;
}

void RangeReader::read_to(int64_t offset, int64_t n, void* dst, AlignedBuffer& buf) {
  if (direct_fd_ >= 0 && !cached(offset, n))
    if (const char* p = read_direct(offset, n, buf)) {
      std::memcpy(dst, p, static_cast<size_t>(n));
      return;
    }
  read_buffered(offset, n, dst);
}

void RangeReader::read_buffered(int64_t offset, int64_t n, void* dst) {
  pread_all(fd_, path_, offset, static_cast<size_t>(n), dst);
  bytes_read_ += n;
}

}  // namespace fsdp::ckpt::detail
