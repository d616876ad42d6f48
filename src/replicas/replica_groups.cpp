// fsdp-cpp: a replica group's side of per-step fault tolerance
// (fsdp/replicas.h): the quorum of each step, the gradients' mean across
// groups, the vote, and healing from a peer into staging.
#include "fsdp/replicas.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "fsdp/comm.h"
#include "fsdp/config.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "fsdp/trace.h"
#include "optim/optimizer_state.h"
#include "replicas/client.h"
#include "replicas/link.h"
#include "state/step_state.h"
#include "unit/across.h"

namespace fsdp {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// What the coordinator compares between groups: the parameters' names and
// full shapes, and how they are sharded.
std::string model_fingerprint(const FullyShardedModel& model) {
  size_t h = 1469598103934665603ull;
  int64_t elements = 0;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  };
  const auto shards = model.named_shards();
  for (const auto& s : shards) {
    mix(s.name);
    int64_t n = 1;
    for (int64_t d : s.full_shape) {
      mix("," + std::to_string(d));
      n *= d;
    }
    elements += n;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016zx", h);
  return detail::cat(shards.size(), " tensors, ", elements, " elements, names and shapes ", hex);
}

std::string sharding_of(const FullyShardedModel& model) {
  const auto& mp = model.options().mixed_precision;
  return detail::cat(to_string(model.options().strategy), ", params ",
                     mp.param_dtype ? c10::toString(*mp.param_dtype) : "fp32");
}

std::string this_host() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// An error's message without the C++ stack c10::Error appends.
std::string message_of(const std::exception& e) {
  std::string m = e.what();
  const auto cut = m.find("\nException raised from");
  return cut == std::string::npos ? m : m.substr(0, cut);
}

// Whether every rank of the group got here with `ok` (a collective over the
// group's own communicator: every rank calls it, in the same place).
bool all_ok(const CommPtr& c, bool ok, const char* what) {
  if (c->world_size() == 1) return ok;
  auto failed = torch::tensor({ok ? 0.0f : 1.0f});
  c->all_reduce(failed, ReduceOp::SUM, {what})->wait();
  return failed.item<float>() == 0.0f;
}

}  // namespace

namespace replicas {

// The mean across groups as backward goes on: the engine hands each unit's
// reduced shard over (unit/across.h) as soon as its reduce completed, and
// this thread averages it over the link while the next units compute, in
// the order handed over (the same on every group). A failure is kept for
// the step's vote, and the shards after it are not sent: backward goes on
// and the step is dropped.
class Across {
 public:
  ~Across() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // The step's link; the thread starts with the first step that has one.
  void begin(replicas::ReplicaLink& link) {
    std::lock_guard<std::mutex> lock(mu_);
    link_ = &link;
    failed_.clear();
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }

  WorkPtr issue(const torch::Tensor& shard, const std::string& unit) {
    auto w = std::make_shared<Job>(shard, unit);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(w);
    }
    cv_.notify_all();
    return w;
  }

  // Once every shard handed over was averaged or given up (the engine
  // waited for them all): "" when all were averaged, else why not.
  std::string end() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    link_ = nullptr;
    return failed_;
  }

 private:
  struct Job final : Work {
    Job(torch::Tensor t, std::string u) : shard(std::move(t)), unit(std::move(u)) {}
    torch::Tensor shard;
    const std::string unit;
    mutable std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    void wait() override {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done; });
    }
    bool is_completed() const override {
      std::lock_guard<std::mutex> lock(mu);
      return done;
    }
    void finish() {
      {
        std::lock_guard<std::mutex> lock(mu);
        done = true;
      }
      cv.notify_all();
    }
  };

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      std::shared_ptr<Job> job = queue_.front();
      queue_.pop_front();
      busy_ = true;
      replicas::ReplicaLink* link = link_;
      // After a failure nothing more is sent (the step is dropped anyway).
      const bool skip = !failed_.empty() || stop_ || link == nullptr;
      std::string why = failed_.empty() && skip ? "replica groups closed before the mean across groups" : "";
      lock.unlock();
      if (!skip) {
        try {
          trace::Span span("all_reduce across replica groups", "ft");
          if (span.active()) span.arg("unit", job->unit);
          if (job->shard.scalar_type() == torch::kFloat32) {
            link->all_reduce_mean(job->shard);
          } else {  // sums in fp32, like the rest of the gradients' mean
            auto wide = job->shard.to(torch::kFloat32);
            link->all_reduce_mean(wide);
            job->shard.copy_(wide);
          }
        } catch (const std::exception& e) {
          why = detail::cat("the mean across groups failed at unit ", job->unit, ": ", message_of(e));
        }
      }
      job->shard = torch::Tensor();
      lock.lock();
      if (!why.empty() && failed_.empty()) failed_ = why;
      busy_ = false;
      job->finish();
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  replicas::ReplicaLink* link_ = nullptr;
  std::string failed_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace replicas

