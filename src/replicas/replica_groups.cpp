// fsdp-cpp: a replica group's side of per-step fault tolerance
// (fsdp/replicas.h): the quorum of each step, the gradients' mean across
// groups, the vote, and healing from a peer.
#include "fsdp/replicas.h"

#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "comm/quorum.h"
#include "compat/torch_compat.h"
#include "fsdp/comm.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "fsdp/trace.h"
#include "optim/optimizer_state.h"

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

std::vector<torch::Tensor> optimizer_params(const torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params()) out.push_back(p);
  return out;
}

// An error's message without the C++ stack c10::Error appends.
std::string message_of(const std::exception& e) {
  std::string m = e.what();
  const auto cut = m.find("\nException raised from");
  return cut == std::string::npos ? m : m.substr(0, cut);
}

}  // namespace

struct ReplicaGroups::Impl {
  FullyShardedModel& model;
  torch::optim::Optimizer& opt;
  comm::ReplicaPlace place;
  std::unique_ptr<comm::QuorumClient> client;
  std::unique_ptr<comm::ReplicaLink> link;
  comm::QuorumView view;
  StepQuorum q;
  int64_t step = 0;
  int64_t sent_before = 0;  // bytes sent by links already closed
  torch::Tensor flat;       // the gradients averaged across groups, reused every step

