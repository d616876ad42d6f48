// fsdp-cpp: the NCCL communicator (see backends.h).
//
// c10d's ProcessGroupNCCL, made by the CUDA plugin (src/comm/cuda_api.h) on
// this rank's GPU, behind fsdp-cpp's Communicator: the same rendezvous and
// heartbeat as the Gloo communicator (a silent rank is named by the
// watchdog, docs/RELIABILITY.md), the same argument checks and messages,
// the flight recorder, the per-tier byte counters, and groups (split). Its
// tensors are on that GPU; the factory stages others (staged.cpp). A world
// of one asked for NCCL is a one-rank ProcessGroupNCCL over an in-process
// store (no rendezvous, no heartbeat: there is nobody to wait for), so N = 1
// runs the same NCCL kernels as N = 8.
//
// Streams: a collective is issued on the calling thread's current CUDA
// stream; NCCL runs it on its own (high-priority) stream after what that
// stream had queued, and Work::wait() makes the waiting thread's current
// stream wait for it, without blocking the host.
//
// Lifetimes: a caller's input may be freed as soon as the call returns, but
// its memory was allocated on the caller's stream and is read on another
// (the bf16 widening below runs on the issuing stream, NCCL on its own): the
// caching allocator could hand the block to the caller's next kernel before
// the read happened. So every input (and every fp32 copy made here) is held
// by the Work until wait(), which orders the waiting stream after the
// collective: only then is dropping it safe (FSDP2 holds its reduce-scatter
// input the same way).
//
// Failure: a collective that outlives CommOptions::timeout is ProcessGroupNCCL's
// watchdog's to handle, as TORCH_NCCL_ASYNC_ERROR_HANDLING says (default in
// torch 2.x: abort the process; docs/COMM.md, "NCCL"): the rank ends with
// SIGABRT, the launcher names it, and the other ranks' heartbeats name it to
// them. An error that reaches wait() (an abort in mode 2, a failed launch) is
// rethrown as one CollectiveError naming the call, the group and its global
// ranks, and the ranks that never entered it.
//
// Counters: one call per collective, counted when it is issued, with the
// bytes a rank sends by NCCL's ring algorithms in the dtype on the wire
// (bf16/fp16 reductions travel as fp32): all-gather and reduce-scatter
// (N-1)/N of the full buffer, all-reduce twice that; inter-host when the
// next rank of the ring is on another host. Seconds are the collectives'
// time on the GPU, between NCCL's start and end events, added once a
// collective has completed (wait() only orders streams: the host's time in
// it says nothing).
#include <mutex>

#include "comm/backends.h"
#include "comm/call_log.h"
#include "comm/checks.h"
#include "comm/cma.h"
#include "comm/device.h"
#include "comm/gpu_timings.h"
#include "comm/rendezvous.h"
#include "comm/watchdog.h"
#include "fsdp/errors.h"
#include "fsdp/trace.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace fsdp::comm {
namespace {

std::vector<int> iota_ranks(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

c10d::ReduceOp c10d_op(ReduceOp op) { return op == ReduceOp::AVG ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM; }

bool half_float(c10::ScalarType t) { return t == c10::kBFloat16 || t == c10::kHalf; }

class NcclCommunicator;

// One collective's completion: the c10d work, what the call still owes when
// it is waited for (bf16 results summed in fp32 copied back), and the
// tensors it reads, held until then (see "Lifetimes" above).
class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* comm, c10::intrusive_ptr<c10d::Work> work, CallShape shape, uint64_t seq,
           uint64_t ticket, std::function<void()> then, std::vector<torch::Tensor> keep)
      : comm_(comm), work_(std::move(work)), shape_(std::move(shape)), seq_(seq), ticket_(ticket),
        then_(std::move(then)), keep_(std::move(keep)) {}
  void wait() override;
  bool is_completed() const override { return work_->isCompleted(); }

 private:
  NcclCommunicator* comm_;  // outlives its works: callers wait for or drop them first (detail::Engine does)
  c10::intrusive_ptr<c10d::Work> work_;
  CallShape shape_;
  uint64_t seq_, ticket_;
  std::mutex mu_;
  std::function<void()> then_;      // guarded by mu_; run once
  std::vector<torch::Tensor> keep_;  // guarded by mu_; dropped by wait()
  bool done_ = false;               // guarded by mu_
};


