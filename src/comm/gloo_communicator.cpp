// fsdp-cpp: the Gloo communicator (see backends.h).
//
// Lifetimes: the caller's tensors are captured by handle into each queued
// task, so their storage outlives the transfer even if the caller drops them
// early. The Gloo context outlives the queue (members are destroyed in
// reverse order: queue first, which runs what is still queued).
//
// Failure: a collective that throws (timeout, dead peer) is turned into one
// CollectiveError that names the call, its sequence number, the world and the
// ranks that never arrived (read from the store's progress keys); the queue
// then fails every later call with that same error.
//
// Groups (split): a group is a GlooCommunicator of its own over a subset of
// the parent's ranks, with its own Gloo mesh (keys under the parent's
// prefix, rendezvous.h), communication thread, sequence numbers, counters
// and timeout; its messages name global ranks. The traffic tier of each
// byte follows from where the algorithm sends it (ring.h) and the hosts of
// the ranks, exchanged by choose_transport.
//
// FSDP_DEBUG=detail: before each collective the ranks all-gather a fixed-size
// record of the call (kind, dtype, element count, root, reduce op, label) on
// the same Gloo slot space, step numbers from kCheckStepBase up, so it can
// never match a message of the collective itself. A difference becomes one
// CollectiveError on every rank (they all see the same records) listing each
// rank's call, instead of a hang or a silently wrong sum.
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <thread>
#include <mutex>

#include "comm/backends.h"
#include "comm/checks.h"
#include "comm/cma.h"
#include "comm/rendezvous.h"
#include "comm/ring.h"
#include "comm/work_queue.h"
#include "fsdp/errors.h"
#include "fsdp/trace.h"

namespace fsdp::comm {
namespace {

// Diagnosis reads the store after a failure; it must not eat the slack
// between the timeout and the promised "timeout + 2 s".
constexpr std::chrono::milliseconds kDiagnosisBudget{1500};

// Steps of the FSDP_DEBUG=detail exchange (collectives use steps < 2N).
constexpr int kCheckStepBase = 1 << 19;

// One rank's call as exchanged by the detail check: fixed layout, same host
// architecture on every rank (Gloo moves raw bytes).
struct CallRecord {
  uint64_t seq;
  int32_t kind, dtype, root, reduce_op;
  int64_t numel;
  char label[48];  // truncated, NUL-terminated
};
static_assert(sizeof(CallRecord) == 80, "CallRecord must have no hidden padding");

CallRecord record_of(const CallShape& s, uint64_t seq) {
  CallRecord r;
  std::memset(&r, 0, sizeof r);
  r.seq = seq;
  r.kind = static_cast<int32_t>(s.kind);
  r.dtype = static_cast<int32_t>(s.dtype);
  r.root = s.root;
  r.reduce_op = s.reduce_op;
  r.numel = s.numel;
  std::strncpy(r.label, s.label.c_str(), sizeof r.label - 1);
  return r;
}

bool same_call(const CallRecord& a, const CallRecord& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.numel == b.numel && a.root == b.root &&
         a.reduce_op == b.reduce_op;
}

std::string describe_record(const CallRecord& r) {
  if (r.kind < 0 || r.kind >= static_cast<int>(CollectiveKind::kCount)) return detail::cat("kind ", r.kind, "?");
  auto kind = static_cast<CollectiveKind>(r.kind);
  std::string out = detail::cat(to_string(kind), " '", r.label, "' #", r.seq);
  if (kind == CollectiveKind::BARRIER) return out;
  out += detail::cat(" (", dtype_name(static_cast<c10::ScalarType>(r.dtype)), ", ", r.numel, " elements");
  if (r.reduce_op >= 0) out += r.reduce_op == static_cast<int>(ReduceOp::SUM) ? ", SUM" : ", AVG";
  if (r.root >= 0) out += detail::cat(", root ", r.root);
  return out + ")";
}

// Thrown by the detail check; already the final message (no diagnosis).
class CallMismatch : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// One communicator's counters. A group adds each collective into its own
// and into every ancestor's, so a world's counters() include the traffic of
// the groups split from it (gpt's end-of-run lines read the world's).
struct CounterBox {
  mutable std::mutex mu;
  CommCounters c;  // guarded by mu
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const WorldEnv& world, const ResolvedOptions& opts)
      : world_(world), opts_(opts), global_(iota(world.world_size)),
        rdv_(std::make_unique<Rendezvous>(world, opts.rendezvous_timeout, opts.job_token)),
        ctx_(rdv_->connect_gloo(opts.ifname)),
        transport_(choose_transport(ctx_.get(), opts.transport, Clock::now() + opts.rendezvous_timeout)),
        host_index_(index_hosts(transport_.host)),
        queue_(std::make_unique<WorkQueue>()) {
    if (opts_.debug_info && world_.rank == 0)
      std::fprintf(stderr, "fsdp: FSDP_DEBUG: collectives move bytes by %s: %s\n",
                   transport_.cma ? "cma (cross-memory attach)" : "gloo/tcp", transport_.why.c_str());
  }

