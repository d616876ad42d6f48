// fsdp-cpp checkpoints: one sharded save on a thread of its own (ckpt::BackgroundSave).
//
// The snapshot is a copy of every slice's data, taken by the caller
// (SnapshotCopy::IN_CALLER: training may change the originals at once) or as
// the thread's first part (ON_THREAD: the caller goes on at once and calls
// wait_for_snapshot before it changes them; a version counter that moved
// before then fails the save on every rank). The thread then runs
// save_sharded over the copies, on a communicator nobody else uses, and
// frees them. What a kill leaves behind is save_sharded's story
// (sharded_save.cpp): the previous checkpoint and `latest`, intact.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "checkpoint/collective.h"
#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"
#include "fsdp/checkpoint.h"
#include "fsdp/memory.h"

namespace fsdp::ckpt {
using fsdp::detail::cat;

struct BackgroundSave::State {
  CommPtr comm;
  std::string root, path;
  int64_t step = 0;
  std::vector<Slice> model, optim, per_rank;  // per_rank: detail::per_rank_slices
  nlohmann::json train_state;
  SaveOptions opts;
  int64_t snapshot_bytes = 0;
  std::atomic<int64_t> held_bytes{0};
  std::atomic<bool> finished{false};
  SaveResult result;
  std::exception_ptr error;
  bool collected = false;
  std::thread thread;

  // The snapshot copied on the thread (SnapshotCopy::ON_THREAD): the
  // originals' tensors and their version counters when the save began; a
  // change of any before the caller's first wait_for_snapshot means the copy
  // may hold part old, part new values.
  std::vector<torch::Tensor> originals;
  std::vector<std::string> original_names;
  std::vector<int64_t> versions;
  std::mutex mu;
  std::condition_variable staged_cv;
  bool staged = false;  // the snapshot is copied (or its copy failed)
  bool fenced = false;  // the caller waited for it: changes after that are its own
  double waited = 0;    // seconds the caller spent in wait_for_snapshot
  std::string spoiled;  // why the snapshot cannot be trusted ("" when it can)

  // Under mu. The first original whose version moved since the save began.
  std::string changed_originals() const {
    for (size_t i = 0; i < originals.size(); ++i)
      if (originals[i]._version() != versions[i])
        return cat("'", original_names[i], "' changed while the background save of ", path,
                   " was copying it (version ", versions[i], " -> ", originals[i]._version(),
                   "), so the snapshot may mix old and new values. Expected: parameters and optimizer state left "
                   "alone until the next backward ends or fsdp::wait_for_snapshot returns (the optimizer step "
                   "after a backward is safe). This save is abandoned");
    return {};
  }

  // Asked by save_sharded_checked on the thread: unless the caller waited
  // already (and checked then, before changing anything), the originals
  // must not have moved.
  std::string check() {
    std::lock_guard<std::mutex> lock(mu);
    if (spoiled.empty() && !fenced) spoiled = changed_originals();
    return spoiled;
  }