class NcclCommunicator final : public Communicator {
 public:
  // The world: a rendezvous through the job's store, then NCCL's own; a
  // world of one needs neither (an in-process store carries NCCL's id).
  NcclCommunicator(const WorldEnv& world, const ResolvedOptions& opts)
      : world_(world), opts_(opts), global_(iota_ranks(world.world_size)), group_("world"),
        rdv_(world.world_size > 1 ? std::make_unique<Rendezvous>(world, opts) : nullptr),
        watchdog_(rdv_ ? Watchdog::acquire(world, rdv_->key_base(), opts) : nullptr),
        hosts_(rdv_ ? exchange_hosts() : std::vector<int>{0}),
        pg_(make_pg()),
        log_(rdv_ ? rdv_->generation() : 0, rdv_.get(), Counters()) {}

  // A group of `parent`'s ranks (split).
  NcclCommunicator(const NcclCommunicator& parent, const std::string& tag, const WorldEnv& group,
                   std::vector<int> global, std::vector<int> hosts, std::string name)
      : world_(group), opts_(parent.opts_), global_(std::move(global)), group_(std::move(name)),
        rdv_(std::make_unique<Rendezvous>(*parent.rdv_, tag, group, global_)),
        watchdog_(parent.watchdog_), hosts_(std::move(hosts)), pg_(make_pg()),
        log_(rdv_->generation(), rdv_.get(), Counters::child_of(parent.log_.counters())) {}

  ~NcclCommunicator() override {
    if (failed_) return;
    try {
      pg_->shutdown();  // NCCL's communicators are destroyed collectively, in order
    } catch (...) {
    }
    if (rdv_) rdv_->leave(opts_.timeout);
  }

  int rank() const override { return world_.rank; }
  int world_size() const override { return world_.world_size; }
  int local_rank() const override { return world_.local_rank; }
  int local_world_size() const override { return world_.local_world_size; }

  WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output, const CollectiveInfo& info) override {
    CallShape s = checked([&] { return check_all_gather(input, output, world_.world_size, info, c10::kCUDA); });
    const int64_t sent = (world_.world_size - 1) * input.numel() * input.element_size();
    return issue(s, sent, [&] {
      auto in = input;
      return pg_->_allgather_base(output, in);
    }, {}, {input});
  }

  WorkPtr reduce_scatter(const torch::Tensor& input, torch::Tensor output, ReduceOp op,
                         const CollectiveInfo& info) override {
    CallShape s =
        checked([&] { return check_reduce_scatter(input, output, op, world_.world_size, info, c10::kCUDA); });
    // On the wire: fp32 (bf16/fp16 are summed in fp32).
    const int64_t sent =
        (world_.world_size - 1) * output.numel() * wire_bytes_per_element(input.scalar_type(), s.kind);
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d_op(op);
    if (!half_float(input.scalar_type())) {
      return issue(s, sent, [&] {
        auto in = input;
        return pg_->_reduce_scatter_base(output, in, o);
      }, {}, {input});
    }
    // bf16/fp16 are summed in fp32 (the Communicator's promise). The cast
    // reads `input` on this stream: `input` is held until wait().
    auto in32 = input.to(torch::kFloat32);
    auto out32 = torch::empty(output.sizes(), output.options().dtype(torch::kFloat32));
    return issue(s, sent, [&] { return pg_->_reduce_scatter_base(out32, in32, o); },
                 [output, out32]() mutable { output.copy_(out32); }, {input, in32});
  }

  WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op, const CollectiveInfo& info) override {
    CallShape s = checked([&] { return check_all_reduce(tensor, op, info, c10::kCUDA); });
    const int n = world_.world_size;
    const int64_t sent = 2 * (n - 1) * tensor.numel() * wire_bytes_per_element(tensor.scalar_type(), s.kind) / n;
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(op);
    if (!half_float(tensor.scalar_type())) {
      return issue(s, sent, [&] {
        std::vector<at::Tensor> v{tensor};
        return pg_->allreduce(v, o);
      }, {}, {tensor});
    }
    auto t32 = tensor.to(torch::kFloat32);
    return issue(s, sent, [&] {
      std::vector<at::Tensor> v{t32};
      return pg_->allreduce(v, o);
    }, [tensor, t32]() mutable { tensor.copy_(t32); }, {tensor, t32});
  }

  WorkPtr broadcast(torch::Tensor tensor, int root, const CollectiveInfo& info) override {
    CallShape s = checked([&] { return check_broadcast(tensor, root, world_.world_size, info, c10::kCUDA); });
    const int64_t sent = world_.rank == (root + world_.world_size - 1) % world_.world_size
                             ? 0
                             : tensor.numel() * tensor.element_size();
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return issue(s, sent, [&] {
      std::vector<at::Tensor> v{tensor};
      return pg_->broadcast(v, o);
    }, {}, {tensor});
  }

  WorkPtr gather(const torch::Tensor& input, torch::Tensor output, int root, const CollectiveInfo& info) override {
    CallShape s = checked(
        [&] { return check_gather(input, output, root, world_.rank, world_.world_size, info, c10::kCUDA); });
    const int64_t sent = world_.rank == root ? 0 : input.numel() * input.element_size();
    c10d::GatherOptions o;
    o.rootRank = root;
    return issue(s, sent, [&] {
      std::vector<std::vector<at::Tensor>> outs;
      if (world_.rank == root) {
        outs.emplace_back();
        const int64_t n = input.numel();
        auto flat = output.view(-1);
        for (int r = 0; r < world_.world_size; ++r) outs.back().push_back(flat.narrow(0, r * n, n));
      }
      std::vector<at::Tensor> in{input.view(-1)};
      return pg_->gather(outs, in, o);
    }, {}, {input});
  }

  WorkPtr barrier(const CollectiveInfo& info) override {
    CallShape s;
    s.kind = CollectiveKind::BARRIER;
    s.label = info.label;
    return issue(s, 0, [&] { return pg_->barrier(); }, {}, {});
  }

  CommCounters counters() const override {
    const_cast<NcclCommunicator*>(this)->harvest_timings();
    return log_.counters().snapshot();
  }
  void reset_counters() override { log_.counters().reset(); }
  std::chrono::milliseconds timeout() const override { return opts_.timeout; }
  std::string describe() const override {
    return detail::cat("nccl ", group_ == "world" ? "" : "group '" + group_ + "' ", "world=", world_.world_size,
                       " on cuda:", opts_.device_index);
  }
  std::vector<int> global_ranks() const override { return global_; }
  std::vector<int> hosts() const override { return hosts_; }

  CommPtr split(int color, const SplitOptions& so) override {
    FSDP_USER_CHECK(color >= 0, "Communicator::split: the color must be >= 0, found ", color);
    // Every rank learns every color through an all-gather of the colors.
    auto mine = torch::full({1}, static_cast<int64_t>(color),
                            torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA, opts_.device_index));
    auto all = torch::empty({world_.world_size}, mine.options());
    all_gather(mine, all, {"split " + so.name})->wait();
    auto colors = all.cpu();
    const int k = ++splits_;
    std::vector<int> members, global, hosts;
    for (int q = 0; q < world_.world_size; ++q)
      if (colors[q].item<int64_t>() == color) {
        members.push_back(q);
        global.push_back(global_[q]);
        hosts.push_back(hosts_[q]);
      }
    WorldEnv g = world_;
    g.world_size = static_cast<int>(members.size());
    g.rank = static_cast<int>(std::find(members.begin(), members.end(), world_.rank) - members.begin());
    g.local_rank = g.local_world_size = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      if (hosts[i] != hosts_[world_.rank]) continue;
      g.local_rank += members[i] < world_.rank;
      g.local_world_size += 1;
    }
    if (g.world_size == 1) {
      ResolvedOptions o = opts_;
      if (so.timeout.count() > 0) o.timeout = so.timeout;
      return make_world_of_one(o, global_[world_.rank], so.name);
    }
    // Renumber the hosts of the group in its rank order.
    std::vector<int> renumbered(hosts.size());
    std::vector<int> seen;
    for (size_t i = 0; i < hosts.size(); ++i) {
      auto it = std::find(seen.begin(), seen.end(), hosts[i]);
      if (it == seen.end()) it = seen.insert(seen.end(), hosts[i]);
      renumbered[i] = static_cast<int>(it - seen.begin());
    }
    auto child = std::make_shared<NcclCommunicator>(*this, detail::cat("s", k, "/", color, "/"), g, std::move(global),
                                                    std::move(renumbered), so.name);
    if (so.timeout.count() > 0) child->opts_.timeout = so.timeout;
    return child;
  }

  // NcclWork::wait's failure path: one message naming the call and who is gone.
  [[noreturn]] void fail(const CallShape& shape, uint64_t seq, uint64_t ticket, const std::string& what) {
    failed_ = true;
    if (watchdog_) watchdog_->mark_failed();
    log_.finished(ticket, what);
    // Who never reached this collective, from the ranks' progress keys
    // (the same the Gloo communicator's diagnosis reads).
    std::string behind;
    const auto progress = rdv_ ? rdv_->read_progress(std::chrono::milliseconds(1500))
                               : std::vector<Rendezvous::Progress>{};
    for (size_t q = 0; q < progress.size() && q < global_.size(); ++q) {
      if (progress[q].seq < 0 || progress[q].seq >= static_cast<int64_t>(seq)) continue;
      behind += detail::cat(behind.empty() ? "" : "; ", "global rank ", global_[q], " is at #", progress[q].seq, " ",
                            progress[q].what);
    }
    throw CollectiveError(detail::cat(describe_call(shape), " #", seq, " on ", describe(), " (global ranks ",
                                      ranks_text(), ") failed: ", what,
                                      behind.empty() ? "" : detail::cat(". Never entered it: ", behind)));
  }

  // Adds the GPU time of every collective that completed since the last
  // look (in issue order: NCCL completes one communicator's collectives in
  // that order, so the first unfinished one ends the look).
  void harvest_timings() {
    timings_.harvest([&](CollectiveKind kind, double seconds) { log_.add_seconds(kind, seconds); });
  }

  // The flight recorder's end of a collective that completed (NcclWork::wait).
  void finished(uint64_t ticket) { log_.finished(ticket); }

 private:
  std::string ranks_text() const {
    std::string out;
    for (int g : global_) out += (out.empty() ? "" : ",") + std::to_string(g);
    return out;
  }

  template <class Check>
  CallShape checked(Check check) {
    try {
      return check();
    } catch (...) {
      failed_ = true;
      throw;
    }
  }

  WorkPtr issue(const CallShape& shape, int64_t sent, const std::function<c10::intrusive_ptr<c10d::Work>()>& call,
                std::function<void()> then, std::vector<torch::Tensor> keep) {
    if (failed_)
      throw CollectiveError(detail::cat(describe_call(shape), " on ", describe(),
                                        ": an earlier collective of this communicator failed; it cannot be used again"));
    harvest_timings();
    const uint64_t ticket = log_.issued(shape);
    // Issued, entered and counted here, on the issuing thread: NCCL queues
    // the collective on the stream; its seconds come later (harvest_timings).
    CallLog::Entered entered(log_, shape, ticket);
    entered.span.arg("bytes", sent);
    c10::intrusive_ptr<c10d::Work> w;
    try {
      w = call();
    } catch (const std::exception& e) {
      fail(shape, entered.seq, ticket, e.what());
    }
    // Inter-host when the ring's next rank is on another host.
    const int next = (world_.rank + 1) % world_.world_size;
    log_.count(shape.kind, sent, hosts_[next] != hosts_[world_.rank] ? sent : 0, 0.0);
    timings_.issued(w, shape.kind);
    return std::make_shared<NcclWork>(this, std::move(w), shape, entered.seq, ticket, std::move(then),
                                      std::move(keep));
  }


  std::vector<int> exchange_hosts() {
    // Host identities through the store: rank order of first appearance.
    const std::string key = rdv_->prefix() + "nccl-host/";
    auto& store = rdv_->store();
    const std::string id = host_identity(opts_.host_id);
    store->set(key + std::to_string(world_.rank), std::vector<uint8_t>(id.begin(), id.end()));
    std::vector<std::string> ids;
    for (int q = 0; q < world_.world_size; ++q) {
      auto v = store->get(key + std::to_string(q));
      ids.emplace_back(v.begin(), v.end());
    }
    std::vector<int> out(world_.world_size);
    std::vector<std::string> seen;
    for (int q = 0; q < world_.world_size; ++q) {
      auto it = std::find(seen.begin(), seen.end(), ids[q]);
      if (it == seen.end()) it = seen.insert(seen.end(), ids[q]);
      out[q] = static_cast<int>(it - seen.begin());
    }
    return out;
  }

  c10::intrusive_ptr<c10d::Backend> make_pg() {
    const CudaApi& api = require_cuda("the NCCL communicator");
    c10::intrusive_ptr<c10d::Store> store;
    if (rdv_)
      store = c10::make_intrusive<c10d::PrefixStore>(rdv_->prefix() + "nccl/", rdv_->store());
    else
      store = c10::make_intrusive<c10d::HashStore>();
    std::vector<uint64_t> global(global_.begin(), global_.end());
    return api.make_nccl(store, world_.rank, world_.world_size, opts_.device_index, opts_.timeout, global, group_);
  }

  WorldEnv world_;
  ResolvedOptions opts_;
  const std::vector<int> global_;
  const std::string group_;
  std::unique_ptr<Rendezvous> rdv_;
  std::shared_ptr<Watchdog> watchdog_;
  const std::vector<int> hosts_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  CallLog log_;         // sequence numbers touched on the issuing thread only
  GpuTimings timings_;  // issued collectives, until their GPU time is counted
  int splits_ = 0;
  bool failed_ = false;
};

void NcclWork::wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return;
  try {
    work_->wait();
  } catch (const std::exception& e) {
    comm_->fail(shape_, seq_, ticket_, e.what());
  }
  if (then_) then_();
  // The waiting stream is now ordered after the collective: the inputs'
  // blocks may go back to the allocator.
  keep_.clear();
  comm_->finished(ticket_);
  done_ = true;
}

}  // namespace

CommPtr make_nccl_communicator(const WorldEnv& world, const ResolvedOptions& opts) {
  return std::make_shared<NcclCommunicator>(world, opts);
}

}  // namespace fsdp::comm
