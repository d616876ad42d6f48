// fsdp-cpp: the Gloo communicator (see backends.h).
//
// Each collective is checked on the caller's thread, queued, and run on the
// communication thread by the path chosen once at construction
// (algorithms.h: the TCP ring, cross-memory attach, or the tiers), with the
// books every backend keeps (call_log.h).
//
// Lifetimes: the caller's tensors are captured by handle into each queued
// task, so their storage outlives the transfer even if the caller drops them
// early. The mesh, the path and the rendezvous outlive the queue (members
// are destroyed in reverse order: queue first, which runs what is still
// queued).
//
// Failure: a collective that throws (timeout, dead peer) is turned into one
// CollectiveError that names the call, its sequence number, the world and the
// ranks that never arrived (diagnosis.h: the evidence read from the store's
// progress keys and heartbeats); the queue then fails every later call with
// that same error.
//
// Groups (split): a group is a GlooCommunicator of its own over a subset of
// the parent's ranks, with its own Gloo mesh (keys under the parent's
// prefix, rendezvous.h), communication thread, sequence numbers, counters
// and timeout; its messages name global ranks. The traffic tier of each
// byte follows from where the algorithm sends it (ring.h) and the hosts of
// the ranks, exchanged by choose_transport.
//
// FSDP_DEBUG=detail: before each collective the ranks compare their calls
// (call_check.h).

#include <algorithm>
#include <cstdio>

#include "comm/algorithms.h"
#include "comm/backends.h"
#include "comm/call_check.h"
#include "comm/call_log.h"
#include "comm/checks.h"
#include "comm/diagnosis.h"
#include "comm/host_shared.h"
#include "comm/mesh.h"
#include "comm/rendezvous.h"
#include "comm/ring.h"
#include "comm/watchdog.h"
#include "comm/work_queue.h"
#include "fsdp/errors.h"
#include "fsdp/flight.h"
#include "fsdp/trace.h"

namespace fsdp::comm {
namespace {

std::vector<int> iota(int n) {
  std::vector<int> v(n);
  for (int q = 0; q < n; ++q) v[q] = q;
  return v;
}

// Host identities -> indices numbered in rank order of first appearance.
std::vector<int> index_hosts(const std::vector<std::string>& host) {
  std::vector<int> out;
  std::vector<std::string> seen;
  for (auto& h : host) {
    auto it = std::find(seen.begin(), seen.end(), h);
    out.push_back(static_cast<int>(it - seen.begin()));
    if (it == seen.end()) seen.push_back(h);
  }
  return out;
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const WorldEnv& world, const ResolvedOptions& opts)
      : world_(world), opts_(opts), global_(iota(world.world_size)),
        rdv_(std::make_unique<Rendezvous>(world, opts)),
        watchdog_(Watchdog::acquire(world, rdv_->key_base(), opts)),
        mesh_(rdv_->connect_gloo(opts.ifname)),
        transport_(choose_transport(mesh_.get(), opts.transport, opts.host_id, Clock::now() + opts.rendezvous_timeout)),
        host_index_(index_hosts(transport_.host)),
        log_(rdv_->generation(), rdv_.get(), Counters()),
        queue_(std::make_unique<WorkQueue>()) {
    choose_path();
    if (opts_.debug_info && world_.rank == 0)
      std::fprintf(stderr, "fsdp: FSDP_DEBUG: collectives move bytes by %s: %s\n", path::words(choice_.path),
                   choice_.reason.c_str());
  }

  // A group of `parent`'s ranks (split): `group` is its own rank and size,
  // `global` its ranks' global ranks.
  GlooCommunicator(const GlooCommunicator& parent, const std::string& tag, const WorldEnv& group,
                   const ResolvedOptions& opts, std::vector<int> global, std::string name)
      : world_(group), opts_(opts), global_(std::move(global)), group_(std::move(name)),
        rdv_(std::make_unique<Rendezvous>(*parent.rdv_, tag, group, global_)),
        watchdog_(parent.watchdog_),
        mesh_(rdv_->connect_gloo(opts.ifname)),
        transport_(choose_transport(mesh_.get(), opts.transport, opts.host_id,
                                    Clock::now() + opts.rendezvous_timeout, global_, group_)),
        host_index_(index_hosts(transport_.host)),
        log_(rdv_->generation(), rdv_.get(), Counters::child_of(parent.log_.counters())),
        queue_(std::make_unique<WorkQueue>()) {
    choose_path();
    if (opts_.debug_info && world_.rank == 0)
      std::fprintf(stderr, "fsdp: FSDP_DEBUG: group '%s' (%s) moves bytes by %s: %s\n", group_.c_str(),
                   names().ranks_text().c_str(), path::words(choice_.path), choice_.reason.c_str());
  }

