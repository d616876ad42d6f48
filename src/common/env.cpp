// fsdp-cpp: the POSIX Env (see env.h).
#include "common/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#include "fsdp/errors.h"

namespace fsdp::detail {
namespace {

[[noreturn]] void io_fail(const std::string& path, const char* what, int err) {
  throw Error(cat(what, " '", path, "' failed: ", std::strerror(err),
                  ". Check that the directory exists, is writable and the disk has space."));
}

const char* kind_name(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISLNK(m)) return "a symbolic link";
  return "something that is neither a file nor a directory";
}

class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  const std::string& path() const override { return path_; }
  int64_t size() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) io_fail(path_, "stat of", errno);
    return st.st_size;
  }
  void append(const void* data, size_t n) override {
    pwrite(end_, data, n);
  }
  void pwrite(int64_t offset, const void* data, size_t n) override {
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
    end_ = std::max(end_, offset);
  }
  void pread(int64_t offset, size_t n, void* dst) const override { pread_fd(fd_, path_, offset, n, dst); }
  void sync() override {
    if (::fsync(fd_) != 0) io_fail(path_, "fsync of", errno);
  }
  void close() override {
    if (fd_ < 0) return;
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) io_fail(path_, "closing", errno);
  }
  int fd() const override { return fd_; }

 private:
  int fd_;
  std::string path_;
  int64_t end_ = 0;  // where append writes next
};

class PosixEnv final : public Env {
 public:
  std::unique_ptr<File> create(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      if (err == EEXIST)
        throw Error(cat("creating '", path, "': expected no file there (a new file is made, never one that exists "
                        "or a symbolic link followed), found one. Remove it, or write elsewhere."));
      io_fail(path, "creating", err);
    }
    return std::make_unique<PosixFile>(fd, path);
  }

  std::unique_ptr<File> open(const std::string& path) override {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; the check below
    // refuses it.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) io_fail(path, "opening", errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      io_fail(path, "stat of", err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw Error(cat("'", path, "': expected a regular file, found ", kind_name(st.st_mode),
                      ". Point at the file itself (a checkpoint's files are regular files)."));
    }
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return std::make_unique<PosixFile>(fd, path);
  }

  void sync_dir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) io_fail(dir, "opening directory", errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) io_fail(dir, "fsync of directory", err);
  }

  void rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      throw Error(cat("renaming '", from, "' to '", to, "' failed: ", std::strerror(errno),
                      ". Check permissions and that both are on the same file system."));
  }

  bool exchange(const std::string& a, const std::string& b) override {
#ifdef SYS_renameat2
    if (::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), 2 /* RENAME_EXCHANGE */) == 0) return true;
    const int err = errno;
    if (err == EINVAL || err == ENOSYS || err == ENOTSUP) return false;
    throw Error(cat("swapping '", a, "' and '", b, "' failed: ", std::strerror(err),
                    ". Check permissions and that both are on the same file system."));
#else
    (void)a, (void)b;
    return false;
