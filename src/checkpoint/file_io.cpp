// fsdp-cpp checkpoints: durable file operations (see file_io.h).
#include "checkpoint/file_io.h"

#include <algorithm>
#include <filesystem>

#include "fsdp/errors.h"

namespace fsdp::ckpt::detail {
namespace fs = std::filesystem;
using fsdp::detail::cat;
using fsdp::detail::env;

FileHandle FileHandle::create(const std::string& path) {
  FileHandle h;
  h.f_ = env().create(path);
  h.path_ = path;
  return h;
}

FileHandle FileHandle::open(const std::string& path) {
  FileHandle h;
  h.f_ = env().open(path);
  h.path_ = path;
  return h;
}

int64_t FileHandle::size() const { return f_->size(); }
void FileHandle::write_all(const void* data, size_t n) { f_->append(data, n); }
void FileHandle::pwrite_all(int64_t offset, const void* data, size_t n) { f_->pwrite(offset, data, n); }
void FileHandle::pread_all(int64_t offset, size_t n, void* dst) const { f_->pread(offset, n, dst); }
void FileHandle::sync() { f_->sync(); }
void FileHandle::close() {
  if (!f_) return;
  auto f = std::move(f_);
  f->close();
}

void pread_all(int fd, const std::string& path, int64_t offset, size_t n, void* dst) {
  fsdp::detail::pread_fd(fd, path, offset, n, dst);
}

void throw_truncated(const std::string& path, int64_t from, int64_t to, int64_t ends_at) {
  fsdp::detail::throw_truncated(path, from, to, ends_at);
}

void fsync_dir(const std::string& dir) { env().sync_dir(dir); }

void atomic_write_file(const std::string& path, const std::string& content, bool do_fsync) {
  fsdp::detail::replace_file(path, content, do_fsync);
}

std::string read_small_file(const std::string& path, int64_t max_bytes) {
  return fsdp::detail::read_file(path, max_bytes);
}

bool path_exists(const std::string& p) { return env().kind(p) != fsdp::detail::FileKind::kNone; }
bool is_directory(const std::string& p) { return env().kind(p) == fsdp::detail::FileKind::kDirectory; }
std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}
std::string parent_dir(const std::string& p) { return fsdp::detail::parent_folder(p); }
std::string base_name(const std::string& p) {
  fs::path pp = fs::path(p).lexically_normal();
  if (!pp.has_filename()) pp = pp.parent_path();
  return pp.filename().string();
}

void make_dirs(const std::string& p, bool do_fsync) { fsdp::detail::make_dirs(p, do_fsync); }

std::string make_temp_dir(const std::string& dest, bool do_fsync) {
  const std::string parent = parent_dir(dest);
  make_dirs(parent, do_fsync);
  return env().make_temp_dir(parent, "." + base_name(dest) + ".fsdp-tmp-");
}

bool is_temp_dir_of(const std::string& name, const std::string& dest_name) {
  const std::string prefix = "." + dest_name + ".fsdp-tmp-";
  return name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0;
}

void remove_tree(const std::string& p) { env().remove_tree(p); }
void remove_file(const std::string& p) { env().remove_file(p); }
void rename_path(const std::string& from, const std::string& to) { env().rename(from, to); }

namespace {

// The previous DEST moved aside by a publish without an atomic swap: its own
// prefix, so that no cleanup of temporaries takes it for one. Removed once a
// complete DEST is in place again (a kill between the two renames leaves it
// there, DEST absent: moving it back restores the previous one).
std::string aside_prefix(const std::string& dest) { return "." + base_name(dest) + ".fsdp-old-"; }

void remove_asides(const std::string& dest) {
  const std::string parent = parent_dir(dest), prefix = aside_prefix(dest);
  for (const auto& n : env().list_dir(parent))
    if (n.size() == prefix.size() + 6 && n.compare(0, prefix.size(), prefix) == 0) remove_tree(parent + "/" + n);
}

}  // namespace

void publish_dir(const std::string& tmp, const std::string& dest, bool do_fsync) {
  const std::string parent = parent_dir(dest);
  if (!path_exists(dest)) {
    rename_path(tmp, dest);
    if (do_fsync) fsync_dir(parent);
    remove_asides(dest);
    return;
  }
  if (!env().exchange(tmp, dest)) {
    // No atomic swap on this file system: the previous one moves aside into
    // an empty directory of ours (rename replaces it), then the new one in.
    // Both renames are in one directory and made durable by one sync.
    const std::string old = env().make_temp_dir(parent, aside_prefix(dest));
    rename_path(dest, old);
    rename_path(tmp, dest);
    if (do_fsync) fsync_dir(parent);
    remove_asides(dest);
    return;
  }
  if (do_fsync) fsync_dir(parent);
  remove_tree(tmp);  // now the previous one
  remove_asides(dest);
}

std::vector<std::string> list_dir(const std::string& dir) { return env().list_dir(dir); }

}  // namespace fsdp::ckpt::detail
