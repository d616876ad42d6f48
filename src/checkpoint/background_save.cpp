// fsdp-cpp checkpoints: one sharded save on a thread of its own (ckpt::BackgroundSave).
//
// The caller's part is the snapshot: a copy of every slice's data, so that
// training may change the originals at once. The thread's part is
// save_sharded over the copies, on a communicator nobody else uses, then
// freeing the copies. What a kill leaves behind is save_sharded's story
// (sharded_save.cpp): the previous checkpoint and `latest`, intact.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"
#include "fsdp/checkpoint.h"

namespace fsdp::ckpt {
using fsdp::detail::cat;

struct BackgroundSave::State {
  CommPtr comm;
  std::string root, path;
  int64_t step = 0;
  std::vector<Slice> model, optim;
  nlohmann::json train_state;
  SaveOptions opts;
  int64_t snapshot_bytes = 0;
  std::atomic<int64_t> held_bytes{0};
  std::atomic<bool> finished{false};
  SaveResult result;
  std::exception_ptr error;
  bool collected = false;
  std::thread thread;

  void run() {
    // The cycles training leaves: on a host whose cores training fills, the
    // write yields to it (this thread's own priority; nothing else changes).
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
    try {
      result = save_sharded(*comm, root, step, model, optim, train_state, opts);
    } catch (...) {
      error = std::current_exception();
    }
    model.clear();  // the snapshot goes as soon as it is written
    optim.clear();
    held_bytes = 0;
    finished = true;
  }
};

namespace {
// A copy of `s` whose data is this rank's elements, contiguous, owned.
Slice snapshot(const Slice& s, int64_t* bytes) {
  Slice c = s;
  if (s.data.defined() && s.data.numel() > 0) {
    c.data = s.data.detach().clone(at::MemoryFormat::Contiguous);
    *bytes += c.data.numel() * int64_t(c.data.element_size());
  }
  return c;
}
}  // namespace

BackgroundSave::BackgroundSave(CommPtr comm, std::string root, int64_t step, const std::vector<Slice>& model,
                               const std::vector<Slice>& optim, nlohmann::json train_state, SaveOptions opts)
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
  st.model.reserve(model.size());
  st.optim.reserve(optim.size());
  for (auto& s : model) st.model.push_back(snapshot(s, &st.snapshot_bytes));
  for (auto& s : optim) st.optim.push_back(snapshot(s, &st.snapshot_bytes));
  st.held_bytes = st.snapshot_bytes;
  st.thread = std::thread([s = state_] { s->run(); });
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
  return r;
}

}  // namespace fsdp::ckpt
