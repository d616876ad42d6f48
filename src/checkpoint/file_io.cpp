// fsdp-cpp checkpoints: durable file operations (see file_io.h).
#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "fsdp/errors.h"

namespace fsdp::ckpt::detail {
namespace fs = std::filesystem;
using fsdp::detail::cat;

namespace {
[[noreturn]] void io_fail(const std::string& path, const char* what, int err) {
  throw Error(cat(what, " '", path, "' failed: ", std::strerror(err),
                  ". Check that the directory exists, is writable and the disk has space."));
}
}  // namespace

FileHandle::FileHandle(const std::string& path, int flags, const char* what, int mode) : path_(path) {
  fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd_ < 0) io_fail(path, what, errno);
}

FileHandle::~FileHandle() {
  if (fd_ >= 0) ::close(fd_);
}

FileHandle& FileHandle::operator=(FileHandle&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

int64_t FileHandle::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) io_fail(path_, "stat", errno);
  return st.st_size;
}

void FileHandle::write_all(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::write(fd_, p, std::min<size_t>(n, 1 << 30));
    if (k < 0) {
      if (errno == EINTR) continue;
      io_fail(path_, "writing", errno);
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void FileHandle::pwrite_all(int64_t offset, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::pwrite(fd_, p, std::min<size_t>(n, 1 << 30), offset);
    if (k < 0) {
      if (errno == EINTR) continue;
      io_fail(path_, "writing", errno);
    }
    p += k;
    offset += k;
    n -= static_cast<size_t>(k);
  }
}

void FileHandle::pread_all(int64_t offset, size_t n, void* dst) const { detail::pread_all(fd_, path_, offset, n, dst); }

void pread_all(int fd, const std::string& path, int64_t offset, size_t n, void* dst) {
  char* p = static_cast<char*>(dst);
  const int64_t from = offset, to = offset + static_cast<int64_t>(n);
  while (n > 0) {
    ssize_t k = ::pread(fd, p, std::min<size_t>(n, 1 << 30), offset);
    if (k < 0) {
      if (errno == EINTR) continue;
      io_fail(path, "reading", errno);
    }
    if (k == 0) throw_truncated(path, from, to, offset);
    p += k;
    offset += k;
    n -= static_cast<size_t>(k);
  }
}

void throw_truncated(const std::string& path, int64_t from, int64_t to, int64_t ends_at) {
  throw Error(cat("'", path, "' is truncated: needed bytes [", from, ", ", to, ") but the file ends at byte ", ends_at,
                  ". The file was cut short (disk full or a copy interrupted); use another checkpoint or copy it "
                  "again."));
}

void FileHandle::sync() {
  if (::fsync(fd_) != 0) io_fail(path_, "fsync", errno);
}

void FileHandle::close() {
  if (fd_ < 0) return;
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) io_fail(path_, "close", errno);
}

void fsync_dir(const std::string& dir) {
  FileHandle d(dir, O_RDONLY | O_DIRECTORY, "opening directory");
  d.sync();
}

void atomic_write_file(const std::string& path, const std::string& content, bool do_fsync) {
  std::string tmp = path + ".tmp";
  {
    FileHandle f(tmp, O_WRONLY | O_CREAT | O_TRUNC, "creating");
    f.write_all(content.data(), content.size());
    if (do_fsync) f.sync();
    f.close();
  }
  rename_path(tmp, path);
  if (do_fsync) fsync_dir(parent_dir(path));
}

std::string read_small_file(const std::string& path, int64_t max_bytes) {
  FileHandle f(path, O_RDONLY, "opening");
  int64_t n = f.size();
  if (n > max_bytes)
    throw Error(cat("'", path, "' has ", n, " bytes; expected at most ", max_bytes,
                    ". This is not a file fsdp-cpp wrote; check the path."));
  std::string s(static_cast<size_t>(n), '\0');
  f.pread_all(0, s.size(), s.data());
  return s;
}

bool path_exists(const std::string& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}
bool is_directory(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}
std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}
std::string parent_dir(const std::string& p) {
  fs::path pp = fs::path(p).lexically_normal();
  if (!pp.has_filename()) pp = pp.parent_path();  // "dir/" -> "dir"
  auto par = pp.parent_path().string();
  return par.empty() ? "." : par;
}
std::string base_name(const std::string& p) {
  fs::path pp = fs::path(p).lexically_normal();
  if (!pp.has_filename()) pp = pp.parent_path();
  return pp.filename().string();
}
void make_dirs(const std::string& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec) throw Error(cat("creating directory '", p, "' failed: ", ec.message(),
                          ". Check the path and permissions."));
}
void remove_tree(const std::string& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) throw Error(cat("removing '", p, "' failed: ", ec.message(), ". Check permissions."));
}
void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw Error(cat("renaming '", from, "' to '", to, "' failed: ", std::strerror(errno),
                    ". Check permissions and that both are on the same file system."));
}
std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    out.push_back(it->path().filename().string());
  if (ec) throw Error(cat("listing '", dir, "' failed: ", ec.message(), "."));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace fsdp::ckpt::detail
