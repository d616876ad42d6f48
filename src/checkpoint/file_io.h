// fsdp-cpp checkpoints: durable file operations (LevelDB's discipline: write a
// temp file, fsync it, rename it over the target, fsync the directory), all
// through the library's Env (common/env.h), so a test can crash between any
// two of them.
// defines: FileHandle, pread_all, throw_truncated, fsync_dir, atomic_write_file,
//          read_small_file, path helpers, make_dirs, make_temp_dir, publish_dir
//
// Every error names the path, the operation and errno's text, and says what
// to check (space, permissions), as fsdp::Error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"

namespace fsdp::ckpt::detail {

// An owned file of the Env (closed by the destructor; close() reports errors).
class FileHandle {
 public:
  FileHandle() = default;
  // A new file (nothing may be at `path`: O_EXCL, symlinks not followed).
  static FileHandle create(const std::string& path);
  // An existing regular file, for reading (anything else is refused at once).
  static FileHandle open(const std::string& path);

  int fd() const { return f_ ? f_->fd() : -1; }
  const std::string& path() const { return path_; }
  const fsdp::detail::File* file() const { return f_.get(); }
  int64_t size() const;
  void write_all(const void* data, size_t n);
  void pwrite_all(int64_t offset, const void* data, size_t n);
  // Reads exactly n bytes at offset; a short read is reported as truncation.
  void pread_all(int64_t offset, size_t n, void* dst) const;
  void sync();
  void close();

 private:
  std::unique_ptr<fsdp::detail::File> f_;
  std::string path_;
};

// Reads exactly n bytes of the open file `fd` (not owned, opened through the
// Env; `path` names it) at offset, as FileHandle::pread_all.
void pread_all(int fd, const std::string& path, int64_t offset, size_t n, void* dst);
// The error of a file that ends at byte `ends_at`, before the bytes [from, to)
// a read needed.
[[noreturn]] void throw_truncated(const std::string& path, int64_t from, int64_t to, int64_t ends_at);

void fsync_dir(const std::string& dir);
// Writes `content` to path.tmp (a leftover of a killed write removed first),
// fsyncs, renames over `path`, fsyncs the dir.
void atomic_write_file(const std::string& path, const std::string& content, bool do_fsync = true);
// Whole file, at most max_bytes (more: fsdp::Error — never allocate from an
// unbounded size). Regular files only.
std::string read_small_file(const std::string& path, int64_t max_bytes);

bool path_exists(const std::string& p);
bool is_directory(const std::string& p);
std::string join_path(const std::string& a, const std::string& b);
std::string parent_dir(const std::string& p);
std::string base_name(const std::string& p);
// Makes `p` and its missing parents; with do_fsync, syncs the parent of each
// directory made, so that the new names survive a power cut.
void make_dirs(const std::string& p, bool do_fsync = true);
// A new temporary directory beside `dest` (mkdtemp in dest's parent, named
// ".<dest's name>.fsdp-tmp-XXXXXX"); its parent made first when missing.
std::string make_temp_dir(const std::string& dest, bool do_fsync = true);
// Whether `name` (a base name) is one of make_temp_dir's for `dest_name`.
bool is_temp_dir_of(const std::string& name, const std::string& dest_name);
void remove_tree(const std::string& p);  // no error when absent
void remove_file(const std::string& p);  // no error when absent
void rename_path(const std::string& from, const std::string& to);
// Puts the complete directory `tmp` in place of `dest` (absent, or a previous
// one, replaced atomically: the two are swapped, then the old one removed),
// then syncs dest's parent. A crash at any point leaves `dest` as it was or the
// new one, never absent when it was there.
void publish_dir(const std::string& tmp, const std::string& dest, bool do_fsync = true);
std::vector<std::string> list_dir(const std::string& dir);  // names, sorted

}  // namespace fsdp::ckpt::detail
