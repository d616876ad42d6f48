// fsdp-cpp tests: an Env (common/env.h) that crashes at the k-th mutating call
// and then loses what a power cut would (LevelDB's FaultInjectionTestEnv, with
// directory entries modelled too).
// defines: SimulatedCrash, FaultInjectionEnv
//
// The model, for everything under one root folder (paths elsewhere pass
// through, uncounted): every file and folder is an inode. A file's durable
// bytes are what it held at its last File::sync (none before); a folder's
// durable entries are its names at its last Env::sync_dir (none for a folder
// made since the last reset). A power cut rebuilds the tree from the root's
// durable entries down: a file written but not synced comes back empty, or
// with its last synced bytes; a name created, renamed or removed in a folder
// not synced since is as it was at that folder's last sync. This is the
// pessimistic end of what POSIX allows (ALICE's "arbitrary reordering"
// within the rules of fsync), so a writer that survives it survives a real
// file system too.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/env.h"

namespace fsdp::testing {

// Thrown at the crash point, and by every mutating call after it. Not a
// std::exception: no `catch (const std::exception&)` of the library turns the
// crash into an error it reports and goes on from; the writer stops there.
struct SimulatedCrash {};

class FaultInjectionEnv final : public fsdp::detail::Env {
 public:
  // Models everything under `root` (an existing folder), as it is now,
  // durable.
  explicit FaultInjectionEnv(const std::string& root) : root_(normal(root)) { reset(); }

  // Crash at the k-th mutating call under root from now (0: never).
  void crash_at(int64_t k) {
    std::lock_guard<std::mutex> g(mu_);
    crash_at_ = k;
  }
  // Whether exchange() swaps (false: a file system without RENAME_EXCHANGE,
  // where the writers fall back to two renames). Kept across resets.
  void set_exchange_supported(bool ok) {
    std::lock_guard<std::mutex> g(mu_);
    exchange_ok_ = ok;
  }
  // Mutating calls under root since the last reset.
  int64_t mutations() const {
    std::lock_guard<std::mutex> g(mu_);
    return ops_;
  }
  bool crashed() const {
    std::lock_guard<std::mutex> g(mu_);
    return crashed_;
  }

  // The power cut: the tree under root becomes what was durable (see above);
  // then, as after a reboot, everything there is durable and nothing is armed.
  void power_cut() {
    {
      std::lock_guard<std::mutex> g(mu_);
      auto& px = fsdp::detail::Env::posix();
      for (auto& n : px.list_dir(root_)) px.remove_tree(root_ + "/" + n);
      std::set<int> on_path{0};
      materialize(0, root_, on_path, 0);
    }
    reset();
  }

  // Forgets the model: the tree as it is now is durable; counting restarts.
  void reset() {
    std::lock_guard<std::mutex> g(mu_);
    nodes_.clear();
    cur_.clear();
    nodes_.push_back(Node{true, {}, {}});
    cur_[""] = 0;
    scan("", 0);
    ops_ = 0;
    crash_at_ = 0;
    crashed_ = false;
  }