  void copy_snapshot() {
    try {
      for (auto* list : {&model, &optim, &per_rank})
        for (Slice& s : *list)
          if (s.data.defined() && s.data.numel() > 0) s.data = s.data.detach().clone(at::MemoryFormat::Contiguous);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      spoiled = cat("copying the snapshot failed: ", e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      staged = true;
    }
    staged_cv.notify_all();
  }

  void run() {
    // Everything this thread allocates (the snapshot's copies, the writer's
    // buffers) is the save's, not training's: the ledger measures training's
    // activations while it runs (memory::BackgroundWork).
    memory::BackgroundWork background;
    // The copy at the caller's priority (the next optimizer step waits for
    // it); then the write takes the cycles training leaves: on a host whose
    // cores training fills, it yields to it (this thread's own priority;
    // nothing else changes).
    const bool on_thread = !originals.empty();
    if (on_thread) copy_snapshot();
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
    try {
      result = detail::save_sharded_checked(*comm, root, step, model, optim, per_rank, train_state, opts,
                                            on_thread ? std::function<std::string()>([this] { return check(); })
                                                      : std::function<std::string()>());
    } catch (...) {
      error = std::current_exception();
    }
    model.clear();  // the snapshot goes as soon as it is written
    optim.clear();
    per_rank.clear();
    {
      std::lock_guard<std::mutex> lock(mu);
      originals.clear();
    }
    held_bytes = 0;
    finished = true;
  }
};

namespace {
int64_t data_bytes(const Slice& s) {
  return s.data.defined() ? s.data.numel() * int64_t(s.data.element_size()) : 0;
}
}  // namespace

BackgroundSave::BackgroundSave(CommPtr comm, std::string root, int64_t step, const std::vector<Slice>& model,
                               const std::vector<Slice>& optim, nlohmann::json train_state, SaveOptions opts,
                               SnapshotCopy copy, const std::map<std::string, torch::Tensor>& per_rank)
    : state_(std::make_shared<State>()) {
  FSDP_USER_CHECK(comm, "BackgroundSave: the communicator is null; expected one that carries nothing else "
                        "while the save runs (split it from the training communicator)");
  State& st = *state_;
  st.comm = std::move(comm);
  st.path = detail::join_path(root, detail::step_dir_name(step < 0 ? 0 : step));
  st.root = std::move(root);
  st.step = step;
  st.train_state = std::move(train_state);
  st.opts = std::move(opts);
  st.model = model;
  st.optim = optim;
  st.per_rank = detail::per_rank_slices(st.comm->rank(), per_rank);
  // Only the CPU's tensors are copied on the thread: a device's copy is
  // quick where it is, and stays on the caller's stream.
  bool on_thread = copy == SnapshotCopy::ON_THREAD;
  // The copies made here belong to the save, as its thread's do.
  memory::BackgroundWork background;
  for (auto* list : {&st.model, &st.optim, &st.per_rank})
    for (const Slice& s : *list) {
      st.snapshot_bytes += s.data.defined() && s.data.numel() > 0 ? data_bytes(s) : 0;
      if (s.data.defined() && s.data.numel() > 0 && !s.data.device().is_cpu()) on_thread = false;
    }
  for (auto* list : {&st.model, &st.optim, &st.per_rank})
    for (Slice& s : *list) {
      if (!s.data.defined() || s.data.numel() == 0) continue;
      if (on_thread) {
        st.originals.push_back(s.data);
        st.original_names.push_back(s.name);
        st.versions.push_back(s.data._version());
      } else {
        s.data = s.data.detach().clone(at::MemoryFormat::Contiguous);
      }
    }
  st.staged = !on_thread || st.originals.empty();
  st.held_bytes = st.snapshot_bytes;
  st.thread = std::thread([s = state_] { s->run(); });
}

void BackgroundSave::wait_for_snapshot() {
  State& st = *state_;
  const auto began = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(st.mu);
  if (!st.staged) {  // only a copy still under way costs training time (none when the call copied it)
    st.staged_cv.wait(lock, [&] { return st.staged; });
    st.waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  }
  if (st.fenced) return;
  if (st.spoiled.empty() && !st.originals.empty()) st.spoiled = st.changed_originals();
  st.fenced = true;
}

bool BackgroundSave::snapshot_taken() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->staged;
}

BackgroundSave::~BackgroundSave() {
  State& st = *state_;
  if (st.thread.joinable()) st.thread.join();
  if (st.error && !st.collected) {
    try {
      std::rethrow_exception(st.error);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fsdp: the background save of %s failed and nobody waited for it: %s\n",
                   st.path.c_str(), e.what());
    }
  }
}

int64_t BackgroundSave::step() const { return state_->step; }
const std::string& BackgroundSave::path() const { return state_->path; }
int64_t BackgroundSave::held_bytes() const { return state_->held_bytes; }
int64_t BackgroundSave::snapshot_bytes() const { return state_->snapshot_bytes; }
bool BackgroundSave::finished() const { return state_->finished; }

SaveResult BackgroundSave::wait() {
  State& st = *state_;
  if (st.collected)
    throw Error(cat("BackgroundSave::wait: the save of ", st.path, " was already waited for; expected one wait() "
                    "per save"));
  if (st.thread.joinable()) st.thread.join();
  st.collected = true;
  if (st.error) {
    try {
      std::rethrow_exception(st.error);
    } catch (const std::exception& e) {
      // The rank that failed has its own message; the others say the consequence already.
      const std::string what = e.what();
      const bool says_so = what.find("previous checkpoint is intact") != std::string::npos;
      throw Error(cat("the background save of ", st.path, " failed: ", what,
                      says_so ? "" : " Nothing was saved; the previous checkpoint is intact."));
    }
  }
  SaveResult r = st.result;
  r.in_background = true;
  r.snapshot_bytes = st.snapshot_bytes;
  std::lock_guard<std::mutex> lock(st.mu);
  r.snapshot_wait_seconds = st.waited;
  return r;
}

}  // namespace fsdp::ckpt
