// fsdp-cpp: the one door to the file system and /proc (LevelDB's Env).
// defines: File, FileKind, Env, env, ScopedEnv, pread_fd, throw_truncated, read_proc_text,
//          parent_folder, make_dirs, replace_file, read_file
//
// Every file and /proc access of the library goes through an Env: the POSIX
// one by default; a test installs another (ScopedEnv) to count the mutating
// calls, crash at any of them and drop what was not synced, as a power cut
// would (tests/support/fault_injection_env.h).
//
// Secure by construction:
//   - new files are created with O_CREAT|O_EXCL|O_NOFOLLOW: never through a
//     planted symlink, never over a file someone else made;
//   - files opened for reading must be regular files (a FIFO would hang the
//     reader, a directory would fail later with a puzzling message): refused at
//     once, naming the path and what was found there. Reading follows
//     symlinks (a Hugging Face cache's snapshot is symlinks to its blobs);
//   - temporary folders come from mkdtemp in the destination's parent: a name
//     nobody could predict, made by us (never remove_all + create on a
//     predictable name, where a link planted between would be followed).
// Every error names the path, the operation and what was found, and says what
// to do, as fsdp::Error.
//
// Mutating calls (what a crash can fall between): File::append, File::pwrite,
// File::sync, and Env's create, sync_dir, rename, exchange, remove_file,
// remove_tree, make_dir, make_temp_dir.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::detail {

// One open file, owned: closed by the destructor (close() reports errors).
class File {
 public:
  virtual ~File() = default;
  virtual const std::string& path() const = 0;
  virtual int64_t size() const = 0;
  // Writes all n bytes at the end of what this handle wrote so far.
  virtual void append(const void* data, size_t n) = 0;
  // Writes all n bytes at `offset`.
  virtual void pwrite(int64_t offset, const void* data, size_t n) = 0;
  // Reads exactly n bytes at `offset`; a file that ends before is reported as
  // truncated (what was needed, where it ends, what to do).
  virtual void pread(int64_t offset, size_t n, void* dst) const = 0;
  // fsync: the data written so far survives a power cut (the file's name
  // only once its directory is synced too: Env::sync_dir).
  virtual void sync() = 0;
  virtual void close() = 0;
  // The descriptor, for readers that map or re-open the file (O_DIRECT); -1
  // where the file is not a descriptor.
  virtual int fd() const = 0;
};

// What is at a path (symlinks followed).
enum class FileKind { kNone, kFile, kDirectory, kOther };

// The file system and /proc, as the library sees them.
class Env {
 public:
  virtual ~Env() = default;
  // The POSIX file system (the default).
  static Env& posix();

  // A new regular file, open for writing (and reading back); fails when
  // anything, a symlink included, is at `path` already.
  virtual std::unique_ptr<File> create(const std::string& path) = 0;
  // An existing regular file, open for reading; anything else at `path` (a
  // FIFO, a directory, a device) is refused at once.
  virtual std::unique_ptr<File> open(const std::string& path) = 0;
  // fsync of a directory: the names created, renamed or removed in it so far
  // survive a power cut.
  virtual void sync_dir(const std::string& dir) = 0;
  // rename(2): replaces `to` (a file, or an empty directory) atomically.
  virtual void rename(const std::string& from, const std::string& to) = 0;
  // Swaps two existing paths atomically (renameat2 RENAME_EXCHANGE); false
  // where the file system cannot (nothing changed then).
  virtual bool exchange(const std::string& a, const std::string& b) = 0;
  // Removes a file (not a directory); nothing when absent.
  virtual void remove_file(const std::string& path) = 0;
  // Removes a file or a directory with everything in it (symlinks are
  // removed, never followed); nothing when absent.
  virtual void remove_tree(const std::string& path) = 0;
  // Makes one directory; false when a directory is there already (anything
  // else there is an error).
  virtual bool make_dir(const std::string& path) = 0;
  // A new directory `parent`/`prefix`XXXXXX (mkdtemp: a name nobody could
  // predict, mode 0700); its path.
  virtual std::string make_temp_dir(const std::string& parent, const std::string& prefix) = 0;
  // The names in a directory (no "." or ".."), sorted.
  virtual std::vector<std::string> list_dir(const std::string& dir) = 0;
  virtual FileKind kind(const std::string& path) = 0;
  // Whether two paths are the same file or directory (symlinks followed:
  // the same device and inode); false when either is absent.
  virtual bool same_file(const std::string& a, const std::string& b) = 0;
  // A /proc file (or any small pseudo-file whose size stat cannot tell) into
  // buf, at most cap - 1 bytes, NUL-terminated; the bytes read, -1 when it
  // cannot be opened (the process is gone). Allocates nothing: the memory
  // ledger's allocator hooks read /proc/self through it.
  virtual int64_t read_proc(const char* path, char* buf, size_t cap) = 0;
  // The symbolic link's target ("" when it cannot be read): /proc/self/exe.
  virtual std::string read_link(const std::string& path) = 0;
  // The open file `fd` (a File's) again, with O_DIRECT (reads around the page
  // cache); -1 where the file system refuses. The caller closes it.
  virtual int reopen_direct(int fd) = 0;
};

// Reads exactly n bytes of the descriptor `fd` (`path` names it in errors) at
// `offset`, in reads of at most 1 GiB, again after EINTR: the one read loop of
// the library (PosixFile::pread, the checkpoint readers' pread_all). A file
// that ends before is reported as truncated, naming the bytes needed and
// where it ends.
void pread_fd(int fd, const std::string& path, int64_t offset, size_t n, void* dst);
// The error of a file that ends at byte `ends_at`, before the bytes [from, to)
// a read needed.
[[noreturn]] void throw_truncated(const std::string& path, int64_t from, int64_t to, int64_t ends_at);

// The Env the library uses now: Env::posix() unless a ScopedEnv says otherwise.
Env& env();

// A /proc file as text, at most max_bytes (Env::read_proc); "" when it cannot
// be read.
std::string read_proc_text(const std::string& path, size_t max_bytes = 1 << 16);

// The folder `p` is in ("." for a bare name; "dir/" counts as "dir").
std::string parent_folder(const std::string& p);
// Makes `p` and its missing parents; with do_fsync, syncs the parent of each
// folder made, so that the new names survive a power cut.
void make_dirs(const std::string& p, bool do_fsync);
// Writes `content` to path.tmp (a killed write's leftover removed first; a
// new file, never one reached through a link), renames it over `path`; with
// do_fsync, syncs the file before and its folder after. A reader sees the old
// file or the new one, never half of one.
void replace_file(const std::string& path, const std::string& content, bool do_fsync);
// A regular file's bytes, at most max_bytes (more: fsdp::Error — never
// allocate from an unbounded size).
std::string read_file(const std::string& path, int64_t max_bytes);

// Makes `e` the library's Env for this object's lifetime (tests: fault
// injection). The previous one comes back when it ends; not for use while
// another thread does file I/O it should not see.
class ScopedEnv {
 public:
  explicit ScopedEnv(Env& e);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  Env* previous_;
};

}  // namespace fsdp::detail