  // ---- Env
  std::unique_ptr<fsdp::detail::File> create(const std::string& path) override {
    auto r = rel(path);
    if (!r) return px().create(path);
    std::lock_guard<std::mutex> g(mu_);
    count();
    auto f = px().create(path);
    const int id = new_node(false);
    erase_tree(*r);
    cur_[*r] = id;
    return std::make_unique<TrackedFile>(this, std::move(f), id);
  }
  std::unique_ptr<fsdp::detail::File> open(const std::string& path) override { return px().open(path); }
  void sync_dir(const std::string& dir) override {
    auto r = rel(dir);
    if (!r) return px().sync_dir(dir);
    std::lock_guard<std::mutex> g(mu_);
    count();
    // The model is the durability here: no real fsync (a test's speed must
    // not depend on the disk's).
    auto it = cur_.find(*r);
    if (it == cur_.end()) return;
    std::map<std::string, int> kids;
    for (auto& [p, id] : cur_)
      if (is_child(p, *r)) kids[p.substr(r->empty() ? 0 : r->size() + 1)] = id;
    nodes_[static_cast<size_t>(it->second)].kids = std::move(kids);
  }
  void rename(const std::string& from, const std::string& to) override {
    auto a = rel(from), b = rel(to);
    if (!a || !b) return px().rename(from, to);
    std::lock_guard<std::mutex> g(mu_);
    count();
    px().rename(from, to);
    auto moved = take_tree(*a);
    erase_tree(*b);
    for (auto& [suffix, id] : moved) cur_[*b + suffix] = id;
  }
  bool exchange(const std::string& x, const std::string& y) override {
    auto a = rel(x), b = rel(y);
    if (!a || !b) return px().exchange(x, y);
    std::lock_guard<std::mutex> g(mu_);
    count();
    if (!exchange_ok_ || !px().exchange(x, y)) return false;
    auto ta = take_tree(*a), tb = take_tree(*b);
    for (auto& [suffix, id] : ta) cur_[*b + suffix] = id;
    for (auto& [suffix, id] : tb) cur_[*a + suffix] = id;
    return true;
  }
  void remove_file(const std::string& path) override {
    auto r = rel(path);
    if (!r) return px().remove_file(path);
    std::lock_guard<std::mutex> g(mu_);
    count();
    px().remove_file(path);
    erase_tree(*r);
  }
  void remove_tree(const std::string& path) override {
    auto r = rel(path);
    if (!r) return px().remove_tree(path);
    std::lock_guard<std::mutex> g(mu_);
    count();
    px().remove_tree(path);
    erase_tree(*r);
  }
  bool make_dir(const std::string& path) override {
    auto r = rel(path);
    if (!r || r->empty()) return px().make_dir(path);
    std::lock_guard<std::mutex> g(mu_);
    count();
    const bool made = px().make_dir(path);
    if (made) cur_[*r] = new_node(true);
    return made;
  }
  std::string make_temp_dir(const std::string& parent, const std::string& prefix) override {
    auto r = rel(parent);
    if (!r) return px().make_temp_dir(parent, prefix);
    std::lock_guard<std::mutex> g(mu_);
    count();
    const std::string p = px().make_temp_dir(parent, prefix);
    if (auto pr = rel(p)) cur_[*pr] = new_node(true);
    return p;
  }
  std::vector<std::string> list_dir(const std::string& dir) override { return px().list_dir(dir); }
  fsdp::detail::FileKind kind(const std::string& path) override { return px().kind(path); }
  bool same_file(const std::string& a, const std::string& b) override { return px().same_file(a, b); }
  int64_t read_proc(const char* path, char* buf, size_t cap) override { return px().read_proc(path, buf, cap); }
  std::string read_link(const std::string& path) override { return px().read_link(path); }
  int reopen_direct(int fd) override { return px().reopen_direct(fd); }

 private:
  struct Node {
    bool dir;
    std::string data;                 // a file's durable bytes
    std::map<std::string, int> kids;  // a folder's durable entries
  };

  // A file under root: its writes and syncs are mutating calls; a sync makes
  // its bytes durable.
  class TrackedFile final : public fsdp::detail::File {
   public:
    TrackedFile(FaultInjectionEnv* env, std::unique_ptr<fsdp::detail::File> f, int id)
        : env_(env), f_(std::move(f)), id_(id) {}
    const std::string& path() const override { return f_->path(); }
    int64_t size() const override { return f_->size(); }
    void append(const void* data, size_t n) override {
      env_->counted([&] { f_->append(data, n); });
    }
    void pwrite(int64_t offset, const void* data, size_t n) override {
      env_->counted([&] { f_->pwrite(offset, data, n); });
    }
    void pread(int64_t offset, size_t n, void* dst) const override { f_->pread(offset, n, dst); }
    void sync() override {
      env_->counted([&] {  // the model's sync; no real fsync (see sync_dir)
        std::string bytes(static_cast<size_t>(f_->size()), '\0');
        if (!bytes.empty()) f_->pread(0, bytes.size(), bytes.data());
        env_->nodes_[static_cast<size_t>(id_)].data = std::move(bytes);
      });
    }
    void close() override { f_->close(); }
    int fd() const override { return f_->fd(); }

   private:
    FaultInjectionEnv* env_;
    std::unique_ptr<fsdp::detail::File> f_;
    int id_;
  };

