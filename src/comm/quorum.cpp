// fsdp-cpp: the coordinator of replica groups, a rank's client of it, and
// the links across groups (see quorum.h).
#include "comm/quorum.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "comm/checks.h"
#include "comm/cma.h"
#include "comm/mesh.h"
#include "comm/rendezvous.h"
#include "comm/ring.h"
#include "comm/store_client.h"
#include "fsdp/config.h"
#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const std::string kBase = "fsdp-ft/";
constexpr std::chrono::milliseconds kCall{2000};  // one store round trip's budget
// Rung (set) after every mailbox write: the coordinator checks it (one
// small round trip) and reads every mailbox only when it rang or a tick
// passed; it deletes it before reading, so no message is missed.
const std::string kBell = kBase + "bell";

std::string ids(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "none" : s;
}

std::string this_host() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

double seconds_of(std::chrono::milliseconds d) { return d.count() / 1000.0; }

std::string mailbox(int g, int r) { return kBase + "mb/" + std::to_string(g) + "/" + std::to_string(r); }
std::string heartbeat(int g, int r) { return kBase + "hb/" + std::to_string(g) + "/" + std::to_string(r); }

}  // namespace

// ---------------------------------------------------------------- client

ReplicaPlace resolve_replica_place(const std::string& coordinator, int group) {
  const config::EnvConfig env = config::read_env();
  const std::string where = coordinator.empty() ? env.coordinator : coordinator;
  const int g = group >= 0 ? group : env.replica_group.value_or(-1);
  if (where.empty())
    throw Error("fsdp::ReplicaGroups: no coordinator. Expected ReplicaOptions::coordinator or FSDP_COORDINATOR "
                "set to the host:port `fsdp coordinator` listens on");
  if (g < 0)
    throw Error("fsdp::ReplicaGroups: no replica group. Expected ReplicaOptions::group or FSDP_REPLICA_GROUP set to "
                "this group's id (0, 1, ...: one per `fsdp run` of the job)");
  const auto colon = where.rfind(':');
  int port = 0;
  try {
    port = colon == std::string::npos ? 0 : std::stoi(where.substr(colon + 1));
  } catch (const std::exception&) {
    port = 0;
  }
  if (colon == std::string::npos || colon == 0 || port < 1 || port > 65535)
    throw Error(detail::cat("fsdp::ReplicaGroups: coordinator '", where, "': expected host:port (e.g. 10.0.0.5:29400)"));
  return {where.substr(0, colon), port, g, env.transport, env.host_id};
}