  ~GlooCommunicator() override {
    queue_.reset();  // runs what is queued, each bounded by its timeout
    // After a failure the others are failing too: nobody waits for anybody.
    if (failed_) return;
    algorithms_->leave(opts_.timeout);
    rdv_->leave(opts_.timeout);
  }

  int rank() const override { return world_.rank; }
  int world_size() const override { return world_.world_size; }
  int local_rank() const override { return world_.local_rank; }
  int local_world_size() const override { return world_.local_world_size; }

  WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output, const CollectiveInfo& info) override {
    CallShape shape = checked([&] { return check_all_gather(input, output, world_.world_size, info); });
    auto lossy = compressible(info, input.scalar_type());
    return submit(shape, [input, output, lossy, this](const Wire& w) {
      return algorithms_->all_gather(w, input.data_ptr(), output.data_ptr(), input.numel() * input.element_size(),
                                     lossy.get());
    });
  }

  WorkPtr reduce_scatter(const torch::Tensor& input, torch::Tensor output, ReduceOp op,
                         const CollectiveInfo& info) override {
    CallShape shape =
        checked([&] { return check_reduce_scatter(input, output, op, world_.world_size, info); });
    const int d = divisor(op, world_.world_size);
    auto lossy = compressible(info, input.scalar_type());
    return submit(shape, [input, output, d, lossy, this](const Wire& w) {
      return algorithms_->reduce_scatter(w, input.data_ptr(), output.data_ptr(), output.numel(), input.scalar_type(),
                                         d, lossy.get());
    });
  }

  WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op, const CollectiveInfo& info) override {
    CallShape shape = checked([&] { return check_all_reduce(tensor, op, info); });
    const int d = divisor(op, world_.world_size);
    auto lossy = compressible(info, tensor.scalar_type());
    return submit(shape, [tensor, d, lossy, this](const Wire& w) {
      return algorithms_->all_reduce(w, tensor.data_ptr(), tensor.numel(), tensor.scalar_type(), d, lossy.get());
    });
  }

  // broadcast, gather and barrier take the direct algorithms on this
  // communicator's own mesh, whatever the path (algorithms.h).
  WorkPtr broadcast(torch::Tensor tensor, int root, const CollectiveInfo& info) override {
    CallShape shape = checked([&] { return check_broadcast(tensor, root, world_.world_size, info); });
    return submit(shape, [tensor, root](const Wire& w) {
      return Traffic(direct_broadcast(w, tensor.data_ptr(), tensor.numel() * tensor.element_size(), root));
    });
  }

  WorkPtr gather(const torch::Tensor& input, torch::Tensor output, int root, const CollectiveInfo& info) override {
    CallShape shape =
        checked([&] { return check_gather(input, output, root, world_.rank, world_.world_size, info); });
    return submit(shape, [input, output, root](const Wire& w) {
      return Traffic(direct_gather(w, input.data_ptr(), output.defined() ? output.data_ptr() : nullptr,
                                   input.numel() * input.element_size(), root));
    });
  }

  WorkPtr barrier(const CollectiveInfo& info) override {
    CallShape shape;
    shape.kind = CollectiveKind::BARRIER;
    shape.label = info.label;
    return submit(shape, [](const Wire& w) { return Traffic(dissemination_barrier(w)); });
  }

  CommCounters counters() const override { return log_.counters().snapshot(); }
  void reset_counters() override { log_.counters().reset(); }
  std::chrono::milliseconds timeout() const override { return opts_.timeout; }
  std::string describe() const override {
    const char* path = algorithms_->name();
    const char* shared = algorithms_->host_shared() ? " host-shared" : "";
    if (group_.empty()) return detail::cat(path, " world=", world_.world_size, " rank=", world_.rank, shared);
    // Naming's ranks_text without names(), which calls describe().
    return detail::cat(path, " group '", group_, "' of ranks ", Naming{group_, global_, ""}.ranks_text(),
                       " rank=", global_[world_.rank], shared);
  }
  std::vector<int> global_ranks() const override { return global_; }
  std::vector<int> hosts() const override { return host_index_; }

  bool shares_host_memory() const override { return algorithms_->host_shared() != nullptr; }

  // Collective: a memfd of the first rank of each host, mapped by every
  // rank of that host on the communication thread (in issue order, under a
  // sequence number of its own); the tensor's deleter unmaps it, holding
  // the HostShared alive.
  torch::Tensor shared_tensor(int64_t numel, torch::ScalarType dtype, const CollectiveInfo& info) override {
    auto hs = algorithms_->host_shared();
    if (!hs) return Communicator::shared_tensor(numel, dtype, info);
    FSDP_USER_CHECK(numel > 0, "shared_tensor: numel must be positive, found ", numel);
    const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
    CallShape shape;
    shape.kind = CollectiveKind::BROADCAST;
    shape.label = "host-shared memory" + (info.label.empty() ? std::string() : " for " + info.label);
    shape.dtype = dtype;
    shape.numel = numel;
    shape.elem_size = static_cast<int64_t>(c10::elementSize(dtype));
    shape.root = 0;
    auto base = std::make_shared<void*>(nullptr);
    submit(shape, [this, bytes, base](const Wire& w) {
      *base = algorithms_->map_common(w, bytes);
      return Traffic(0);
    })->wait();
    void* p = *base;
    return torch::from_blob(p, {numel}, [hs](void* q) { hs->release(q); }, torch::TensorOptions(dtype));
  }

  torch::Tensor peer_tensor(int64_t numel, torch::ScalarType dtype) override {
    auto hs = algorithms_->host_shared();
    if (!hs) return Communicator::peer_tensor(numel, dtype);
    const int64_t bytes = std::max<int64_t>(1, numel) * static_cast<int64_t>(c10::elementSize(dtype));
    void* p = hs->take_block(bytes);
    return torch::from_blob(p, {numel}, [hs](void* q) { hs->release(q); }, torch::TensorOptions(dtype));
  }

  int64_t peer_memory_bytes() const override {
    auto hs = algorithms_->host_shared();
    return hs ? hs->block_bytes() : 0;
  }

  // Error feedback lives on the path (Algorithms::feedback) and is touched
  // by the communication thread alone: both calls run there as queued tasks,
  // after every collective issued before them, and wait. They move no bytes,
  // take no sequence number and are not logged as collectives.
  Residuals residuals() override {
    auto out = std::make_shared<Residuals>();
    queue_->submit([this, out] {
      const ErrorFeedback* ef = algorithms_->feedback();
      if (!ef) return;
      out->compress = opts_.compress;
      for (const auto& [key, r] : ef->state()) out->by_buffer[key] = r.clone();
    })->wait();
    return std::move(*out);
  }

  void load_residuals(const std::map<std::string, torch::Tensor>& by_buffer) override {
    // Checked here, so the task cannot throw and poison the queue.
    for (const auto& [key, t] : by_buffer)
      FSDP_USER_CHECK(t.defined() && at::isFloatingType(t.scalar_type()), "load_residuals: the residual of '", key,
                      "' is ", t.defined() ? dtype_name(t.scalar_type()) : std::string("undefined"),
                      "; expected a floating tensor (fp32, as residuals() gives it)");
    if (!by_buffer.empty() && !algorithms_->feedback()) return Communicator::load_residuals(by_buffer);
    queue_->submit([this, by_buffer] {
      if (ErrorFeedback* ef = algorithms_->feedback()) ef->load(by_buffer);
    })->wait();
  }

  CommPtr split(int color, const SplitOptions& so) override {
    FSDP_USER_CHECK(color >= 0, "Communicator::split: the color must be >= 0, found ", color,
                    " on rank ", global_[world_.rank], " (every rank names the group it joins by a color >= 0)");
    const int n = world_.world_size, r = world_.rank;
    auto mine = torch::full({1}, color, torch::kInt32);
    auto all = torch::empty({n}, torch::kInt32);
    all_gather(mine, all, {"split '" + so.name + "'"})->wait();
    std::vector<int> members, global;
    for (int q = 0; q < n; ++q)
      if (all[q].item<int>() == color) {
        members.push_back(q);
        global.push_back(global_[q]);
      }
    ResolvedOptions o = opts_;
    if (so.timeout.count() > 0) o.timeout = so.timeout;
    const int k = splits_++;  // every rank here splits in the same order
    if (members.size() == 1) return make_world_of_one(o, global.front(), so.name);
    WorldEnv g = world_;
    g.world_size = static_cast<int>(members.size());
    g.rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    g.local_rank = g.local_world_size = 0;
    for (int q : members) {
      if (host_index_[q] != host_index_[r]) continue;
      g.local_rank += q < r;
      g.local_world_size += 1;
    }
    return std::make_shared<GlooCommunicator>(*this, detail::cat("s", k, "/", color, "/"), g, o,
                                              std::move(global), so.name);
  }

 private:
  // A collective's bytes on the wire, run by the communication thread.
  using Algorithm = std::function<Traffic(const Wire&)>;

  // What the path may compress of a call (algorithms.h): only calls the
  // caller marked compressible, only floating dtypes the quantizer decodes
  // into; null otherwise, and always when the path does not compress.
  std::shared_ptr<const Compressible> compressible(const CollectiveInfo& info, c10::ScalarType dt) const {
    if (!info.compressible || !choice_.compressed) return nullptr;
    if (dt != c10::kFloat && dt != c10::kBFloat16 && dt != c10::kHalf) return nullptr;
    return std::make_shared<const Compressible>(Compressible{info.label, dt});
  }

  // Misuse is reported to the caller right away and poisons the queue: the
  // other ranks issued this call, so this rank is out of step for good.
  template <class Check>
  CallShape checked(Check check) {
    if (auto f = queue_->failure()) std::rethrow_exception(f);
    try {
      return check();
    } catch (...) {
      failed_ = true;
      queue_->fail(std::current_exception());
      throw;
    }
  }

  WorkPtr submit(const CallShape& shape, Algorithm algo) {
    const uint64_t ticket = log_.issued(shape);
    return queue_->submit([this, shape, ticket, algo = std::move(algo)] { execute(shape, ticket, algo); });
  }

  // On the communication thread, in issue order.
  void execute(const CallShape& shape, uint64_t ticket, const Algorithm& algo) {
    CallLog::Entered call(log_, shape, ticket);
    if (call.span.active()) trace::set_thread_name("comm");
    Wire w{mesh_.get(), call.seq, call.start + opts_.timeout, call.progress.get()};
    w.piece_bytes = opts_.ring_piece_bytes;
    Traffic sent;
    try {
      if (opts_.debug_detail) check_same_call(w, shape, names());
      sent = algo(w);
    } catch (const CallMismatch& e) {
      failed_ = true;
      give_up_host_barriers(call.seq);
      watchdog_->mark_failed();
      log_.finished(ticket, e.what());
      dump_flight(call.seq, call.what);
      throw;
    } catch (const std::exception& e) {
      failed_ = true;
      give_up_host_barriers(call.seq);
      std::string msg = report_failure(call, shape, e.what());
      log_.finished(ticket, e.what());
      msg += dump_flight(call.seq, call.what);
      throw CollectiveError(msg);
    }
    log_.finished(ticket);
    const int64_t bytes = sent.bytes, inter = sent.inter >= 0 ? sent.inter : inter_host_bytes(shape, bytes);
    call.span.arg("bytes", bytes);
    if (call.span.active()) {
      call.span.arg("inter_host_bytes", inter);
      if (sent.inter >= 0 && algorithms_->path() == path::Path::TIERS) call.span.arg("tiers", 1);
      if (sent.host_shared) call.span.arg("host_shared", 1);
    }
    if (sent.inter_logical >= 0 && call.span.active()) call.span.arg("inter_host_logical_bytes", sent.inter_logical);
    log_.count(shape.kind, bytes, inter, call.seconds(), sent.inter_logical);
  }

  // A failed collective leaves this communicator for good: the ranks of
  // this host that wait for it at a barrier in their shared memory learn it
  // now (host_shared.h), as Gloo fails every link of a mesh at once, not at
  // their own deadline after this rank's diagnosis.
  void give_up_host_barriers(uint64_t seq) {
    if (auto hs = algorithms_->host_shared()) hs->abandon(seq);
  }

  // Of the `bytes` this rank sent in one collective, those that went to a
  // rank on another host. The ring algorithms send to the right neighbour
  // only; broadcast's root sends the tensor to every other rank; gather's
  // ranks send to the root; the barrier sends one byte per round to rank
  // r + 2^k (ring.h). On the CMA path every rank is on this host (no byte
  // is far); the tiers count their own split (tiers.h).
  int64_t inter_host_bytes(const CallShape& shape, int64_t bytes) const {
    const int n = world_.world_size, r = world_.rank;
    auto far = [&](int q) { return host_index_[q] != host_index_[r]; };
    if (bytes == 0) return 0;
    switch (shape.kind) {
      case CollectiveKind::BROADCAST: {
        int far_peers = 0;
        for (int q = 0; q < n; ++q) far_peers += q != r && far(q);
        return bytes / (n - 1) * far_peers;
      }
      case CollectiveKind::GATHER: return far(shape.root) ? bytes : 0;
      case CollectiveKind::BARRIER: {
        int64_t out = 0;
        for (int dist = 1; dist < n; dist *= 2) out += far((r + dist) % n);
        return out;
      }
      default: return far((r + 1) % n) ? bytes : 0;
    }
  }

  // The path every collective of this communicator takes, chosen once
  // (algorithms.h; the decision itself is path::choose's).
  void choose_path() {
    ChosenPath chosen =
        choose_algorithms({opts_, world_, *rdv_, mesh_.get(), transport_, host_index_, global_, group_});
    choice_ = std::move(chosen.choice);
    algorithms_ = std::move(chosen.algorithms);
  }

  // How messages name this communicator and its ranks.
  Naming names() const { return {group_, global_, describe()}; }

  // The message of a failed collective (diagnosis.h): what this rank knows,
  // the evidence it collects, its classification; the verdict is published
  // for the launcher and the flight recorder.
  std::string report_failure(const CallLog::Entered& call, const CallShape& shape, const std::string& error) {
    FailedCall f;
    f.seq = call.seq;
    f.what = call.what;
    f.kind = to_string(shape.kind);
    f.unit = shape.label;
    f.error = error;
    f.seconds = call.seconds();
    f.timeout_s = opts_.timeout.count() / 1000.0;
    f.record(*call.progress);
    watchdog_->mark_failed();
    const Evidence ev = collect_evidence(evidence_from(*watchdog_, *rdv_, *algorithms_), global_, world_.rank, f);
    Classified c = classify(ev);
    c.verdict.timed_out = f.timed_out();
    if (f.peer >= 0) c.verdict.waited_on.push_back(f.peer);
    publish_verdict(*watchdog_, rdv_->key_base(), global_[world_.rank], c.verdict, ev);
    return render_failure(f, ev, c, names(), algorithms_->error_source());
  }

  // Dumps the flight recorder after a failed collective; the line for the
  // error message ("" when the dump failed: it said why on stderr).
  std::string dump_flight(uint64_t seq, const std::string& what) {
    const std::string path = flight::dump(detail::cat("collective #", seq, " failed: ", what));
    if (path.empty()) return "";
    const std::string dir = path.substr(0, path.rfind('/'));
    return detail::cat("\nFlight recorder: ", path, " (every rank's last ", flight::capacity(),
                       " collectives; fsdp report ", dir, " shows them side by side).");
  }

  // Constant after construction.
  const WorldEnv world_;  // a group's: its own rank and size
  const ResolvedOptions opts_;
  const std::vector<int> global_;  // global rank of each rank here
  const std::string group_;        // a group's name; "" for a world
  std::unique_ptr<Rendezvous> rdv_;
  std::shared_ptr<Watchdog> watchdog_;  // heartbeats; shared by the process's communicators
  std::shared_ptr<Mesh> mesh_;          // this communicator's own links
  const TransportChoice transport_;     // same on every rank (choose_transport)
  const std::vector<int> host_index_;   // host of each rank (index_hosts)
  // Set once by choose_path in the constructor, then constant: the path
  // every collective takes and why (the same on every rank), and its
  // algorithms (which own the tiers' meshes on that path).
  path::Choice choice_;
  std::unique_ptr<Algorithms> algorithms_;

  // Its sequence numbers are touched only on the communication thread; its
  // counters are thread-safe.
  CallLog log_;
  // Touched only on the caller's thread (split).
  int splits_ = 0;

  std::atomic<bool> failed_{false};

  // Declared last: destroyed first, while everything its tasks use is alive.
  std::unique_ptr<WorkQueue> queue_;
};

}  // namespace

CommPtr make_gloo_communicator(const WorldEnv& world, const ResolvedOptions& opts) {
  return std::make_shared<GlooCommunicator>(world, opts);
}

}  // namespace fsdp::comm