  static fsdp::detail::Env& px() { return fsdp::detail::Env::posix(); }
  static std::string normal(const std::string& p) {
    std::string s = std::filesystem::absolute(p).lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s;
  }
  // `path` relative to root ("" for root itself); nullopt outside it.
  std::optional<std::string> rel(const std::string& path) const {
    const std::string p = normal(path);
    if (p == root_) return std::string();
    if (p.size() > root_.size() && p.compare(0, root_.size(), root_) == 0 && p[root_.size()] == '/')
      return p.substr(root_.size() + 1);
    return std::nullopt;
  }
  static bool is_child(const std::string& p, const std::string& dir) {
    if (p.empty()) return false;
    if (dir.empty()) return p.find('/') == std::string::npos;
    return p.size() > dir.size() + 1 && p.compare(0, dir.size(), dir) == 0 && p[dir.size()] == '/' &&
           p.find('/', dir.size() + 1) == std::string::npos;
  }
  static bool in_tree(const std::string& p, const std::string& top) {
    return p == top || (p.size() > top.size() && p.compare(0, top.size(), top) == 0 && p[top.size()] == '/');
  }

  // Under mu_. One mutating call: the crash, when it is this one.
  void count() {
    if (crashed_) throw SimulatedCrash{};
    ++ops_;
    if (ops_ == crash_at_) {
      crashed_ = true;
      throw SimulatedCrash{};
    }
  }
  template <class F>
  void counted(F&& f) {
    std::lock_guard<std::mutex> g(mu_);
    count();
    f();
  }
  int new_node(bool dir) {
    nodes_.push_back(Node{dir, {}, {}});
    return static_cast<int>(nodes_.size()) - 1;
  }
  // Removes `top` and everything under it from the live tree; returns them
  // keyed by their path's suffix after `top` ("" for top itself).
  std::map<std::string, int> take_tree(const std::string& top) {
    std::map<std::string, int> out;
    for (auto it = cur_.begin(); it != cur_.end();) {
      if (!it->first.empty() && in_tree(it->first, top)) {
        out[it->first.substr(top.size())] = it->second;
        it = cur_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
  void erase_tree(const std::string& top) { take_tree(top); }

  // Under mu_: the live tree from disk, all of it durable.
  void scan(const std::string& r, int id) {
    auto& px = fsdp::detail::Env::posix();
    const std::string abs = r.empty() ? root_ : root_ + "/" + r;
    for (auto& n : px.list_dir(abs)) {
      const std::string cr = r.empty() ? n : r + "/" + n;
      const std::string ca = root_ + "/" + cr;
      const bool dir = std::filesystem::is_directory(std::filesystem::symlink_status(ca));
      const int k = new_node(dir);
      cur_[cr] = k;
      nodes_[static_cast<size_t>(id)].kids[n] = k;
      if (dir) {
        scan(cr, k);
      } else {
        std::ifstream in(ca, std::ios::binary);
        nodes_[static_cast<size_t>(k)].data.assign(std::istreambuf_iterator<char>(in), {});
      }
    }
  }
  // Under mu_: the durable entries of folder `id` written at `abs` (a folder
  // that would contain itself, possible after unsynced renames of folders,
  // is cut there).
  void materialize(int id, const std::string& abs, std::set<int>& on_path, int depth) {
    if (depth > 64) return;
    for (auto& [name, k] : nodes_[static_cast<size_t>(id)].kids) {
      const Node& n = nodes_[static_cast<size_t>(k)];
      const std::string p = abs + "/" + name;
      if (n.dir) {
        if (on_path.count(k)) continue;
        std::filesystem::create_directory(p);
        on_path.insert(k);
        materialize(k, p, on_path, depth + 1);
        on_path.erase(k);
      } else {
        std::ofstream out(p, std::ios::binary | std::ios::trunc);
        out.write(n.data.data(), static_cast<std::streamsize>(n.data.size()));
      }
    }
  }

  const std::string root_;
  mutable std::mutex mu_;
  // Protected by mu_.
  std::vector<Node> nodes_;           // every inode, by id (0: root)
  std::map<std::string, int> cur_;    // the live tree: path under root -> inode
  int64_t ops_ = 0, crash_at_ = 0;
  bool crashed_ = false;
  bool exchange_ok_ = true;
};

}  // namespace fsdp::testing
