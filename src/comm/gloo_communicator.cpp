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

#include <algorithm>
#include <signal.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <mutex>

#include "comm/backends.h"
#include "common/collective_path.h"
#include "comm/checks.h"
#include "comm/cma.h"
#include "comm/mesh.h"
#include "comm/rendezvous.h"
#include "comm/ring.h"
#include "comm/tiers.h"
#include "comm/diagnosis.h"
#include "comm/heartbeat.h"
#include "comm/watchdog.h"
#include "comm/work_queue.h"
#include "fsdp/errors.h"
#include "fsdp/flight.h"
#include "fsdp/memory.h"
#include "fsdp/trace.h"

namespace fsdp::comm {
namespace {

// Diagnosis reads the store after a failure; it must not eat the slack
// between the timeout and the promised "timeout + 2 s". 1.5 s: on a loaded
// machine the launcher's store has been seen to take over 1 s to answer.
constexpr std::chrono::milliseconds kDiagnosisBudget{1500};
// A store that has not answered the heartbeat thread for longer than a rank
// takes to be silent (cut off, frozen) gets one short try.
constexpr std::chrono::milliseconds kSilentStoreBudget{200};

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
        rdv_(std::make_unique<Rendezvous>(world, opts)),
        watchdog_(Watchdog::acquire(world, rdv_->key_base(), opts)),
        ctx_(rdv_->connect_gloo(opts.ifname)),
        transport_(choose_transport(ctx_.get(), opts.transport, opts.host_id, Clock::now() + opts.rendezvous_timeout)),
        host_index_(index_hosts(transport_.host)),
        queue_(std::make_unique<WorkQueue>()) {
    choose_path();
    if (opts_.debug_info && world_.rank == 0)
      std::fprintf(stderr, "fsdp: FSDP_DEBUG: collectives move bytes by %s: %s\n", engine_words(), why().c_str());
  }

  // A group of `parent`'s ranks (split): `group` is its own rank and size,
  // `global` its ranks' global ranks.
  GlooCommunicator(const GlooCommunicator& parent, const std::string& tag, const WorldEnv& group,
                   const ResolvedOptions& opts, std::vector<int> global, std::string name)
      : world_(group), opts_(opts), global_(std::move(global)), group_(std::move(name)),
        ancestors_(parent.ancestors_),
        rdv_(std::make_unique<Rendezvous>(*parent.rdv_, tag, group, global_)),
        watchdog_(parent.watchdog_),
        ctx_(rdv_->connect_gloo(opts.ifname)),
        transport_(choose_transport(ctx_.get(), opts.transport, opts.host_id,
                                    Clock::now() + opts.rendezvous_timeout, global_, group_)),
        host_index_(index_hosts(transport_.host)),
        queue_(std::make_unique<WorkQueue>()) {
    ancestors_.push_back(parent.box_);
    choose_path();
    if (opts_.debug_info && world_.rank == 0)
      std::fprintf(stderr, "fsdp: FSDP_DEBUG: group '%s' (%s) moves bytes by %s: %s\n", group_.c_str(),
                   ranks_text().c_str(), engine_words(), why().c_str());
  }

  ~GlooCommunicator() override {
    queue_.reset();  // runs what is queued, each bounded by its timeout
    // After a failure the others are failing too: nobody waits for anybody.
    if (failed_) return;
    if (tiers_) tiers_->leave(opts_.timeout);
    rdv_->leave(opts_.timeout);
  }

  int rank() const override { return world_.rank; }
  int world_size() const override { return world_.world_size; }
  int local_rank() const override { return world_.local_rank; }
  int local_world_size() const override { return world_.local_world_size; }

  WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output, const CollectiveInfo& info) override {
    CallShape shape = checked([&] { return check_all_gather(input, output, world_.world_size, info); });
    return submit(shape, [input, output, this](const Step& s) -> Traffic {
      const int n = world_.world_size, r = world_.rank;
      const int64_t block = input.numel() * input.element_size();
      char* out = static_cast<char*>(output.data_ptr());
      if (tiers_) return tier_all_gather(s, *tiers_, input.data_ptr(), out, block);
      if (on_cma()) return cma_all_gather(s, transport_.peers, input.data_ptr(), out, block);
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
    return submit(shape, [input, output, op, this](const Step& s) -> Traffic {
      const int n = world_.world_size;
      const int64_t m = output.numel();
      if (tiers_)
        return tier_reduce_scatter(s, *tiers_, input.data_ptr(), output.data_ptr(), m, input.scalar_type(),
                                   op == ReduceOp::AVG ? n : 1);
      if (on_cma())
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
    return submit(shape, [tensor, op, this](const Step& s) -> Traffic {
      // Ring reduce-scatter into our own chunk, then ring all-gather of the
      // chunks (uneven when numel % N != 0), all in place.
      const int n = world_.world_size, r = world_.rank;
      if (tiers_)
        return tier_all_reduce(s, *tiers_, tensor.data_ptr(), tensor.numel(), tensor.scalar_type(),
                               op == ReduceOp::AVG ? n : 1);
      if (on_cma())
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
      return Traffic(sent + ring_all_gather(s, data, c.offset, c.count, /*step_base=*/n));
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
    const char* engine = tiers_ ? "cma+tcp tiers" : on_cma() ? "cma+gloo" : "gloo/tcp";
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

  WorkPtr submit(const CallShape& shape, std::function<Traffic(const Step&)> algo) {
    // The flight recorder sees the call when it is issued (enqueue time).
    const uint64_t ticket = flight::enqueue(rdv_->generation(), to_string(shape.kind), shape.label,
                                            shape.kind == CollectiveKind::BARRIER ? "" : dtype_name(shape.dtype),
                                            shape.numel, shape.numel * shape.elem_size);
    return queue_->submit([this, shape, ticket, algo = std::move(algo)] { execute(shape, ticket, algo); });
  }

  // On the communication thread, in issue order.
  void execute(const CallShape& shape, uint64_t ticket, const std::function<Traffic(const Step&)>& algo) {
    const uint64_t seq = ++seq_;
    std::string what = describe_call(shape);
    // The store hears of the entry before the flight recorder (and so the
    // heartbeat) shows the collective started: a rank that freezes once it
    // is inside has always told the others where (the send is complete when
    // record_entered returns; the kernel delivers it even if we stop).
    rdv_->record_entered(seq, what);
    const std::shared_ptr<flight::Progress> progress = flight::start(ticket, seq);
    // Times the collective on the "comm" track (the report's AG/RS lanes).
    trace::Span span(to_string(shape.kind), "comm");
    if (span.active()) {
      trace::set_thread_name("comm");
      span.arg("unit", shape.label).arg("seq", seq);
    }
    const auto t0 = Clock::now();
    Step step{ctx_.get(), seq, t0 + opts_.timeout, progress.get()};
    step.piece_bytes = opts_.ring_piece_bytes;
    Traffic sent;
    try {
      if (opts_.debug_detail) check_same_call(step, shape);
      sent = algo(step);
    } catch (const CallMismatch& e) {
      failed_ = true;
      watchdog_->mark_failed();
      flight::finish(ticket, e.what());
      dump_flight(seq, what);
      throw;
    } catch (const std::exception& e) {
      failed_ = true;
      std::string msg = diagnose(seq, shape, what, e.what(), Clock::now() - t0, *progress);
      flight::finish(ticket, e.what());
      msg += dump_flight(seq, what);
      throw CollectiveError(msg);
    }
    flight::finish(ticket);
    const int64_t bytes = sent.bytes, inter = sent.inter >= 0 ? sent.inter : inter_host_bytes(shape, bytes);
    span.arg("bytes", bytes);
    if (span.active()) {
      span.arg("inter_host_bytes", inter);
      if (tiers_ && sent.inter >= 0) span.arg("tiers", 1);
    }
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
  // r + 2^k (ring.h). CMA runs only when every rank is on one host; the
  // tiers count their own split (tiers.h).
  int64_t inter_host_bytes(const CallShape& shape, int64_t bytes) const {
    const int n = world_.world_size, r = world_.rank;
    auto far = [&](int q) { return host_index_[q] != host_index_[r]; };
    if (bytes == 0 || on_cma()) return 0;
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

  // The path every collective of this communicator takes: the facts (the
  // settings, the hosts, the transport's probe, the layout, connecting the
  // tiers) and path::choose's answer (common/collective_path.h), the one
  // place the decision is made. FSDP_TRANSPORT=cma that cannot be honoured
  // is an error here, on every rank alike.
  void choose_path() {
    path::Facts f;
    f.transport = opts_.transport;
    f.tiers = opts_.tiers;
    f.ranks = world_.world_size;
    if (opts_.transport != "tcp") {
      if (transport_.one_host)
        f.cma_blocked = transport_.cma ? "" : transport_.why;
      else
        f.hosts_differ = transport_.why;
    }
    std::optional<TierLayout> layout;
    if (!f.hosts_differ.empty()) {
      for (int q = 0; q < world_.world_size; ++q)
        for (int p = 0; p < world_.world_size; ++p)
          if (p != q && host_index_[p] == host_index_[q]) {
            ++f.ranks_sharing_a_host;
            break;
          }
      layout = tier_layout(host_index_, global_, &f.layout_blocked);
    }
    path_ = path::choose(f);
    if (path_.path == path::Path::TIERS) {
      std::string why;
      tiers_ = connect_tiers(*rdv_, world_, ctx_.get(), *layout, global_, opts_, &why);
      if (tiers_) {
        path_.reason = why;
      } else {
        f.tiers_blocked = why;
        path_ = path::choose(f);
      }
    }
    if (!path_.refused.empty())
      throw Error(detail::cat("FSDP_TRANSPORT=cma", group_.empty() ? "" : " in group '" + group_ + "' (global ranks " +
                                                                              ranks_text() + ")",
                              ", but ", path_.refused,
                              ". Use FSDP_TRANSPORT=auto (falls back to TCP) or FSDP_TRANSPORT=tcp."));
    trace::set_metadata(group_.empty() ? "collective_path" : "collective_path/" + group_,
                        {{"path", path::words(path_.path)}, {"reason", path_.reason}, {"ranks", global_}});
  }
  const char* engine_words() const { return path::words(path_.path); }
  bool on_cma() const { return path_.path == path::Path::CMA; }
  const std::string& why() const { return path_.reason; }

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

  // What this rank was waiting for when the collective failed, from its
  // transfer's counters: the peer, and how far the bytes got.
  static std::string waiting_line(const flight::Progress& p) {
    const int peer = p.peer.load(std::memory_order_relaxed);
    const auto w = static_cast<flight::Progress::Waiting>(p.waiting.load(std::memory_order_relaxed));
    const int64_t got = p.recv_done.load(std::memory_order_relaxed), want = p.recv_total.load(std::memory_order_relaxed);
    const int64_t sent = p.sent_done.load(std::memory_order_relaxed), give = p.send_total.load(std::memory_order_relaxed);
    if (peer < 0 || w == flight::Progress::NONE) return "";
    const char* how = w == flight::Progress::RECEIVE ? "waiting to receive from it"
                      : w == flight::Progress::SEND  ? "waiting for it to take what this rank sent"
                                                     : "reading its memory";
    return detail::cat("\nWaiting on: rank ", peer, " (this rank was ", how, "); ",
                       memory::format_bytes(got), " of ", memory::format_bytes(want), " had arrived",
                       give > 0 ? detail::cat(", ", memory::format_bytes(sent), " of ", memory::format_bytes(give),
                                              " had been sent")
                                : std::string(),
                       ".");
  }

  // Every rank's last entered collective and heartbeat, read through the
  // watchdog's own connection within the budget; nullopt: the store did
  // not answer.
  struct Readings {
    std::vector<std::optional<watchdog::Entered>> entered;
    std::vector<std::optional<watchdog::Heartbeat>> beats;
  };
  std::optional<Readings> read_ranks(std::chrono::milliseconds budget) {
    const int n = world_.world_size;
    std::vector<std::string> keys;
    for (int q = 0; q < n; ++q) keys.push_back(rdv_->prefix() + "seq/" + std::to_string(q));
    // Heartbeats are the processes', keyed by global rank.
    for (int q = 0; q < n; ++q) keys.push_back(rdv_->key_base() + "hb/" + std::to_string(global_[q]));
    auto v = watchdog_->read(keys, budget);
    if (!v) return std::nullopt;
    Readings r;
    r.entered.resize(n);
    r.beats.resize(n);
    for (int q = 0; q < n; ++q) {
      if ((*v)[q]) r.entered[q] = parse_entered(*(*v)[q], rdv_->generation());
      if ((*v)[n + q]) r.beats[q] = watchdog::Heartbeat::parse(*(*v)[n + q]);
    }
    return r;
  }

  static double wall_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  std::string diagnose(uint64_t seq, const CallShape& shape, const std::string& what, const std::string& engine_error,
                       Clock::duration elapsed, const flight::Progress& progress) {
    watchdog_->mark_failed();
    const double store_quiet = watchdog_->store_silent_for();
    const bool store_silent = store_quiet > watchdog_->silent_after();
    const auto budget = store_silent ? kSilentStoreBudget : kDiagnosisBudget;
    const auto budget_end = Clock::now() + budget;
    const double secs = std::chrono::duration<double>(elapsed).count();
    const double limit = opts_.timeout.count() / 1000.0;
    const bool timed_out = secs >= 0.9 * limit;
    char took[64];
    std::snprintf(took, sizeof took, "%s after %.2f s (timeout %g s, FSDP_TIMEOUT).",
                  timed_out ? "timed out" : "failed", secs, limit);
    std::string msg = detail::cat(what, ", collective #", seq, " of ", name_of(world_.rank), " in a ",
                                  group_.empty() ? "world" : "group", " of ", world_.world_size, " (", describe(),
                                  "), ", took);
    msg += waiting_line(progress);
    auto left = [&] {
      return std::max(std::chrono::milliseconds(1),
                      std::chrono::duration_cast<std::chrono::milliseconds>(budget_end - Clock::now()));
    };
    auto readings = read_ranks(left());
    // A heartbeat neither fresh nor yet overdue: wait until it is one or the
    // other (within the budget), then read again.
    if (readings) {
      double wait_s = 0;
      const double now = wall_now(), iv = watchdog_->interval(), silent = watchdog_->silent_after();
      for (int q = 0; q < world_.world_size; ++q) {
        const auto& h = readings->beats[q];
        if (q == world_.rank || !h || h->left) continue;
        const double age = h->age(now);
        if (age > 2 * iv && age <= silent) wait_s = std::max(wait_s, silent - age + 0.05);
      }
      const auto until = Clock::now() + std::chrono::milliseconds(int64_t(wait_s * 1000));
      if (wait_s > 0 && until + std::chrono::milliseconds(100) < budget_end) {
        std::this_thread::sleep_until(until);
        if (auto again = read_ranks(left())) readings = again;
      }
    }
    std::string missing, mismatched, unknown;
    if (!readings) {
      for (int q = 0; q < world_.world_size; ++q) unknown += detail::cat(unknown.empty() ? "" : ", ", global_[q]);
    } else {
      for (int q = 0; q < world_.world_size; ++q) {
        const auto& e = readings->entered[q];
        if (!e) {
          unknown += detail::cat(unknown.empty() ? "" : ", ", global_[q]);
        } else if (e->seq < static_cast<int64_t>(seq)) {
          missing += detail::cat(missing.empty() ? "" : ", ", name_of(q), " (last entered #", e->seq,
                                 e->seq > 0 ? " " + e->what : std::string(" none"), ")");
        } else if (e->seq == static_cast<int64_t>(seq) && e->what != what) {
          mismatched += detail::cat("\n  ", name_of(q), " entered #", seq, " as ", e->what);
        }
      }
    }
    if (!missing.empty())
      msg += detail::cat("\nRanks that never arrived at #", seq, ": ", missing, ".");
    if (!mismatched.empty())
      msg += detail::cat("\nRanks issued different collectives at #", seq, ":", mismatched,
                         "\nEvery rank must issue the same collectives in the same order.");
    if (!unknown.empty())
      msg += detail::cat("\nProgress of ranks ", unknown, " is unknown: the store at ", rdv_->describe_store(),
                         " did not answer within ", budget.count(), " ms",
                         store_silent ? detail::cat(" (nor this rank's heartbeats for ", std::lround(store_quiet * 10) / 10.0, " s)")
                                      : std::string(),
                         ".");
    const std::string gone = on_cma() ? cma_gone_peers(transport_.peers, world_.rank)
                             : tiers_      ? cma_gone_peers(tiers_->peers, tiers_->intra_ctx->rank, &tiers_->intra_ranks())
                                           : "";
    if (!gone.empty()) msg += detail::cat("\nRanks whose process is gone: ", gone, ".");
    // Dead ranks: of this host's ranks, those whose process is gone (or a
    // zombie: dead, not yet reaped by its launcher).
    std::vector<bool> dead(world_.world_size, false);
    auto gone_pid = [](pid_t pid) { return process_gone(pid); };
    {
      const auto where = watchdog_->where();
      for (int q = 0; q < world_.world_size; ++q) {
        if (q == world_.rank) continue;
        if (on_cma() && q < static_cast<int>(transport_.peers.pid.size()))
          dead[q] = gone_pid(transport_.peers.pid[q]);
        else if (tiers_ && tiers_->layout.host[q] == tiers_->layout.host[world_.rank])
          dead[q] = gone_pid(tiers_->peers.pid[tiers_->layout.local[q]]);
        else if (q < static_cast<int>(where.size()) && where[q] && where[q]->identity == watchdog_->identity())
          dead[q] = gone_pid(static_cast<pid_t>(where[q]->pid));
      }
    }
    // Heartbeats: who is silent, elsewhere, slow or stuck (comm/diagnosis.h).
    Evidence ev;
    ev.self = world_.rank;
    ev.world = world_.world_size;
    ev.comm = rdv_->generation();
    ev.seq = seq;
    ev.what = what;
    ev.kind = to_string(shape.kind);
    ev.unit = shape.label;
    ev.step = current_step();
    ev.phase = to_string(current_phase());
    ev.now = wall_now();
    ev.silent_after = watchdog_->silent_after();
    ev.store_reachable = readings.has_value();
    if (readings) {
      ev.beats = readings->beats;
      ev.entered = readings->entered;
    }
    ev.gone = dead;
    ev.where = watchdog_->where();
    ev.my_identity = watchdog_->identity();
    if (!readings) ev.local_state = local_process_states(ev.where, ev.my_identity);
    Classified c = comm::diagnose(ev);
    c.verdict.timed_out = timed_out;
    const int waited = progress.peer.load(std::memory_order_relaxed);
    if (waited >= 0) c.verdict.waited_on.push_back(waited);
    msg += c.lines;
    if (missing.empty() && mismatched.empty() && unknown.empty() && gone.empty() && c.verdict.culprits.empty())
      msg += "\nEvery rank entered this collective, so the transfer itself failed: a peer died "
             "mid-transfer or the network stalled.";
    if (!c.verdict.silent.empty())
      msg += "\nWhat to do: look at the silent rank's host: a stopped process (SIGSTOP, a debugger: kill -CONT), "
             "a dead one (the launcher names its signal), swapping, or a cut network link.";
    else if (!c.verdict.elsewhere.empty())
      msg += "\nWhat to do: find what that rank does there (its phase); if it is legitimately slow (a long "
             "checkpoint, a slow data loader) raise FSDP_TIMEOUT, if it issues other collectives make every rank "
             "issue the same ones in the same order.";
    else
      msg += timed_out ? "\nWhat to do: make every rank issue the same collectives in the same order; "
                         "a rank that is legitimately slower (data loading, checkpointing) needs a "
                         "larger FSDP_TIMEOUT."
                       : "\nWhat to do: look at the first rank that failed in the launcher's output.";
    msg += (tiers_ ? "\n(cma+tcp tiers: " : on_cma() ? "\n(cma+gloo: " : "\n(gloo: ") + engine_error + ")";
    if (!group_.empty())
      msg += detail::cat("\n(ranks inside the engine's message are group ranks; group '", group_,
                         "' is global ranks ", ranks_text(), " in that order)");
    // For the launcher and the flight recorder.
    flight::note("verdict", c.verdict.to_json());
    if (readings) {
      nlohmann::json hb = nlohmann::json::array();
      for (auto& h : readings->beats) hb.push_back(h ? h->to_json() : nlohmann::json(nullptr));
      flight::note("heartbeats", hb);
    }
    watchdog_->write(rdv_->key_base() + "verdict/" + std::to_string(global_[world_.rank]), c.verdict.to_json().dump(),
                     std::chrono::milliseconds(300));
    return msg;
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
  std::vector<std::shared_ptr<CounterBox>> ancestors_;  // the parents' counters, nearest last
  std::unique_ptr<Rendezvous> rdv_;
  std::shared_ptr<Watchdog> watchdog_;  // heartbeats; shared by the process's communicators
  std::shared_ptr<Mesh> ctx_;
  const TransportChoice transport_;  // same on every rank (choose_transport)
  const std::vector<int> host_index_;  // host of each rank (index_hosts)
  // Set once by choose_path in the constructor, then constant: the path
  // every collective takes and why (the same on every rank), and for TIERS
  // the two tiers' meshes (null otherwise).
  path::Choice path_;
  std::unique_ptr<Tiers> tiers_;

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
