// fsdp-cpp checkpoints: durable file operations (LevelDB's discipline: write a
// temp file, fsync it, rename it over the target, fsync the directory).
// defines: FileHandle, write_all, pread_all, fsync_dir, atomic_write_file,
//          read_small_file, path helpers
//
// Every error names the path, the operation and errno's text, and says what
// to check (space, permissions), as fsdp::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::ckpt::detail {

// An owned file descriptor (closed by the destructor; close() reports errors).
class FileHandle {
 public:
  FileHandle() = default;
  // flags as for open(2); throws fsdp::Error naming `path` and `what`.
  FileHandle(const std::string& path, int flags, const char* what, int mode = 0644);
  ~FileHandle();
  FileHandle(FileHandle&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  FileHandle& operator=(FileHandle&& o) noexcept;
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  int64_t size() const;  // fstat
  void write_all(const void* data, size_t n);
  void pwrite_all(int64_t offset, const void* data, size_t n);
  // Reads exactly n bytes at offset; a short read is reported as truncation.
  void pread_all(int64_t offset, size_t n, void* dst) const;
  void sync();
  void close();

 private:
  int fd_ = -1;
  std::string path_;
};

// Reads exactly n bytes of the open file `fd` (not owned; `path` names it)
// at offset, as FileHandle::pread_all.
void pread_all(int fd, const std::string& path, int64_t offset, size_t n, void* dst);
// The error of a file that ends at byte `ends_at`, before the bytes [from, to)
// a read needed.
[[noreturn]] void throw_truncated(const std::string& path, int64_t from, int64_t to, int64_t ends_at);

void fsync_dir(const std::string& dir);
// Writes `content` to path.tmp, fsyncs, renames over `path`, fsyncs the dir.
void atomic_write_file(const std::string& path, const std::string& content, bool do_fsync = true);
// Whole file, at most max_bytes (more: fsdp::Error — never allocate from an
// unbounded size).
std::string read_small_file(const std::string& path, int64_t max_bytes);

bool path_exists(const std::string& p);
bool is_directory(const std::string& p);
std::string join_path(const std::string& a, const std::string& b);
std::string parent_dir(const std::string& p);
std::string base_name(const std::string& p);
void make_dirs(const std::string& p);
void remove_tree(const std::string& p);  // no error when absent
void rename_path(const std::string& from, const std::string& to);
std::vector<std::string> list_dir(const std::string& dir);  // names, sorted

}  // namespace fsdp::ckpt::detail