  // A group of `parent`'s ranks (split): `group` is its own rank and size,
  // `global` its ranks' global ranks.
  GlooCommunicator(const GlooCommunicator& parent, const std::string& tag, const WorldEnv& group,
                   const ResolvedOptions& opts, std::vector<int> global, std::string name)
      : world_(group), opts_(opts), global_(std::move(global)), group_(std::move(name)),
        ancestors_(parent.ancestors_),
        rdv_(std::make_unique<Rendezvous>(*parent.rdv_, tag, group, global_)),
        ctx_(rdv_->connect_gloo(opts.ifname)),
        transport_(choose_transport(ctx_.get(), opts.transport, Clock::now() + opts.rendezvous_timeout)),
        host_index_(index_hosts(transport_.host)),
        queue_(std::make_unique<WorkQueue>()) {
    ancestors_.push_back(parent.box_);
    if (opts_.debug_info && world_.rank == 0)
      std::fprintf(stderr, "fsdp: FSDP_DEBUG: group '%s' (%s) moves bytes by %s: %s\n", group_.c_str(),
                   ranks_text().c_str(), transport_.cma ? "cma (cross-memory attach)" : "gloo/tcp",
                   transport_.why.c_str());
  }

  ~GlooCommunicator() override {
    queue_.reset();  // runs what is queued, each bounded by its timeout
    // After a failure the others are failing too: nobody waits for anybody.
    if (!failed_) rdv_->leave(opts_.timeout);
  }

  int rank() const override { return world_.rank; }
  int world_size() const override { return world_.world_size; }
  int local_rank() const override { return world_.local_rank; }
  int local_world_size() const override { return world_.local_world_size; }

  WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output, const CollectiveInfo& info) override {
    CallShape shape = checked([&] { return check_all_gather(input, output, world_.world_size, info); });
    return submit(shape, [input, output, this](const Step& s) {
      const int n = world_.world_size, r = world_.rank;
      const int64_t block = input.numel() * input.element_size();
      char* out = static_cast<char*>(output.data_ptr());
      if (transport_.cma) return cma_all_gather(s, transport_.peers, input.data_ptr(), out, block);
      // In-place use (input is block r of output) needs no copy.
      if (block > 0 && input.data_ptr() != out + r * block) std::memmove(out + r * block, input.data_ptr(), block);
      std::vector<int64_t> offset(n), count(n, block);
      for (int j = 0; j < n; ++j) offset[j] = j * block;
      return ring_all_gather(s, out, offset, count);
    });
  }

  WorkPtr reduce_scatter(const torch::Tensor& input, torch::Tensor output, ReduceOp op,
                         const CollectiveInfo& info) override {
    CallShape shape =
        checked([&] { return check_reduce_scatter(input, output, op, world_.world_size, info); });
    return submit(shape, [input, output, op, this](const Step& s) {
      const int n = world_.world_size;
      const int64_t m = output.numel();
      if (transport_.cma)
        return cma_reduce_scatter(s, transport_.peers, input.data_ptr(), output.data_ptr(), m,
                                  input.scalar_type(), op == ReduceOp::AVG ? n : 1);
      std::vector<int64_t> offset(n), count(n, m);
      for (int j = 0; j < n; ++j) offset[j] = j * m;
      return ring_reduce_scatter(s, input.data_ptr(), output.data_ptr(), offset, count,
                                 input.scalar_type(), op == ReduceOp::AVG ? n : 1);
    });
  }

  WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op, const CollectiveInfo& info) override {
    CallShape shape = checked([&] { return check_all_reduce(tensor, op, info); });
    return submit(shape, [tensor, op, this](const Step& s) {
      // Ring reduce-scatter into our own chunk, then ring all-gather of the
      // chunks (uneven when numel % N != 0), all in place.
      const int n = world_.world_size, r = world_.rank;
      if (transport_.cma)
        return cma_all_reduce(s, transport_.peers, tensor.data_ptr(), tensor.numel(), tensor.scalar_type(),
                              op == ReduceOp::AVG ? n : 1);
      const int64_t es = tensor.element_size();
      Chunks c = ring_chunks(tensor.numel(), n);
      char* data = static_cast<char*>(tensor.data_ptr());
      int64_t sent = ring_reduce_scatter(s, data, data + c.offset[r] * es, c.offset, c.count,
                                         tensor.scalar_type(), op == ReduceOp::AVG ? n : 1);
      for (int j = 0; j < n; ++j) {
        c.offset[j] *= es;
        c.count[j] *= es;
      }
      return sent + ring_all_gather(s, data, c.offset, c.count, /*step_base=*/n);
    });
  }

  WorkPtr broadcast(torch::Tensor tensor, int root, const CollectiveInfo& info) override {
    CallShape shape = checked([&] { return check_broadcast(tensor, root, world_.world_size, info); });
    return submit(shape, [tensor, root](const Step& s) {
      return direct_broadcast(s, tensor.data_ptr(), tensor.numel() * tensor.element_size(), root);
    });
  }

  WorkPtr gather(const torch::Tensor& input, torch::Tensor output, int root, const CollectiveInfo& info) override {
    CallShape shape =
        checked([&] { return check_gather(input, output, root, world_.rank, world_.world_size, info); });
    return submit(shape, [input, output, root](const Step& s) {
      return direct_gather(s, input.data_ptr(), output.defined() ? output.data_ptr() : nullptr,
                           input.numel() * input.element_size(), root);
    });
  }

  WorkPtr barrier(const CollectiveInfo& info) override {
    CallShape shape;
    shape.kind = CollectiveKind::BARRIER;
    shape.label = info.label;
    return submit(shape, [](const Step& s) { return dissemination_barrier(s); });
  }

  CommCounters counters() const override {
    std::lock_guard<std::mutex> lock(box_->mu);
    return box_->c;
  }
  void reset_counters() override {
    std::lock_guard<std::mutex> lock(box_->mu);
    box_->c = {};
  }
  std::chrono::milliseconds timeout() const override { return opts_.timeout; }
  std::string describe() const override {
    const char* engine = transport_.cma ? "cma+gloo" : "gloo/tcp";
    if (group_.empty()) return detail::cat(engine, " world=", world_.world_size, " rank=", world_.rank);
    return detail::cat(engine, " group '", group_, "' of ranks ", ranks_text(), " rank=", global_[world_.rank]);
  }
  std::vector<int> global_ranks() const override { return global_; }
  std::vector<int> hosts() const override { return host_index_; }

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

  WorkPtr submit(const CallShape& shape, std::function<int64_t(const Step&)> algo) {
    return queue_->submit([this, shape, algo = std::move(algo)] { execute(shape, algo); });
  }

  // On the communication thread, in issue order.
  void execute(const CallShape& shape, const std::function<int64_t(const Step&)>& algo) {
    const uint64_t seq = ++seq_;
    // Times the collective on the "comm" track (the report's AG/RS lanes).
    trace::Span span(to_string(shape.kind), "comm");
    if (span.active()) {
      trace::set_thread_name("comm");
      span.arg("unit", shape.label).arg("seq", seq);
    }
    std::string what = describe_call(shape);
    rdv_->record_entered(seq, what);
    const auto t0 = Clock::now();
    Step step{ctx_.get(), seq, t0 + opts_.timeout};
    int64_t bytes = 0;
    try {
      if (opts_.debug_detail) check_same_call(step, shape);
      bytes = algo(step);
    } catch (const CallMismatch&) {
      failed_ = true;
      throw;
    } catch (const std::exception& e) {
      failed_ = true;
      throw CollectiveError(diagnose(seq, what, e.what(), Clock::now() - t0));
    }
    const int64_t inter = inter_host_bytes(shape, bytes);
    span.arg("bytes", bytes);
    if (span.active()) span.arg("inter_host_bytes", inter);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    auto add = [&](CounterBox& b) {
      std::lock_guard<std::mutex> lock(b.mu);
      auto& entry = b.c[shape.kind];
      entry.calls += 1;
      entry.bytes_sent += bytes;
      entry.bytes_inter_host += inter;
      entry.seconds += secs;
    };
    add(*box_);
    for (auto& a : ancestors_) add(*a);
  }

  // Of the `bytes` this rank sent in one collective, those that went to a
  // rank on another host. The ring algorithms send to the right neighbour
  // only; broadcast's root sends the tensor to every other rank; gather's
  // ranks send to the root; the barrier sends one byte per round to rank
  // r + 2^k (ring.h). CMA runs only when every rank is on one host.
  int64_t inter_host_bytes(const CallShape& shape, int64_t bytes) const {
    const int n = world_.world_size, r = world_.rank;
    auto far = [&](int q) { return host_index_[q] != host_index_[r]; };
    if (bytes == 0 || transport_.cma) return 0;
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

  static std::vector<int> iota(int n) {
    std::vector<int> v(n);
    for (int q = 0; q < n; ++q) v[q] = q;
    return v;
  }
  // Host identities -> indices numbered in rank order of first appearance.
  static std::vector<int> index_hosts(const std::vector<std::string>& host) {
    std::vector<int> out;
    std::vector<std::string> seen;
    for (auto& h : host) {
      auto it = std::find(seen.begin(), seen.end(), h);
      out.push_back(static_cast<int>(it - seen.begin()));
      if (it == seen.end()) seen.push_back(h);
    }
    return out;
  }
  // "2, 3": the global ranks of this communicator.
  std::string ranks_text() const {
    std::string s;
    for (int g : global_) s += (s.empty() ? "" : ", ") + std::to_string(g);
    return s;
  }
  // How messages name rank q of this communicator: its global rank, with
  // the group rank beside it inside a group.
  std::string name_of(int q) const {
    return group_.empty() ? detail::cat("rank ", q) : detail::cat("rank ", global_[q], " (group rank ", q, ")");
  }

  // FSDP_DEBUG=detail: every rank learns every rank's call before any byte
  // of the collective moves. Costs one ring all-gather of 80 bytes per rank.
  void check_same_call(const Step& step, const CallShape& shape) {
    const int n = world_.world_size;
    std::vector<CallRecord> all(n);
    all[world_.rank] = record_of(shape, step.seq);
    std::vector<int64_t> offset(n), count(n, sizeof(CallRecord));
    for (int j = 0; j < n; ++j) offset[j] = j * static_cast<int64_t>(sizeof(CallRecord));
    ring_all_gather(step, all.data(), offset, count, kCheckStepBase);
    bool same = true;
    for (int q = 1; q < n; ++q) same &= same_call(all[q], all[0]);
    if (same) return;
    std::string msg = detail::cat("FSDP_DEBUG=detail: ranks issued different collectives at #", step.seq,
                                  " in a ", group_.empty() ? "world" : "group", " of ", n, " (", describe(), "):");
    for (int q = 0; q < n; ++q)
      msg += detail::cat("\n  ", name_of(q), ": ", describe_record(all[q]),
                         same_call(all[q], all[0]) ? "" : "   <-- differs from rank 0");
    msg += "\nExpected every rank to issue the same kind, dtype, element count, root and reduce op "
           "at each sequence number. What to do: find where the differing rank's code path diverges "
           "(a rank-dependent branch, an uneven shard size, a skipped unit) and make every rank issue "
           "the same collectives in the same order.";
    throw CallMismatch(msg);
  }

  std::string diagnose(uint64_t seq, const std::string& what, const std::string& engine_error,
                       Clock::duration elapsed) {
    const double secs = std::chrono::duration<double>(elapsed).count();
    const double limit = opts_.timeout.count() / 1000.0;
    const bool timed_out = secs >= 0.9 * limit;
    char took[64];
    std::snprintf(took, sizeof took, "%s after %.2f s (timeout %g s, FSDP_TIMEOUT).",
                  timed_out ? "timed out" : "failed", secs, limit);
    std::string msg = detail::cat(what, ", collective #", seq, " of ", name_of(world_.rank), " in a ",
                                  group_.empty() ? "world" : "group", " of ", world_.world_size, " (", describe(),
                                  "), ", took);
    auto progress = rdv_->read_progress(kDiagnosisBudget);
    std::string missing, mismatched, unknown;
    for (int q = 0; q < world_.world_size; ++q) {
      const auto& p = progress[q];
      if (p.seq < 0) {
        unknown += detail::cat(unknown.empty() ? "" : ", ", global_[q]);
      } else if (p.seq < static_cast<int64_t>(seq)) {
        missing += detail::cat(missing.empty() ? "" : ", ", name_of(q), " (last entered #", p.seq,
                               p.seq > 0 ? " " + p.what : std::string(" none"), ")");
      } else if (p.seq == static_cast<int64_t>(seq) && p.what != what) {
        mismatched += detail::cat("\n  ", name_of(q), " entered #", seq, " as ", p.what);
      }
    }
    if (!missing.empty())
      msg += detail::cat("\nRanks that never arrived at #", seq, ": ", missing, ".");
    if (!mismatched.empty())
      msg += detail::cat("\nRanks issued different collectives at #", seq, ":", mismatched,
                         "\nEvery rank must issue the same collectives in the same order.");
    if (!unknown.empty())
      msg += detail::cat("\nProgress of ranks ", unknown, " is unknown: the store at ",
                         rdv_->describe_store(), " is unreachable (rank 0 may have exited).");
    const std::string gone = transport_.cma ? cma_gone_peers(transport_.peers, world_.rank) : "";
    if (!gone.empty()) msg += detail::cat("\nRanks whose process is gone: ", gone, ".");
    if (missing.empty() && mismatched.empty() && unknown.empty() && gone.empty())
      msg += "\nEvery rank entered this collective, so the transfer itself failed: a peer died "
             "mid-transfer or the network stalled.";
    msg += timed_out ? "\nWhat to do: make every rank issue the same collectives in the same order; "
                       "a rank that is legitimately slower (data loading, checkpointing) needs a "
                       "larger FSDP_TIMEOUT."
                     : "\nWhat to do: look at the first rank that failed in the launcher's output.";
    msg += (transport_.cma ? "\n(cma+gloo: " : "\n(gloo: ") + engine_error + ")";
    if (!group_.empty())
      msg += detail::cat("\n(ranks inside the engine's message are group ranks; group '", group_,
                         "' is global ranks ", ranks_text(), " in that order)");
    return msg;
  }

  // Constant after construction.
  const WorldEnv world_;  // a group's: its own rank and size
  const ResolvedOptions opts_;
  const std::vector<int> global_;  // global rank of each rank here
  const std::string group_;        // a group's name; "" for a world
  std::vector<std::shared_ptr<CounterBox>> ancestors_;  // the parents' counters, nearest last
  std::unique_ptr<Rendezvous> rdv_;
  std::shared_ptr<gloo::Context> ctx_;
  const TransportChoice transport_;  // same on every rank (choose_transport)
  const std::vector<int> host_index_;  // host of each rank (index_hosts)

  // Touched only on the communication thread.
  uint64_t seq_ = 0;
  // Touched only on the caller's thread (split).
  int splits_ = 0;

  std::atomic<bool> failed_{false};
  const std::shared_ptr<CounterBox> box_ = std::make_shared<CounterBox>();

  // Declared last: destroyed first, while everything its tasks use is alive.
  std::unique_ptr<WorkQueue> queue_;
};

}  // namespace

CommPtr make_gloo_communicator(const WorldEnv& world, const ResolvedOptions& opts) {
  return std::make_shared<GlooCommunicator>(world, opts);
}

}  // namespace fsdp::comm