  Impl(FullyShardedModel& m, torch::optim::Optimizer& o, const ReplicaOptions& opts)
      : model(m), opt(o), place(comm::resolve_replica_place(opts.coordinator, opts.group)), step(opts.start_step) {
    const CommPtr& c = model.comm();
    // One launch of the group: a number every rank agrees on and a later
    // launch exceeds (rank 0's clock).
    auto inc = torch::tensor(
        {static_cast<int64_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count())},
        torch::kInt64);
    if (c->world_size() > 1) c->broadcast(inc, 0, {"replica group launch"})->wait();
    detail::checkpoint_kind(&opt);  // refuses an optimizer whose state cannot travel, before hello
    comm::GroupIdentity id;
    id.group = place.group;
    id.rank = c->rank();
    id.group_size = c->world_size();
    id.incarnation = inc.item<int64_t>();
    id.model = model_fingerprint(model);
    id.sharding = sharding_of(model);
    client = std::make_unique<comm::QuorumClient>(place, id, opts.connect_timeout);
  }

  comm::ReplicaLink& link_for(const comm::QuorumView& v) {
    if (!link || link->comm() != v.comm) {
      drop_link();
      link = std::make_unique<comm::ReplicaLink>(*client, v);
    }
    return *link;
  }
  void drop_link() {
    if (link) sent_before += link->bytes_sent();
    link.reset();
  }

  // The state that makes a step: every shard the optimizer steps, its
  // state, and the module's buffers, in one order on every group.
  void heal(const comm::QuorumView& v) {
    std::vector<int> healing;
    for (int g : v.members)
      if (std::find(v.sources.begin(), v.sources.end(), g) == v.sources.end()) healing.push_back(g);
    if (healing.empty()) return;
    const int r = client->identity().rank;
    const int source = v.sources[r % v.sources.size()];
    const int me = place.group;
    const bool sending = me == source;
    const bool receiving = v.heal;
    if (!sending && !receiving) return;
    trace::Span span("heal", "ft");
    const auto t0 = Clock::now();
    auto& l = link_for(v);
    auto index_of = [&](int g) {
      return static_cast<int>(std::find(v.members.begin(), v.members.end(), g) - v.members.begin());
    };
    const auto* kind = detail::checkpoint_kind(&opt);
    const auto names = detail::saved_tensors(kind, &opt);
    const auto params = optimizer_params(opt);
    std::vector<torch::Tensor> buffers;
    for (const auto& b : model.module().buffers()) buffers.push_back(b);
    // The order on both sides: the optimizer's header (which parameters
    // have state, their step, which tensors), then every parameter shard and
    // buffer, then the state tensors; the bulk in flight at once.
    int64_t got = 0;
    auto first_byte = t0;  // the receiver: when the source's header arrived
    if (sending) {
      json header = json::array();
      std::vector<torch::Tensor> bulk;
      for (const auto& p : params) bulk.push_back(p.contiguous());
      for (const auto& b : buffers) bulk.push_back(b.contiguous());
      for (const auto& p : params) {
        auto it = opt.state().find(compat::optimizer_state_key(p));
        if (it == opt.state().end() || !kind) {
          header.push_back(nullptr);
          continue;
        }
        json row{{"step", kind->step(*it->second)}, {"tensors", json::array()}};
        for (const auto& n : names) {
          auto t = kind->tensor(*it->second, n);
          if (!t.defined()) continue;
          row["tensors"].push_back(n);
          bulk.push_back(t.contiguous());
        }
        header.push_back(row);
      }
      std::string h = header.dump();
      auto len = torch::tensor({static_cast<int64_t>(h.size())}, torch::kInt64);
      auto text = torch::from_blob(h.data(), {static_cast<int64_t>(h.size())}, torch::kUInt8);
      for (int g : healing) {
        const int to = index_of(g);
        l.send_all(to, {len, text});
        l.lend(to, bulk);
      }
    }
    if (receiving) {
      const int from = index_of(source);
      auto len = torch::zeros({1}, torch::kInt64);
      l.recv(from, len);
      first_byte = Clock::now();
      std::string h(static_cast<size_t>(len.item<int64_t>()), '\0');
      l.recv(from, torch::from_blob(h.data(), {static_cast<int64_t>(h.size())}, torch::kUInt8));
      const json header = json::parse(h);
      FSDP_CHECK(header.size() == params.size(), "heal: the source's optimizer has ", header.size(),
                 " parameters, this one ", params.size());
      // Into the parameters and buffers in place (a staging copy for one
      // that is not contiguous), and into fresh state tensors.
      std::vector<torch::Tensor> bulk;
      std::vector<std::pair<torch::Tensor, torch::Tensor>> staged;
      auto into = [&](const torch::Tensor& t) {
        if (t.is_contiguous()) {
          bulk.push_back(t);
        } else {
          auto tmp = torch::empty_like(t, torch::MemoryFormat::Contiguous);
          staged.emplace_back(t, tmp);
          bulk.push_back(tmp);
        }
      };
      for (const auto& p : params) into(p);
      for (const auto& b : buffers) into(b);
      std::vector<std::map<std::string, torch::Tensor>> state(params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        if (header[i].is_null()) continue;
        for (const auto& n : header[i].at("tensors")) {
          auto t = torch::empty_like(params[i], torch::MemoryFormat::Contiguous);
          state[i][n.get<std::string>()] = t;
          bulk.push_back(t);
        }
      }
      {
        torch::NoGradGuard ng;
        l.take(from, bulk);
        for (auto& [dst, tmp] : staged) dst.copy_(tmp);
      }
      got = 8 + static_cast<int64_t>(h.size());
      for (const auto& t : bulk) got += t.numel() * t.element_size();
      const detail::GroupOptions groups(opt);
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& p = params[i];
        const auto key = compat::optimizer_state_key(p);
        if (header[i].is_null()) {
          opt.state().erase(key);
          continue;
        }
        auto get = [&](const std::string& n) {
          auto it = state[i].find(n);
          return it == state[i].end() ? torch::zeros_like(p) : it->second;
        };
        opt.state()[key] = kind->make(groups.of(p), header[i].at("step").get<int64_t>(), get);
      }
      step = v.step;
    }
    const auto t1 = Clock::now();
    if (receiving) {
      q.healed = true;
      q.heal_source = source;
      q.heal_seconds = std::chrono::duration<double>(t1 - first_byte).count();
      q.heal_wait_seconds = std::chrono::duration<double>(first_byte - t0).count();
      q.heal_bytes = got;
    }
    if (span.active())
      span.arg("group", me).arg("quorum", v.id).arg("step", v.step).arg("source", source).arg("receiving", receiving)
          .arg("bytes", got).arg("wait_ms", 1e3 * q.heal_wait_seconds);
  }

  const StepQuorum& start_step() {
    for (;;) {
      view = client->join(step);
      q = StepQuorum{};
      q.id = view.id;
      q.step = view.step;
      q.groups = view.members;
      try {
        // Every member connects now, so the links' set-up never waits on
        // a member's forward and backward.
        if (view.members.size() > 1) link_for(view);
        heal(view);
        return q;
      } catch (const std::exception& e) {
        // A peer died or froze while connecting or copying: the step is
        // dropped on every group and the next quorum heals again.
        q.committed = false;
        q.dropped = vote_failed(
            detail::cat("connecting to the other groups or healing from a peer failed: ", message_of(e)));
        trace_quorum();
      }
    }
  }

  // Votes this rank's failure; returns why the step was dropped.
  std::string vote_failed(const std::string& why) {
    drop_link();
    return client->vote(view, false, why).why;
  }

  // The step's quorum as this group took part in it, into the trace.
  void trace_quorum() const {
    if (trace::enabled())
      trace::instant("quorum", "ft",
                     json{{"quorum", q.id}, {"step", q.step}, {"groups", q.groups}, {"group", place.group},
                          {"committed", q.committed}, {"dropped", q.dropped}, {"healed", q.healed},
                          {"heal_seconds", q.heal_seconds}, {"heal_wait_seconds", q.heal_wait_seconds}});
  }

  bool commit() {
    model.wait_pending();
    bool ok = true;
    std::string why;
    const auto params = optimizer_params(opt);
    std::vector<torch::Tensor> grads;
    for (const auto& p : params) {
      if (!p.requires_grad()) continue;
      grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
    }
    const bool across = view.members.size() > 1;
    try {
      if (across) {
        trace::Span span("all_reduce across replica groups", "ft");
        std::vector<torch::Tensor> pieces;
        for (const auto& g : grads) pieces.push_back(g.reshape({-1}).to(torch::kFloat32));
        if (!flat.defined()) flat = torch::empty({0}, torch::kFloat32);
        if (pieces.empty())
          flat.resize_({0});
        else
          torch::cat_out(flat, pieces);  // resizes once, then reuses its storage
        link_for(view).all_reduce_mean(flat);
      }
    } catch (const std::exception& e) {
      ok = false;
      why = detail::cat("the mean across groups failed: ", message_of(e));
      drop_link();
    }
    const comm::StepOutcome d = client->vote(view, ok, why);
    q.committed = d.commit;
    q.dropped = d.why;
    if (d.commit) {
      if (across) {
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
      ++step;
    } else {
      drop_link();  // the next quorum connects afresh
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
int64_t ReplicaGroups::step() const { return impl_->step; }
int ReplicaGroups::group() const { return impl_->place.group; }
const StepQuorum& ReplicaGroups::quorum() const { return impl_->q; }
int64_t ReplicaGroups::bytes_sent() const {
  return impl_->sent_before + (impl_->link ? impl_->link->bytes_sent() : 0);
}

}  // namespace fsdp
