// fsdp-cpp: the links across replica groups (see link.h).
#include "replicas/link.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "comm/checks.h"
#include "comm/cma.h"
#include "comm/mesh.h"
#include "comm/rendezvous.h"
#include "comm/ring.h"
#include "fsdp/errors.h"
#include "replicas/client.h"

namespace fsdp::replicas {
namespace {

using Clock = std::chrono::steady_clock;

std::string group_list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "none" : s;
}

// The coordinator's store as the links' connection sees it: every key it
// writes is recorded, so that the coordinator can delete them once the
// links are retired (a quorum with other links formed). While the
// connection waits for a member's address (the wait polls check()), it
// also watches the quorum's decision: a member that died as the links
// connected (a heal's source killed as the heal starts) makes its group
// relaunch, the coordinator drops the quorum at once, and every member
// gives up then rather than after the heartbeat timeout.
class RecordingStore final : public c10d::Store {
 public:
  struct Written {
    std::mutex mu;
    std::vector<std::string> keys;
    void add(const std::string& k) {
      std::lock_guard<std::mutex> lock(mu);
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
  };
  RecordingStore(c10::intrusive_ptr<c10d::Store> s, std::shared_ptr<Written> w, std::string decision_key)
      : s_(std::move(s)), w_(std::move(w)), decision_key_(std::move(decision_key)) {
    timeout_ = s_->getTimeout();
  }
  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<RecordingStore>(s_->clone(), w_, decision_key_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    w_->add(key);
    s_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override { return s_->get(key); }
  int64_t add(const std::string& key, int64_t value) override {
    w_->add(key);
    return s_->add(key, value);
  }
  bool deleteKey(const std::string& key) override { return s_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override {
    if (s_->check(keys)) return true;
    const auto now = Clock::now();
    if (now - watched_ >= std::chrono::milliseconds(10)) {
      watched_ = now;
      if (s_->check({decision_key_})) {
        const auto v = s_->get(decision_key_);
        std::string why;
        const auto d = parse_decision(std::string_view(reinterpret_cast<const char*>(v.data()), v.size()), &why);
        if (d && !d->commit)
          throw Error(detail::cat("the coordinator dropped the quorum while its links connected (", d->why,
                                  "): given up at once"));
      }
    }
    return false;
  }
  int64_t getNumKeys() override { return s_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { s_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    s_->wait(keys, timeout);
  }

 private:
  c10::intrusive_ptr<c10d::Store> s_;
  std::shared_ptr<Written> w_;
  const std::string decision_key_;  // the quorum's (Keys::decision)
  Clock::time_point watched_{};     // when it was last read
};

}  // namespace

ReplicaLink::ReplicaLink(const QuorumClient& client, const QuorumView& q)
    : comm_(q.comm), era_(q.era), rank_(client.identity().rank), timeout_(client.heartbeat_timeout()), members_(q.members) {
  const ReplicaPlace& place = client.place();
  auto store = comm::connect_store_client(place.host, place.port, std::chrono::seconds(5));
  const std::string prefix = client.keys().link(q.era, q.comm, rank_);
  auto written = std::make_shared<RecordingStore::Written>();
  // Whatever happens, the list of what was written (Keys::link_written):
  // the coordinator reads it when it retires these links.
  auto publish = [&] {
    try {
      nlohmann::json list = nlohmann::json::array();
      {
        std::lock_guard<std::mutex> lock(written->mu);
        for (const auto& k : written->keys) list.push_back(k);
      }
      const std::string text = list.dump();
      store->set(Keys::link_written(prefix, q.index), std::vector<uint8_t>(text.begin(), text.end()));
    } catch (const std::exception&) {
      // The coordinator is gone: its store, and these keys, with it.
    }
  };
  try {
    mesh_ = comm::connect_mesh_through(
        c10::make_intrusive<RecordingStore>(store, written, client.keys().decision(q.era, q.id)), prefix, q.index,
                                       static_cast<int>(q.members.size()), place.host, place.port, timeout_);
  } catch (...) {
    publish();
    throw;
  }
  publish();
  // Cross-memory attach when every member is on this host (as a
  // communicator's ranks choose it; FSDP_TRANSPORT=tcp turns it off).
  transport_ = std::make_unique<comm::TransportChoice>(
      comm::choose_transport(mesh_.get(), place.transport, place.host_id, Clock::now() + timeout_, members_,
                       detail::cat("shard ", rank_, " across replica groups")));
}

bool ReplicaLink::cross_memory() const { return transport_ && transport_->cma; }

void ReplicaLink::lend(int to, const std::vector<torch::Tensor>& ts) {
  if (!cross_memory()) return send_all(to, ts);
  auto posts = torch::empty({static_cast<int64_t>(2 * ts.size())}, torch::kInt64);
  auto* p = posts.data_ptr<int64_t>();
  for (size_t i = 0; i < ts.size(); ++i) {
    FSDP_CHECK(ts[i].is_contiguous(), "ReplicaLink::lend: a contiguous tensor");
    p[2 * i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(ts[i].data_ptr()));
    p[2 * i + 1] = ts[i].numel() * static_cast<int64_t>(ts[i].element_size());
    sent_ += p[2 * i + 1];
  }
  send(to, posts);
  auto done = torch::zeros({1}, torch::kUInt8);
  recv(to, done);  // the tensors are the peer's to read until then
}

void ReplicaLink::take(int from, const std::vector<torch::Tensor>& ts) {
  if (!cross_memory()) return recv_all(from, ts);
  auto posts = torch::empty({static_cast<int64_t>(2 * ts.size())}, torch::kInt64);
  recv(from, posts);
  const auto* p = posts.data_ptr<int64_t>();
  comm::Wire w;  // reads only: no message, so no sequence number (the members' must stay in step)
  w.mesh = mesh_.get();
  w.deadline = deadline();
  w.names = &members_;
  for (size_t i = 0; i < ts.size(); ++i) {
    const int64_t n = ts[i].numel() * static_cast<int64_t>(ts[i].element_size());
    FSDP_CHECK(p[2 * i + 1] == n && ts[i].is_contiguous(), "ReplicaLink::take: tensor ", i, " has ", n,
               " bytes here, ", p[2 * i + 1], " at the lender");
    comm::read_peer(w, from, transport_->peers.pid[from], ts[i].data_ptr(), static_cast<uint64_t>(p[2 * i]), n);
  }
  send(from, torch::ones({1}, torch::kUInt8));
}

ReplicaLink::~ReplicaLink() = default;

int ReplicaLink::size() const { return mesh_->size; }
int ReplicaLink::index() const { return mesh_->rank; }

Clock::time_point ReplicaLink::deadline() const { return Clock::now() + timeout_; }

void ReplicaLink::all_reduce_mean(torch::Tensor flat) {
  FSDP_USER_CHECK(flat.is_contiguous() && flat.device().is_cpu(), "ReplicaLink: a contiguous CPU tensor");
  if (size() == 1) return;
  comm::Wire w;
  w.mesh = mesh_.get();
  w.seq = seq_++;
  w.deadline = deadline();
  w.names = &members_;  // messages name the peer by its group
  try {
    sent_ += cross_memory() ? comm::cma_all_reduce(w, transport_->peers, flat.data_ptr(), flat.numel(),
                                             flat.scalar_type(), size())
                            : comm::ring_all_reduce(w, flat.data_ptr(), flat.numel(), flat.scalar_type(), size());
  } catch (const std::exception& e) {
    throw Error(detail::cat("shard ", rank_, " across groups ", group_list(members_), " (\"rank g\" below is group g's rank ",
                            rank_, "): ", e.what()));
  }
}

void ReplicaLink::send(int to, const torch::Tensor& t) {
  const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
  if (n == 0) return;
  const uint64_t seq = copies_[to]++;
  auto tr = mesh_->send(to, comm::slots::slot(seq, comm::slots::kPeerCopy.begin), t.data_ptr(), n);
  const auto left = deadline() - Clock::now();
  tr.wait(std::chrono::duration_cast<std::chrono::milliseconds>(left));
  sent_ += n;
}

void ReplicaLink::recv(int from, torch::Tensor t) {
  const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
  if (n == 0) return;
  const uint64_t seq = copies_[from]++;
  auto tr = mesh_->recv(from, comm::slots::slot(seq, comm::slots::kPeerCopy.begin), t.data_ptr(), n);
  tr.wait(std::chrono::duration_cast<std::chrono::milliseconds>(deadline() - Clock::now()));
}

namespace {
// Messages one pair keeps in flight: well under the 2^11 sequence numbers
// a slot tells apart (slots.h).
constexpr size_t kInFlight = 256;
}  // namespace

void ReplicaLink::send_all(int to, const std::vector<torch::Tensor>& ts) { post_all(to, ts, true); }
void ReplicaLink::recv_all(int from, const std::vector<torch::Tensor>& ts) { post_all(from, ts, false); }

void ReplicaLink::post_all(int peer, const std::vector<torch::Tensor>& ts, bool sending) {
  for (size_t at = 0; at < ts.size(); at += kInFlight) {
    std::vector<comm::Transfer> pending;
    for (size_t i = at; i < std::min(ts.size(), at + kInFlight); ++i) {
      const int64_t n = ts[i].numel() * static_cast<int64_t>(ts[i].element_size());
      if (n == 0) continue;
      FSDP_CHECK(ts[i].is_contiguous(), "ReplicaLink: a contiguous tensor");
      const uint64_t slot = comm::slots::slot(copies_[peer]++, comm::slots::kPeerCopy.begin);
      pending.push_back(sending ? mesh_->send(peer, slot, ts[i].data_ptr(), n)
                                : mesh_->recv(peer, slot, ts[i].data_ptr(), n));
      if (sending) sent_ += n;
    }
    const auto until = deadline();
    for (auto& t : pending)
      t.wait(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()));
  }
}

}  // namespace fsdp::replicas