#endif
  }

  void remove_file(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) io_fail(path, "removing", errno);
  }

  void remove_tree(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) throw Error(cat("removing '", path, "' failed: ", ec.message(), ". Check permissions."));
  }

  bool make_dir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) == 0) return true;
    const int err = errno;
    if (err == EEXIST) {
      struct stat st;
      if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return false;
      throw Error(cat("creating directory '", path, "': expected a directory or nothing there, found ",
                      ::lstat(path.c_str(), &st) == 0 ? kind_name(st.st_mode) : "something unreadable",
                      ". Remove it, or choose another path."));
    }
    throw Error(cat("creating directory '", path, "' failed: ", std::strerror(err),
                    ". Check the path and permissions."));
  }

  std::string make_temp_dir(const std::string& parent, const std::string& prefix) override {
    std::string t = (parent.empty() ? std::string(".") : parent) + "/" + prefix + "XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) io_fail(t, "creating temporary directory", errno);
    // Made by us under a name nobody could predict; readable as the directory
    // it becomes when published (mkdtemp makes it 0700).
    ::chmod(buf.data(), 0755);
    return std::string(buf.data());
  }

  std::vector<std::string> list_dir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) io_fail(dir, "listing", errno);
    std::vector<std::string> out;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }

  FileKind kind(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return FileKind::kNone;
    if (S_ISREG(st.st_mode)) return FileKind::kFile;
    if (S_ISDIR(st.st_mode)) return FileKind::kDirectory;
    return FileKind::kOther;
  }

  bool same_file(const std::string& a, const std::string& b) override {
    struct stat sa, sb;
    return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
  }

  int64_t read_proc(const char* path, char* buf, size_t cap) override {
    if (cap == 0) return -1;
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    while (got + 1 < cap) {
      const ssize_t k = ::read(fd, buf + got, cap - 1 - got);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      got += static_cast<size_t>(k);
    }
    ::close(fd);
    buf[got] = '\0';
    return static_cast<int64_t>(got);
  }

  std::string read_link(const std::string& path) override {
    char buf[4096];
    const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }

  int reopen_direct(int of) override {
    if (of < 0) return -1;
    const int fd = ::open(cat("/proc/self/fd/", of).c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0) return -1;
    struct stat a, b;  // the same file, not one a rename put at its name since
    if (::fstat(of, &a) != 0 || ::fstat(fd, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
};

std::atomic<Env*>& current() {
  static std::atomic<Env*> e{nullptr};
  return e;
}

}  // namespace

void pread_fd(int fd, const std::string& path, int64_t offset, size_t n, void* dst) {
  char* p = static_cast<char*>(dst);
  const int64_t from = offset, to = offset + static_cast<int64_t>(n);
  while (n > 0) {
    const ssize_t k = ::pread(fd, p, std::min<size_t>(n, 1 << 30), offset);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw Error(cat("reading '", path, "' failed: ", std::strerror(errno), ". Check the disk and the file system."));
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

Env& Env::posix() {
  // Never destroyed (usable from any static destructor) and not on the heap:
  // the memory ledger's allocator hooks may be the first to ask.
  alignas(PosixEnv) static unsigned char storage[sizeof(PosixEnv)];
  static PosixEnv* e = new (storage) PosixEnv;
  return *e;
}

Env& env() {
  Env* e = current().load(std::memory_order_acquire);
  return e ? *e : Env::posix();
}

std::string read_proc_text(const std::string& path, size_t max_bytes) {
  std::string s(max_bytes + 1, '\0');
  const int64_t n = env().read_proc(path.c_str(), s.data(), s.size());
  s.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return s;
}

std::string parent_folder(const std::string& p) {
  namespace fs = std::filesystem;
  fs::path pp = fs::path(p).lexically_normal();
  if (!pp.has_filename()) pp = pp.parent_path();  // "dir/" -> "dir"
  auto par = pp.parent_path().string();
  return par.empty() ? "." : par;
}

void make_dirs(const std::string& p, bool do_fsync) {
  namespace fs = std::filesystem;
  fs::path pp = fs::path(p).lexically_normal();
  if (!pp.has_filename()) pp = pp.parent_path();
  if (pp.empty() || env().kind(pp.string()) == FileKind::kDirectory) return;
  const std::string parent = parent_folder(pp.string());
  if (parent != pp.string()) make_dirs(parent, do_fsync);
  if (env().make_dir(pp.string()) && do_fsync) env().sync_dir(parent);
}

void replace_file(const std::string& path, const std::string& content, bool do_fsync) {
  const std::string tmp = path + ".tmp";
  Env& e = env();
  e.remove_file(tmp);
  {
    auto f = e.create(tmp);
    f->append(content.data(), content.size());
    if (do_fsync) f->sync();
    f->close();
  }
  e.rename(tmp, path);
  if (do_fsync) e.sync_dir(parent_folder(path));
}

std::string read_file(const std::string& path, int64_t max_bytes) {
  auto f = env().open(path);
  const int64_t n = f->size();
  if (n > max_bytes)
    throw Error(cat("'", path, "' has ", n, " bytes; expected at most ", max_bytes,
                    ". This is not the file expected here; check the path."));
  std::string s(static_cast<size_t>(n), '\0');
  if (n > 0) f->pread(0, s.size(), s.data());
  return s;
}

ScopedEnv::ScopedEnv(Env& e) : previous_(current().exchange(&e, std::memory_order_acq_rel)) {}
ScopedEnv::~ScopedEnv() { current().store(previous_, std::memory_order_release); }

}  // namespace fsdp::detail