struct ReplicaGroups::Impl {
  FullyShardedModel& model;
  torch::optim::Optimizer& opt;
  replicas::ReplicaPlace place;
  std::unique_ptr<replicas::QuorumClient> client;
  std::unique_ptr<replicas::ReplicaLink> link;
  replicas::QuorumView view;
  std::pair<int64_t, int64_t> last_links{-1, -1};  // the previous quorum's links (era, comm): the same on every rank of the group
  StepQuorum q;
  int64_t sent_before = 0;  // bytes sent by links already closed
  torch::Tensor flat;       // a GPU model's gradients averaged across groups, reused every step
  std::function<void(const HealProgress&)> on_heal;
  // A CPU model's mean across groups, unit by unit as backward goes on
  // (declared after `link`, so it stops before the link closes); set for
  // the step when it has other groups.
  replicas::Across across;
  bool averaging = false;

  Impl(FullyShardedModel& m, torch::optim::Optimizer& o, const ReplicaOptions& opts)
      : model(m),
        opt(o),
        place(replicas::resolve_replica_place(opts.coordinator, opts.group, opts.coordinator_timeout)),
        on_heal(opts.on_heal) {
    const CommPtr& c = model.comm();
    detail::checkpoint_kind(&opt);  // refuses an optimizer whose state cannot travel, before hello
    // One launch of the group: a number the coordinator's counter issues
    // (later launches are larger, whatever the hosts' clocks say); rank 0
    // takes it, the others agree by broadcast (-1: rank 0 could not, and
    // says why).
    std::string why;
    int64_t launch = -1;
    if (c->rank() == 0) {
      try {
        launch = replicas::take_launch(place, opts.connect_timeout);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    auto inc = torch::tensor({launch}, torch::kInt64);
    if (c->world_size() > 1) c->broadcast(inc, 0, {"replica group launch"})->wait();
    if (inc.item<int64_t>() < 0)
      throw Error(c->rank() == 0 ? why
                                 : detail::cat("replica group ", place.group, ": rank 0 could not reach the coordinator "
                                               "at ", place.host, ":", place.port, " (its message says why)"));
    replicas::GroupIdentity id;
    id.group = place.group;
    id.rank = c->rank();
    id.group_size = c->world_size();
    id.incarnation = inc.item<int64_t>();
    id.model = model_fingerprint(model);
    id.sharding = sharding_of(model);
    id.host = this_host();
    id.pid = static_cast<int64_t>(getpid());
    id.first_launch = config::read_env().restart_count == 0;
    client = std::make_unique<replicas::QuorumClient>(place, id, opts.start_step, opts.connect_timeout);
  }

  ~Impl() {
    if (averaging) detail::average_across(model, {});  // the engine must not call a stopped Across
  }

  // From the step's start to its commit: the engine hands each reduced
  // shard to `across` (a CPU model with other groups in the quorum).
  void average_as_backward_goes(bool on) {
    if (on) {
      across.begin(*link);
      if (!averaging)
        detail::average_across(model, [this](const torch::Tensor& shard, const std::string& unit) {
          return across.issue(shard, unit);
        });
    } else if (averaging) {
      detail::average_across(model, {});
    }
    averaging = on;
  }

  bool model_on_cpu() const { return model.options().device.is_cpu(); }

  replicas::ReplicaLink& link_for(const replicas::QuorumView& v) {
    if (!link || !link->serves(v)) {
      drop_link();
      link = std::make_unique<replicas::ReplicaLink>(*client, v);
    }
    return *link;
  }
  void drop_link() {
    if (link) sent_before += link->bytes_sent();
    link.reset();
  }

  // The heal of quorum `v` as this rank takes part in it (heal_plan): lends
  // its shard of the step state to the healing groups, or takes the
  // source's into staging. The live state is not touched here.
  std::optional<state::StagedStep> copy(const replicas::QuorumView& v, const replicas::HealPlan& plan, int64_t& got,
                                        Clock::time_point& first_byte) {
    auto& l = link_for(v);
    const state::StepListing live = state::list_step(model, opt);
    auto progress = [&](bool lending, int peer, int64_t bytes, int64_t total) {
      if (on_heal) on_heal(HealProgress{v.step, lending, v.members[static_cast<size_t>(peer)], bytes, total});
    };
    if (!plan.send_to.empty()) {
      const std::vector<torch::Tensor> bulk = live.tensors();
      std::string h = live.header().dump();
      auto len = torch::tensor({static_cast<int64_t>(h.size())}, torch::kInt64);
      auto text = torch::from_blob(h.data(), {static_cast<int64_t>(h.size())}, torch::kUInt8);
      const int64_t total = 8 + static_cast<int64_t>(h.size()) + live.bytes();
      for (int to : plan.send_to) {
        l.send_all(to, {len, text});
        progress(true, to, 8 + static_cast<int64_t>(h.size()), total);
        l.lend(to, bulk);
        progress(true, to, total, total);
      }
    }
    if (plan.receive_from < 0) return std::nullopt;
    auto len = torch::zeros({1}, torch::kInt64);
    l.recv(plan.receive_from, len);
    first_byte = Clock::now();
    std::string h(static_cast<size_t>(len.item<int64_t>()), '\0');
    l.recv(plan.receive_from, torch::from_blob(h.data(), {static_cast<int64_t>(h.size())}, torch::kUInt8));
    const json header = json::parse(h, nullptr, false);
    if (header.is_discarded()) throw Error("heal: the source's header is not JSON");
    // Into fresh tensors: the live state is untouched until every rank of
    // the group has all of its copy, so a source that dies half way leaves
    // nothing torn.
    state::StagedStep staged(live, header);
    const int64_t total = 8 + static_cast<int64_t>(h.size()) + staged.bytes();
    progress(false, plan.receive_from, 8 + static_cast<int64_t>(h.size()), total);
    l.take(plan.receive_from, staged.tensors());
    got = total;
    progress(false, plan.receive_from, total, total);
    return staged;
  }

  const StepQuorum& start_step() {
    for (;;) {
      {
        trace::Span wait("quorum", "ft");  // waits for the step's quorum: every group's ranks joined
        view = client->join();
      }
      q = StepQuorum{};
      q.id = view.id;
      q.step = view.step;
      q.groups = view.members;
      const replicas::HealPlan plan = replicas::heal_plan(view, place.group, client->identity().rank);
      // The ranks of a group agree before any of them goes on: a rank whose
      // links or copy failed votes the step's failure, and so must all of
      // them (one in the next quorum's join while the others all-gather in
      // forward would hang the group).
      const std::pair<int64_t, int64_t> links{view.era, view.comm};
      const bool agree = plan.any || (view.members.size() > 1 && links != last_links);
      last_links = links;
      bool ok = true;
      std::string why;
      std::optional<state::StagedStep> staged;
      const auto t0 = Clock::now();
      auto first_byte = t0;
      int64_t got = 0;
      const bool copying = !plan.send_to.empty() || plan.receive_from >= 0;
      trace::Span span(copying ? "heal" : "connect", "ft");
      try {
        // Every member connects now, so the links' set-up never waits on
        // a member's forward and backward.
        if (view.members.size() > 1) link_for(view);
        if (plan.any) staged = copy(view, plan, got, first_byte);
      } catch (const std::exception& e) {
        ok = false;
        why = detail::cat(plan.any ? "healing from a peer" : "connecting to the other groups", " failed: ", message_of(e));
      }
      if (agree && !all_ok(model.comm(), ok, "replica group heal agreement")) {
        if (ok) why = "another rank of this group failed to connect or copy its shard";
        ok = false;
      }
      if (ok && staged) {
        staged->install(opt);
        client->healed();
      }
      if (ok && view.heal) {
        q.healed = true;
        q.heal_source = plan.source;
        q.heal_seconds = std::chrono::duration<double>(Clock::now() - first_byte).count();
        q.heal_wait_seconds = std::chrono::duration<double>(first_byte - t0).count();
        q.heal_bytes = got;
      }
      if (span.active())
        span.arg("group", place.group).arg("quorum", view.id).arg("step", view.step).arg("source", plan.source)
            .arg("receiving", plan.receive_from >= 0).arg("bytes", got).arg("ok", ok)
            .arg("wait_ms", 1e3 * q.heal_wait_seconds);
      if (ok) {
        average_as_backward_goes(view.members.size() > 1 && model_on_cpu());
        return q;
      }
      // The step is dropped on every group and the next quorum heals again.
      q.committed = false;
      q.dropped = vote_failed(why);
      trace_quorum();
    }
  }

  // Votes this rank's failure; returns why the step was dropped.
  std::string vote_failed(const std::string& why) {
    drop_link();
    last_links = {-1, -1};
    const replicas::Outcome o = client->vote(false, why);
    return o.expired ? "the coordinator no longer knew the step's outcome" : o.why;
  }

  // The step's quorum as this group took part in it, into the trace.
  void trace_quorum() const {
    if (trace::enabled())
      trace::instant("quorum", "ft",
                     json{{"quorum", q.id}, {"step", q.step}, {"groups", q.groups}, {"group", place.group},
                          {"committed", q.committed}, {"dropped", q.dropped}, {"healed", q.healed},
                          {"heal_seconds", q.heal_seconds}, {"heal_wait_seconds", q.heal_wait_seconds}});
  }

  std::vector<torch::Tensor> optimizer_params() const {
    std::vector<torch::Tensor> out;
    for (const auto& g : opt.param_groups())
      for (const auto& p : g.params()) out.push_back(p);
    return out;
  }

  bool commit() {
    model.wait_pending();  // every unit's reduce, and on a CPU model its mean across groups
    bool ok = true;
    std::string why;
    const bool across_groups = view.members.size() > 1;
    const auto params = optimizer_params();
    std::vector<torch::Tensor> grads;
    if (averaging) {
      why = across.end();
      ok = why.empty();
      average_as_backward_goes(false);
    } else if (across_groups) {
      // A GPU model: the whole step's gradients at once, through host memory
      // (the links move CPU tensors).
      for (const auto& p : params) {
        if (!p.requires_grad()) continue;
        grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
      }
      try {
        trace::Span span("all_reduce across replica groups", "ft");
        std::vector<torch::Tensor> pieces;
        for (const auto& g : grads) pieces.push_back(g.reshape({-1}).to(torch::kCPU, torch::kFloat32));
        if (!flat.defined()) flat = torch::empty({0}, torch::kFloat32);
        if (pieces.empty())
          flat.resize_({0});
        else
          torch::cat_out(flat, pieces);  // resizes once, then reuses its storage
        link_for(view).all_reduce_mean(flat);
      } catch (const std::exception& e) {
        ok = false;
        why = detail::cat("the mean across groups failed: ", message_of(e));
      }
    }
    if (!ok) {
      drop_link();
      last_links = {-1, -1};
    }
    const replicas::Outcome d = [&] {
      trace::Span wait("vote", "ft");  // waits for the step's outcome: every member's vote
      return client->vote(ok, why);
    }();
    q.committed = d.commit;
    q.dropped = d.expired ? "the coordinator no longer knew the step's outcome" : d.why;
    if (d.commit) {
      if (!grads.empty()) {  // the GPU path's mean, back into the gradients
        torch::NoGradGuard ng;
        int64_t at = 0;
        for (size_t i = 0, k = 0; i < params.size(); ++i) {
          if (!params[i].requires_grad()) continue;
          auto& g = grads[k++];
          const int64_t n = g.numel();
          if (!params[i].grad().defined()) params[i].mutable_grad() = torch::zeros_like(params[i]);
          params[i].mutable_grad().view({-1}).copy_(flat.narrow(0, at, n));
          at += n;
        }
      }
    } else {
      drop_link();  // the next quorum connects afresh
      last_links = {-1, -1};
    }
    trace_quorum();
    return d.commit;
  }
};

ReplicaGroups::ReplicaGroups(FullyShardedModel& model, torch::optim::Optimizer& opt, ReplicaOptions opts)
    : impl_(std::make_unique<Impl>(model, opt, opts)) {}
ReplicaGroups::~ReplicaGroups() = default;
const StepQuorum& ReplicaGroups::start_step() { return impl_->start_step(); }
bool ReplicaGroups::commit() { return impl_->commit(); }
int64_t ReplicaGroups::step() const { return impl_->client->committed(); }
int ReplicaGroups::group() const { return impl_->place.group; }
const StepQuorum& ReplicaGroups::quorum() const { return impl_->q; }
int64_t ReplicaGroups::coordinator_restarts() const { return impl_->client->coordinator_restarts(); }
int64_t ReplicaGroups::bytes_sent() const {
  return impl_->sent_before + (impl_->link ? impl_->link->bytes_sent() : 0);
}

}  // namespace fsdp