QuorumClient::QuorumClient(const ReplicaPlace& place, GroupIdentity id, std::chrono::milliseconds connect_budget)
    : place_(place), id_(std::move(id)) {
  const std::string where = place.host + ":" + std::to_string(place.port);
  auto connect = [addr = place.host, port = place.port] {
    return connect_store_client(addr, port, std::chrono::seconds(5));
  };
  // The settings first, on a connection of their own: the heartbeat's
  // period comes from them.
  client_ = std::make_unique<StoreClient>(connect, std::chrono::seconds(1));
  const auto deadline = Clock::now() + connect_budget;
  std::optional<std::string> cfg;
  while (!cfg) {
    auto v = client_->read({kBase + "cfg"}, kCall);
    if (v && (*v)[0]) cfg = (*v)[0];
    if (cfg) break;
    if (Clock::now() > deadline)
      throw Error(detail::cat("replica group ", id_.group, " rank ", id_.rank, ": no coordinator answered at ",
                              where, " within ", seconds_of(connect_budget),
                              " s. Expected `fsdp coordinator` listening there (FSDP_COORDINATOR names it); start it "
                              "first, or fix the address"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  cfg_ = *cfg;
  heartbeat_timeout_ = std::chrono::milliseconds(json::parse(cfg_).at("heartbeat_ms").get<int64_t>());
  // The heartbeat: its own connection, so a request waiting on the
  // coordinator never delays it.
  StoreClient::Periodic beats;
  beats.every = std::chrono::microseconds(std::max<int64_t>(heartbeat_timeout_.count() * 1000 / 10, 5000));
  const std::string key = heartbeat(id_.group, id_.rank);
  auto n = std::make_shared<int64_t>(0);
  beats.tick = [key, n](StoreSession& s) { s.set(key, std::to_string(++*n)); };
  // The mailbox and the heartbeat exist before the coordinator learns of
  // this rank (it reads both in one round trip).
  if (!client_->write(key, "0", kCall)) throw Error(detail::cat("the coordinator at ", where, " stopped answering"));
  send("hello", "{}");
  heartbeat_client_ = std::make_unique<StoreClient>(connect, std::chrono::seconds(1), std::move(beats));
  auto i = client_->add(kBase + "nreg", 1, kCall);
  if (!i ||
      !client_->write(kBase + "reg/" + std::to_string(*i - 1), json{{"group", id_.group}, {"rank", id_.rank}}.dump(),
                      kCall) ||
      !client_->write(kBell, "", kCall))  // the coordinator reads the registration now
    throw Error(detail::cat("the coordinator at ", where, " stopped answering while replica group ", id_.group,
                            " rank ", id_.rank, " said hello"));
}

QuorumClient::~QuorumClient() {
  try {
    send("bye", "{}");
  } catch (const std::exception&) {
    // The coordinator is gone: it counts this rank lost, which is right.
  }
}

void QuorumClient::send(const std::string& kind, std::string body_json) {
  json m = json::parse(body_json);
  m["seq"] = ++seq_;
  m["kind"] = kind;
  m["inc"] = std::to_string(id_.incarnation);
  m["size"] = id_.group_size;
  m["host"] = this_host();
  m["pid"] = static_cast<int64_t>(getpid());
  m["model"] = id_.model;
  m["sharding"] = id_.sharding;
  if (!client_->write(mailbox(id_.group, id_.rank), m.dump(), kCall) || !client_->write(kBell, "", kCall))
    throw Error(detail::cat("replica group ", id_.group, " rank ", id_.rank, ": the coordinator at ", place_.host, ":",
                            place_.port, " stopped answering (a ", kind,
                            " could not be sent). Nothing of this step was applied; restart the coordinator, then "
                            "the groups (they resume from their last checkpoint)"));
}

std::string QuorumClient::wait_key(const std::string& key, const char* what) {
  const auto silent_limit = std::max(heartbeat_timeout_, std::chrono::milliseconds(2000));
  auto last_answer = Clock::now();
  for (int i = 0;; ++i) {
    auto v = client_->read({key, kBase + "cfg"}, kCall);
    if (v) {
      last_answer = Clock::now();
      if ((*v)[1] && *(*v)[1] != cfg_)  // written once per coordinator: another one started
          throw Error(detail::cat("replica group ", id_.group, " rank ", id_.rank, ": the coordinator at ", place_.host,
                                  ":", place_.port, " restarted while this rank waited for ", what,
                                  "; its quorums are lost. Nothing of this step was applied; restart the groups "
                                  "(they resume from their last checkpoint)"));
      if ((*v)[0]) return *(*v)[0];
    } else if (Clock::now() - last_answer > silent_limit) {
      throw Error(detail::cat("replica group ", id_.group, " rank ", id_.rank, ": the coordinator at ", place_.host, ":",
                              place_.port, " stopped answering for ", seconds_of(silent_limit), " s while this rank waited for ",
                              what, ". Nothing of this step was applied. Expected the coordinator to outlive the "
                              "job; restart it, then the groups (they resume from their last checkpoint)"));
    }
    // Often at first (the answer usually comes within milliseconds), then
    // every 2 ms: a rank that waits for slower ones leaves them the CPU.
    std::this_thread::sleep_for(std::chrono::microseconds(i < 10 ? 500 : i < 50 ? 1000 : 2000));
  }
}

QuorumView QuorumClient::join(int64_t committed) {
  if (!asked_) send("req", json{{"round", ++round_}, {"step", committed}}.dump());
  asked_ = false;
  const int64_t round = round_;
  const std::string key =
      kBase + "ans/" + std::to_string(id_.group) + "/" + std::to_string(id_.incarnation) + "/" + std::to_string(round);
  const json a = json::parse(wait_key(key, "a quorum"));
  if (a.contains("refused"))
    throw Error(detail::cat("replica group ", id_.group, " was refused by the coordinator at ", place_.host, ":", place_.port,
                            ": ", a.at("refused").get<std::string>()));
  QuorumView q;
  q.id = a.at("q").get<int64_t>();
  q.comm = a.at("comm").get<int64_t>();
  q.step = a.at("step").get<int64_t>();
  q.members = a.at("members").get<std::vector<int>>();
  q.sources = a.at("sources").get<std::vector<int>>();
  q.heal = a.at("heal").get<bool>();
  q.index = static_cast<int>(std::find(q.members.begin(), q.members.end(), id_.group) - q.members.begin());
  return q;
}

StepOutcome QuorumClient::vote(const QuorumView& q, bool ok, const std::string& why) {
  send("vote", json{{"q", q.id}, {"step", q.step}, {"ok", ok}, {"why", why}, {"round", ++round_}}.dump());
  asked_ = true;
  const json d = json::parse(wait_key(kBase + "dec/" + std::to_string(q.id), "the step's outcome"));
  return {d.at("commit").get<bool>(), d.value("why", std::string())};
}

// ------------------------------------------------------------------ link

ReplicaLink::ReplicaLink(const QuorumClient& client, const QuorumView& q)
    : comm_(q.comm), rank_(client.identity().rank), timeout_(client.heartbeat_timeout()), members_(q.members) {
  auto store = connect_store_client(client.address(), client.port(), std::chrono::seconds(5));
  const std::string prefix =
      kBase + "q" + std::to_string(q.comm) + "/r" + std::to_string(client.identity().rank) + "/";
  mesh_ = connect_mesh_through(store, prefix, q.index, static_cast<int>(q.members.size()), client.address(),
                               client.port(), timeout_);
  // Cross-memory attach when every member is on this host (as a
  // communicator's ranks choose it; FSDP_TRANSPORT=tcp turns it off).
  const ReplicaPlace& place = client.place();
  transport_ = std::make_unique<TransportChoice>(
      choose_transport(mesh_.get(), place.transport, place.host_id, Clock::now() + timeout_, members_,
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
  Wire w;  // reads only: no message, so no sequence number (the members' must stay in step)
  w.mesh = mesh_.get();
  w.deadline = deadline();
  w.names = &members_;
  for (size_t i = 0; i < ts.size(); ++i) {
    const int64_t n = ts[i].numel() * static_cast<int64_t>(ts[i].element_size());
    FSDP_CHECK(p[2 * i + 1] == n && ts[i].is_contiguous(), "ReplicaLink::take: tensor ", i, " has ", n,
               " bytes here, ", p[2 * i + 1], " at the lender");
    read_peer(w, from, transport_->peers.pid[from], ts[i].data_ptr(), static_cast<uint64_t>(p[2 * i]), n);
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
  Wire w;
  w.mesh = mesh_.get();
  w.seq = seq_++;
  w.deadline = deadline();
  w.names = &members_;  // messages name the peer by its group
  try {
    sent_ += cross_memory() ? cma_all_reduce(w, transport_->peers, flat.data_ptr(), flat.numel(),
                                             flat.scalar_type(), size())
                            : ring_all_reduce(w, flat.data_ptr(), flat.numel(), flat.scalar_type(), size());
  } catch (const std::exception& e) {
    throw Error(detail::cat("shard ", rank_, " across groups ", ids(members_), " (\"rank g\" below is group g's rank ",
                            rank_, "): ", e.what()));
  }
}

void ReplicaLink::send(int to, const torch::Tensor& t) {
  const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
  if (n == 0) return;
  const uint64_t seq = copies_[to]++;
  auto tr = mesh_->send(to, slots::slot(seq, slots::kPeerCopy.begin), t.data_ptr(), n);
  const auto left = deadline() - Clock::now();
  tr.wait(std::chrono::duration_cast<std::chrono::milliseconds>(left));
  sent_ += n;
}

void ReplicaLink::recv(int from, torch::Tensor t) {
  const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
  if (n == 0) return;
  const uint64_t seq = copies_[from]++;
  auto tr = mesh_->recv(from, slots::slot(seq, slots::kPeerCopy.begin), t.data_ptr(), n);
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
    std::vector<Transfer> pending;
    for (size_t i = at; i < std::min(ts.size(), at + kInFlight); ++i) {
      const int64_t n = ts[i].numel() * static_cast<int64_t>(ts[i].element_size());
      if (n == 0) continue;
      FSDP_CHECK(ts[i].is_contiguous(), "ReplicaLink: a contiguous tensor");
      const uint64_t slot = slots::slot(copies_[peer]++, slots::kPeerCopy.begin);
      pending.push_back(sending ? mesh_->send(peer, slot, ts[i].data_ptr(), n)
                                : mesh_->recv(peer, slot, ts[i].data_ptr(), n));
      if (sending) sent_ += n;
    }
    const auto until = deadline();
    for (auto& t : pending)
      t.wait(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()));
  }
}

// ----------------------------------------------------------- coordinator

struct Coordinator::State {
  CoordinatorOptions o;
  c10d::TCPStore* server = nullptr;
  c10::intrusive_ptr<c10d::TCPStore> store;  // this process's client of it
  int port = 0;

  struct Rank {
    std::string host;
    int64_t pid = 0;
    int64_t seq = -1;
    std::string beat;
    Clock::time_point beat_at;
    int64_t req_round = -1, req_step = -1;
    int64_t vote_q = -1;
    int64_t vote_round = -1;  // the next round the vote asks for
    bool vote_ok = false;
    std::string vote_why;
    bool gone = false;  // said bye
  };
  struct Group {
    int id = 0;
    std::string inc;      // "" before its first message
    int64_t inc_n = -1;   // the same, as a number: a later launch's is larger
    int size = 0;
    std::string model, sharding;
    std::map<int, Rank> ranks;
    bool lost = false;
    std::string silent;        // when lost: its silent ranks (host, pid, how long), as first seen
    std::string refused;       // why, when refused
    int64_t answered = -1;     // the last request round answered
    bool whole = false;        // holds a committed state (this incarnation)
    int64_t step = 0;          // steps committed (the coordinator's count)
  };
  std::map<int, Group> groups;
  std::vector<std::pair<int, int>> watched;  // (group, rank) in registration order
  int64_t registered = 0;

  struct Quorum {
    int64_t id = -1, comm = -1, step = 0;
    std::vector<int> members;
    std::vector<std::string> launches;  // each member's incarnation
    bool decided = true, committed = false;
    Clock::time_point decided_at;
    Clock::time_point first_failure;  // the first failed vote
  } q;
  int64_t next_q = 0, next_comm = 0;
  int64_t job_step = 0;  // the most steps any quorum committed
  std::map<int64_t, bool> outcomes;  // quorum id -> committed, once decided
  std::string stuck;                 // why no quorum can form, as last logged

  void log(const std::string& s) const {
    if (o.log) o.log(s);
  }

  void set(const std::string& k, const std::string& v) { store->set(k, std::vector<uint8_t>(v.begin(), v.end())); }
  std::string get(const std::string& k) {
    auto b = store->get(k);
    return std::string(b.begin(), b.end());
  }

  void discover() {
    const int64_t n = store->add(kBase + "nreg", 0);
    for (; registered < n; ++registered) {
      const std::string k = kBase + "reg/" + std::to_string(registered);
      if (!store->check({k})) break;  // its writer is between its add and its write
      const json r = json::parse(get(k));
      const std::pair<int, int> gr{r.at("group").get<int>(), r.at("rank").get<int>()};
      if (std::find(watched.begin(), watched.end(), gr) == watched.end()) watched.push_back(gr);
    }
  }

  // What the job trains, fixed by the first group accepted: every later
  // group (a restart too, even after the others left) must match it.
  struct Identity {
    int size = 0;
    std::string model, sharding;
    int group = -1;  // the group that fixed it
  };
  std::optional<Identity> job;

  // Every identity field of `g` against the job's; "" when they agree
  // (and the first group fixes the job's).
  std::string differs(const Group& g) {
    if (!job) {
      job = Identity{g.size, g.model, g.sharding, g.id};
      return "";
    }
    std::string d;
    if (job->size != g.size)
      d += detail::cat("ranks per group: ", g.size, " here, ", job->size, " in group ", job->group, "; ");
    if (job->sharding != g.sharding)
      d += detail::cat("sharding: ", g.sharding, " here, ", job->sharding, " in group ", job->group, "; ");
    if (job->model != g.model) d += detail::cat("model: ", g.model, " here, ", job->model, " in group ", job->group, "; ");
    if (d.empty()) return "";
    return d + "Expected every replica group to train the same model with the same sharding and the same number of "
               "ranks; start this group like the others";
  }

  void on_message(int gid, int r, const json& m) {
    Group& g = groups[gid];
    g.id = gid;
    const std::string inc = m.at("inc").get<std::string>();
    if (inc != g.inc) {
      // A new launch of the group: what it held before is gone.
      const bool again = !g.inc.empty();
      g.inc = inc;
      g.inc_n = std::stoll(inc);
      g.size = m.at("size").get<int>();
      g.model = m.at("model").get<std::string>();
      g.sharding = m.at("sharding").get<std::string>();
      g.ranks.clear();
      g.lost = false;
      g.answered = -1;
      g.whole = false;
      g.step = 0;
      g.refused = differs(g);
      log(detail::cat("group ", gid, again ? " restarted" : " joined", ": ", g.size,
                      g.size == 1 ? " rank (" : " ranks (", g.sharding, ")",
                      g.refused.empty() ? "" : "; refused: " + g.refused));
    }
    Rank& k = g.ranks[r];
    k.host = m.at("host").get<std::string>();
    k.pid = m.at("pid").get<int64_t>();
    if (k.beat_at == Clock::time_point{}) k.beat_at = Clock::now();
    const std::string kind = m.at("kind").get<std::string>();
    if (kind == "req") {
      k.req_round = m.at("round").get<int64_t>();
      k.req_step = m.at("step").get<int64_t>();
    } else if (kind == "vote") {
      k.vote_q = m.at("q").get<int64_t>();
      k.vote_ok = m.at("ok").get<bool>();
      k.vote_why = m.at("why").get<std::string>();
      k.vote_round = m.value("round", int64_t(-1));
      // A vote on a quorum decided already (it was dropped without this
      // rank): its request for the next round stands now.
      auto out = outcomes.find(k.vote_q);
      if (out != outcomes.end() && k.vote_round >= 0) {
        k.req_round = k.vote_round;
        k.req_step = m.at("step").get<int64_t>() + (out->second ? 1 : 0);
      }
    } else if (kind == "bye") {
      k.gone = true;
    }
  }

  void poll() {
    discover();
    if (watched.empty()) return;
    std::vector<std::string> keys;
    for (auto& [g, r] : watched) {
      keys.push_back(mailbox(g, r));
      keys.push_back(heartbeat(g, r));
    }
    auto values = store->multiGet(keys);
    const auto now = Clock::now();
    for (size_t i = 0; i < watched.size(); ++i) {
      const auto [gid, r] = watched[i];
      const std::string mb(values[2 * i].begin(), values[2 * i].end());
      const std::string hb(values[2 * i + 1].begin(), values[2 * i + 1].end());
      const json m = json::parse(mb);
      const int64_t inc = std::stoll(m.at("inc").get<std::string>());
      const int64_t seq = m.at("seq").get<int64_t>();
      auto git = groups.find(gid);
      if (git != groups.end() && git->second.inc_n > inc) continue;  // a previous launch's leftovers
      if (git == groups.end() || git->second.inc_n != inc || !git->second.ranks.count(r) ||
          git->second.ranks[r].seq != seq) {
        on_message(gid, r, m);
        groups[gid].ranks[r].seq = seq;
      }
      Rank& k = groups[gid].ranks[r];
      if (hb != k.beat) {
        k.beat = hb;
        k.beat_at = now;
      }
    }
    // Liveness.
    for (auto& [gid, g] : groups) {
      if (g.inc.empty()) continue;
      std::string silent;
      bool all_gone = !g.ranks.empty();
      for (auto& [r, k] : g.ranks) {
        all_gone &= k.gone;
        if (!k.gone && now - k.beat_at > o.heartbeat_timeout)
          silent += detail::cat(silent.empty() ? "" : ", ", "rank ", r, " (host ", k.host, ", pid ", k.pid,
                                ") silent for ",
                                std::chrono::duration_cast<std::chrono::milliseconds>(now - k.beat_at).count() / 1000.0,
                                " s");
      }
      const bool lost = !silent.empty() || all_gone;
      if (lost && !g.lost) {
        g.silent = silent;
        log(all_gone ? detail::cat("group ", gid, " left (every rank said bye)")
                     : detail::cat("group ", gid, " lost: ", silent));
      }
      if (!lost && g.lost) log(detail::cat("group ", gid, " is back: its heartbeats move again (it will heal)"));
      if (!lost && g.lost) g.whole = false;  // what it holds may be stale
      g.lost = lost;
    }
  }

  // Group `gid`'s answer to its request `round`.
  void answer(int gid, int64_t round, const json& a) {
    Group& g = groups[gid];
    set(kBase + "ans/" + std::to_string(gid) + "/" + g.inc + "/" + std::to_string(round), a.dump());
    g.answered = round;
  }

  bool in(const std::vector<int>& v, int x) const { return std::find(v.begin(), v.end(), x) != v.end(); }

  void decide() {
    if (q.decided) return;
    std::string lost, failed, missing;
    int failures = 0, votes = 0;
    bool only_ended = true;  // every lost member left because its run ended
    for (int gid : q.members) {
      Group& g = groups[gid];
      if (g.lost) {
        only_ended = only_ended && all_said_bye(gid);
        // The survivors' logs name the silent rank, as the coordinator's does.
        lost += detail::cat(lost.empty() ? "" : "; ", "group ", gid,
                            all_said_bye(gid) ? " left (its run ended)"
                            : g.silent.empty() ? " was lost during the step"
                                               : " was lost during the step: " + g.silent);
      }
      for (const auto& [r, k] : g.ranks) votes += k.vote_q == q.id;
      for (int r = 0; r < g.size; ++r) {
        auto it = g.ranks.find(r);
        if (it == g.ranks.end() || it->second.vote_q != q.id) {
          const std::string who =
              it == g.ranks.end() ? detail::cat("group ", gid, " rank ", r)
                                  : detail::cat("group ", gid, " rank ", r, " (host ", it->second.host, ", pid ",
                                                it->second.pid, ")");
          missing += (missing.empty() ? "" : ", ") + who;
        } else if (!it->second.vote_ok) {
          // The first failure in full; the others are counted.
          if (failures++ == 0) failed = detail::cat("group ", gid, " rank ", r, " failed: ", short_why(it->second.vote_why));
        }
      }
    }
    if (failures > 1) failed += detail::cat(" (and ", failures - 1, " more rank", failures > 2 ? "s" : "", ")");
    std::string why;
    if (!lost.empty()) {
      why = lost;
    } else if (!failed.empty()) {
      // The ranks that fail see only their neighbour's link break; the one
      // that never votes is the one that went away: give it a moment.
      if (q.first_failure == Clock::time_point{}) q.first_failure = Clock::now();
      if (!missing.empty() && Clock::now() - q.first_failure < join_window()) return;
      why = missing.empty() ? failed : "no vote from " + missing + "; " + failed;
    } else if (!missing.empty()) {
      return;
    }
    q.decided = true;
    q.decided_at = Clock::now();
    q.committed = why.empty();
    outcomes[q.id] = q.committed;
    json d{{"commit", q.committed}};
    if (!q.committed) d["why"] = why;
    set(kBase + "dec/" + std::to_string(q.id), d.dump());
    // Each vote asked for the next round: the step after the outcome (a
    // dropped step is taken again; nobody applied it).
    for (int gid : q.members)
      for (auto& [r, k] : groups[gid].ranks)
        if (k.vote_q == q.id && k.vote_round >= 0) {
          k.req_round = k.vote_round;
          k.req_step = q.committed ? q.step + 1 : q.step;
        }
    if (q.committed) {
      job_step = std::max(job_step, q.step + 1);
      for (int gid : q.members) {
        groups[gid].whole = true;
        groups[gid].step = q.step + 1;
      }
    } else if (votes == 0 && !lost.empty() && only_ended) {
      // The last votes of finished runs asked for this one: nobody began it.
      log(detail::cat("quorum ", q.id, " (step ", q.step, ", groups ", ids(q.members), ") not taken: ", why));
    } else {
      log(detail::cat("quorum ", q.id, " (step ", q.step, ", groups ", ids(q.members), ") dropped: ", why));
    }
  }

  void form() {
    if (!q.decided) return;
    // Groups whose every rank asked for the same, new round.
    std::vector<int> pending;
    std::map<int, int64_t> step_of;
    std::map<int, bool> agreed;
    for (auto& [gid, g] : groups) {
      if (g.inc.empty() || g.lost || static_cast<int>(g.ranks.size()) < g.size) continue;
      int64_t round = -2, lo = INT64_MAX, hi = -1;
      bool complete = true;
      for (auto& [r, k] : g.ranks) {
        if (k.req_round <= g.answered || (round != -2 && k.req_round != round)) complete = false;
        round = k.req_round;
        lo = std::min(lo, k.req_step);
        hi = std::max(hi, k.req_step);
      }
      if (!complete) continue;
      if (!g.refused.empty()) {
        answer(gid, round, json{{"refused", g.refused}});
        continue;
      }
      pending.push_back(gid);
      step_of[gid] = lo;
      agreed[gid] = lo == hi;
    }
    if (pending.empty()) return;
    const bool first = q.id < 0;
    // Wait for the members of the previous quorum that still hold its
    // state (a group that restarted or thawed since joins when it asks).
    // After a dropped step only for a moment: the survivors ask again at
    // once, and a group that does not is the one that failed (it joins
    // again when it asks).
    const bool waited_enough = !q.committed && Clock::now() - q.decided_at > join_window();
    for (int gid : q.members) {
      const Group& g = groups[gid];
      if (!waited_enough && !g.lost && g.whole && !in(pending, gid) && !all_said_bye(gid)) return;
    }
    if (first && static_cast<int>(pending.size()) < o.min_groups) return;
    int64_t top = 0;
    for (int gid : pending) top = std::max(top, step_of[gid]);
    // The askers are behind the job (fresh, restarted, thawed, or resumed
    // from an older checkpoint). A live group that holds a later committed
    // state and has not asked yet (a survivor of a drop still leaving its
    // failed collective, under load) is waited for: they heal from it. A
    // quorum of the laggards alone would commit a step the job committed
    // already, with other members.
    if (top < job_step)
      for (auto& [gid, g] : groups)
        if (!in(pending, gid) && !g.lost && g.whole && g.step > top && !all_said_bye(gid)) return;
    if (top == 0 && job_step > 0) {
      // Fresh groups, and nobody left who holds what the job trained.
      const std::string why = detail::cat(
          "this job committed ", job_step, " steps, and no live group holds them (the groups that did left or were "
          "lost). Expected a group with the job's state to heal from; start this group from a checkpoint "
          "(ReplicaOptions::start_step; gpt: --resume), or start a new coordinator for a new job");
      for (int gid : pending) {
        answer(gid, groups[gid].ranks.begin()->second.req_round, json{{"refused", why}});
        log(detail::cat("group ", gid, " refused: ", why));
      }
      return;
    }
    std::vector<int> sources;
    for (int gid : pending)
      if (agreed[gid] && step_of[gid] == top && groups[gid].whole) sources.push_back(gid);
    if (sources.empty()) {
      // Nobody holds a committed state (the job's first step, or every
      // group restarted): the lowest group at the top step is the state.
      for (int gid : pending)
        if (agreed[gid] && step_of[gid] == top) {
          sources.push_back(gid);
          break;
        }
    }
    if (sources.empty()) {
      const std::string why =
          detail::cat("no group holds step ", top, " whole (their ranks disagree): restore from a checkpoint");
      if (why != stuck) log(why);  // once, not every round of the loop
      stuck = why;
      return;
    }
    stuck.clear();
    Quorum n;
    n.id = next_q++;
    n.step = top;
    n.members = pending;
    n.decided = false;
    for (int gid : n.members) n.launches.push_back(groups[gid].inc);
    // The links stay when the same launches of the same groups go on.
    n.comm = (q.committed && n.members == q.members && n.launches == q.launches) ? q.comm : next_comm++;
    std::vector<int> healing;
    for (int gid : pending)
      if (!in(sources, gid)) healing.push_back(gid);
    if (n.members != q.members || !healing.empty() || !q.committed)
      log(detail::cat("quorum ", n.id, ": step ", n.step, ", groups ", ids(n.members),
                      healing.empty() ? std::string() : "; healing " + ids(healing) + " from " + ids(sources)));
    for (int gid : pending)
      answer(gid, groups[gid].ranks.begin()->second.req_round,
             json{{"q", n.id}, {"comm", n.comm}, {"step", n.step}, {"members", n.members}, {"sources", sources},
                  {"heal", !in(sources, gid)}});
    q = n;
  }

  Clock::duration join_window() const {
    return std::max<Clock::duration>(std::chrono::milliseconds(200), o.heartbeat_timeout / 10);
  }

  // A vote's reason without Gloo's closing advice.
  static std::string short_why(const std::string& why) {
    std::string w = why;
    const auto advice = w.find(". This is typically caused by");
    if (advice != std::string::npos) {
      const auto close = w.find(')', advice);
      w = w.substr(0, advice) + (close == std::string::npos ? "" : w.substr(close));
    }
    return w;
  }

  bool all_said_bye(int gid) {
    auto& g = groups[gid];
    for (auto& [r, k] : g.ranks)
      if (!k.gone) return false;
    return !g.ranks.empty();
  }
};

Coordinator::Coordinator(CoordinatorOptions o) : s_(std::make_unique<State>()) {
  s_->o = std::move(o);
  if (s_->o.heartbeat_timeout.count() <= 0) throw Error("fsdp coordinator: the heartbeat timeout must be > 0");
  s_->server = host_store(s_->o.host, s_->o.port, std::chrono::seconds(30), s_->o.bind_all);
  s_->port = s_->o.port;
  s_->store = connect_store_client(s_->o.host == "0.0.0.0" ? "127.0.0.1" : s_->o.host, s_->port,
                                   std::chrono::seconds(10));
  std::random_device rd;
  const json cfg{{"heartbeat_ms", s_->o.heartbeat_timeout.count()},
                 {"epoch", std::to_string(rd()) + "-" + std::to_string(getpid())}};
  s_->set(kBase + "cfg", cfg.dump());
  s_->log(detail::cat("coordinator on ", s_->o.host, ":", s_->port, ": heartbeat timeout ",
                      seconds_of(s_->o.heartbeat_timeout), " s, the first quorum waits for ", s_->o.min_groups,
                      " group(s)"));
}

Coordinator::~Coordinator() {
  s_->store.reset();
  close_hosted_store(s_->server);
}

int Coordinator::port() const { return s_->port; }

void Coordinator::run(const std::atomic<bool>& stop) {
  // Every mailbox is read when the bell rang (a rank wrote one) or a tick
  // passed (the heartbeats, the join window); in between, one check of the
  // bell: every millisecond while messages come (a step's votes arrive
  // within milliseconds of each other), every 4 ms when it is quiet, so
  // the coordinator costs the ranks' host little while a step computes.
  const auto tick = std::chrono::milliseconds(std::clamp<int64_t>(s_->o.heartbeat_timeout.count() / 40, 5, 50));
  auto last = Clock::now() - tick, rang_at = Clock::now();
  while (!stop.load()) {
    const bool rung = s_->store->check({kBell});
    const auto now = Clock::now();
    if (rung) rang_at = now;
    if (rung || now - last >= tick) {
      if (rung) s_->store->deleteKey(kBell);
      last = now;
      s_->poll();
      s_->decide();
      s_->form();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(now - rang_at < std::chrono::milliseconds(50) ? 1 : 4));
  }
}

}  // namespace fsdp::comm
