// fsdp-cpp: the coordinator's store I/O and process (see coordinator.h).
#include "replicas/coordinator.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "comm/rendezvous.h"
#include "comm/store_listen.h"
#include "fsdp/errors.h"

namespace fsdp::replicas {
namespace {

using detail::cat;

// At most this many registrations counted but not written are checked again
// (a rank killed between its count and its write leaves one for good).
constexpr size_t kMaxHoles = 1024;

}  // namespace

CoordinatorCore::CoordinatorCore(Kv& kv, const std::string& job_token, RuleOptions o, const std::string& epoch,
                                 int64_t launch_seed, Time now, Log log)
    : kv_(kv), keys_(job_token), log_(std::move(log)) {
  s_.o = o;
  s_.started = now;
  last_pass_ = now;  // a stall before the first pass is this process's too (its recovery does not count it)
  // The era: a number of this process's own, from its epoch (JSON-safe).
  s_.era = era_of(epoch);
  kv_.set(Keys::job(), job_token.empty() ? "none" : comm::token_fingerprint(job_token));
  // The launch counter is made once the live ranks had a moment to register
  // (pass, launches_open): a launch issued before this coordinator heard the
  // groups' launches could number below one of them (its clock behind
  // theirs), and be ignored for good.
  launch_seed_ = std::max<int64_t>(0, launch_seed);
  kv_.set(keys_.cfg(), to_json(Settings{kProtocol, o.heartbeat_timeout.count(), epoch}));
}

void CoordinatorCore::log(const std::string& line) const {
  if (log_) log_(line);
}

bool CoordinatorCore::rang() {
  const auto v = kv_.get({keys_.bell()});
  if (!v[0]) return false;
  kv_.erase(keys_.bell());
  return true;
}

void CoordinatorCore::complain(const std::string& key, const std::string& text, const std::string& why) {
  if (complained_.size() > 4096) complained_.clear();
  if (complained_.insert(key + "\n" + text).second) log(cat("ignored ", key, ": ", why));
}

void CoordinatorCore::discover(Time now, std::vector<std::string>& logs) {
  const int64_t n = kv_.add(keys_.nreg(s_.era), 0);
  for (; registered_ < n; ++registered_) holes_.push_back(registered_);
  if (holes_.empty()) return;
  while (holes_.size() > kMaxHoles) holes_.erase(holes_.begin());
  std::vector<std::string> keys;
  for (int64_t i : holes_) keys.push_back(keys_.reg(s_.era, i));
  const auto values = kv_.get(keys);
  std::vector<int64_t> still;
  for (size_t i = 0; i < holes_.size(); ++i) {
    if (!values[i]) {
      still.push_back(holes_[i]);  // its writer is between its count and its write: checked again next pass
      continue;
    }
    kv_.erase(keys[i]);
    std::string why;
    const auto reg = parse_registration(*values[i], &why);
    if (!reg) {
      complain(keys[i], *values[i], why);
      continue;
    }
    newest_launch_ = std::max(newest_launch_, reg->inc);
    const auto before = s_.groups.find(reg->group);
    const int64_t was = before == s_.groups.end() ? -1 : before->second.inc;
    const int size = before == s_.groups.end() ? 0 : before->second.size;
    for (auto& l : take_registration(s_, *reg, now)) logs.push_back(std::move(l));
    if (was >= 0 && s_.groups.at(reg->group).inc != was)
      for (int r = 0; r < size; ++r) {  // the earlier launch's keys: nobody reads them again
        kv_.erase(keys_.mailbox(reg->group, was, r));
        kv_.erase(keys_.heartbeat(reg->group, was, r));
      }
    // Launches of this group that died between their hello and their
    // registration left a mailbox and a beat nobody reads: the numbers this
    // coordinator issued since the earlier launch (the last 64 at most).
    if (first_issued_ > 0 && s_.groups.at(reg->group).inc == reg->inc && reg->inc != was)
      for (int64_t inc = std::max({was + 1, first_issued_, reg->inc - 64}); inc < reg->inc; ++inc)
        for (int r = 0; r < reg->size; ++r) {
          kv_.erase(keys_.mailbox(reg->group, inc, r));
          kv_.erase(keys_.heartbeat(reg->group, inc, r));
        }
    const std::pair<int, int> gr{reg->group, reg->rank};
    if (std::find(watched_.begin(), watched_.end(), gr) == watched_.end()) watched_.push_back(gr);
  }
  holes_ = std::move(still);
}

void CoordinatorCore::read(Time now, std::vector<std::string>& logs) {
  if (watched_.empty()) return;
  std::vector<std::string> keys;
  for (auto [g, r] : watched_) {
    const int64_t inc = s_.groups.at(g).inc;
    keys.push_back(keys_.mailbox(g, inc, r));
    keys.push_back(keys_.heartbeat(g, inc, r));
  }
  const auto values = kv_.get(keys);
  for (size_t i = 0; i < watched_.size(); ++i) {
    const auto [g, r] = watched_[i];
    const auto& mb = values[2 * i];
    if (mb && *mb != seen_mb_[watched_[i]]) {
      std::string why;
      const auto m = parse_message(*mb, &why);
      if (!m) {
        complain(keys[2 * i], *mb, why);
        seen_mb_[watched_[i]] = *mb;
      } else if (take_message(s_, g, r, *m, now, logs)) {
        seen_mb_[watched_[i]] = *mb;
      }
    }
    const auto& hb = values[2 * i + 1];
    if (hb && *hb != seen_hb_[watched_[i]]) {
      std::string why;
      const auto rep = parse_report(*hb, &why);
      if (!rep) {
        complain(keys[2 * i + 1], *hb, why);
        seen_hb_[watched_[i]] = *hb;
      } else if (take_report(s_, g, r, *rep, now, logs)) {
        seen_hb_[watched_[i]] = *hb;
      }
    }
  }
}

void CoordinatorCore::pass(Time now) {
  std::vector<std::string> logs;
  // A pass comes every tick (timeout / 40 at most); a gap of a quarter of
  // the timeout is this process's own stall (SIGSTOP, a paused host): what
  // it did not see meanwhile is not the ranks' silence.
  if (now - last_pass_ > s_.o.heartbeat_timeout / 4) {
    const auto d = now - last_pass_;
    forgive(s_, d);
    logs.push_back(cat("this coordinator was held up for ", std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 1000.0,
                       " s (stopped or starved): the ranks' silence meanwhile is not counted"));
  }
  last_pass_ = now;
  discover(now, logs);
  // Launches stay above every launch a previous coordinator issued.
  if (launch_counter_ >= 0 && newest_launch_ >= launch_counter_)
    launch_counter_ = kv_.add(keys_.launches(), newest_launch_ - launch_counter_ + 1);
  read(now, logs);
  const Liveness l = liveness(s_, now);
  apply(s_, l);
  for (const auto& c : l.changes) logs.push_back(c.log);
  // Launches open: above every launch registered (the key is new: add
  // makes it with this value).
  if (launch_counter_ < 0 && launches_open(s_, now)) {
    launch_counter_ = kv_.add(keys_.launches(), std::max(launch_seed_, newest_launch_ + 1));
    first_issued_ = launch_counter_ + 1;
  }
  if (s_.recovering && recovery_done(s_, now)) {
    s_.recovering = false;
    if (s_.q.id >= 0)
      logs.push_back(cat("recovered the job's state from its ranks: ", s_.groups.size(), " group(s), quorum ", s_.q.id,
                         s_.q.decided ? " decided" : " in flight", ", step ", s_.job_step, " committed"));
    else
      logs.push_back(cat("no rank reported a state of the job (", s_.groups.size(),
                         " group(s) heard): its first quorum may form"));
  }
  // Before deciding: a member of the quorum in flight that had not read its
  // answer when a coordinator restarted gets it again.
  const Formation again = reanswer(s_);
  apply(s_, again);
  write_replies(again, logs);
  const Verdict v = decide(s_, now);
  if (const auto d = apply(s_, v, now)) {
    const std::string key = keys_.decision(d->era, d->q);
    kv_.set(key, to_json(*d));
    s_.published[{d->era, d->q}] = key;
  }
  if (!v.log.empty()) logs.push_back(v.log);
  const Formation f = form(s_, now);
  const std::string stuck_before = s_.stuck;
  const QuorumState before = s_.q;
  apply(s_, f);
  if (f.next && before.comm >= 0 && (before.era != f.next->era || before.comm != f.next->comm) && s_.job)
    retired_.push_back({before.era, before.comm, static_cast<int>(before.members.size()), s_.job->size, now, {}});
  retire_links(now);
  write_replies(f, logs);
  if (!f.stuck.empty() && f.stuck != stuck_before) logs.push_back(f.stuck);
  const Cleanup c = cleanup(s_, keys_);
  apply(s_, c);
  for (const auto& [key, d] : c.publish) kv_.set(key, to_json(d));
  for (const auto& key : c.erase) kv_.erase(key);
  for (const auto& line : logs) log(line);
}

void CoordinatorCore::write_replies(const Formation& f, std::vector<std::string>& logs) {
  for (const auto& r : f.replies) {
    GroupState& G = s_.groups[r.group];
    const std::string key = keys_.answer(r.group, G.inc, r.round);
    kv_.set(key, to_json(r.answer));
    // A farewell to an earlier round than one answered (a rank stopped
    // through a restart): the later answer may not be read yet, and stays.
    if (r.round < G.answered) continue;
    if (!G.answer_key.empty() && G.answer_key != key) kv_.erase(G.answer_key);  // its ranks asked again: they read it
    G.answer_key = key;
  }
  for (const auto& line : f.logs) logs.push_back(line);
}

void CoordinatorCore::retire_links(Time now) {
  for (auto it = retired_.begin(); it != retired_.end();) {
    Retired& r = *it;
    std::vector<std::string> keys;
    std::vector<std::pair<int, int>> which;
    for (int shard = 0; shard < r.shards; ++shard)
      for (int m = 0; m < r.members; ++m)
        if (!r.done.count({shard, m})) {
          keys.push_back(Keys::link_written(keys_.link(r.era, r.comm, shard), m));
          which.emplace_back(shard, m);
        }
    const auto values = kv_.get(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!values[i]) continue;
      const auto list = nlohmann::json::parse(*values[i], nullptr, false);
      const std::string prefix = keys_.link(r.era, r.comm, which[i].first);
      if (list.is_array())
        for (const auto& k : list)
          if (k.is_string() && k.get<std::string>().compare(0, prefix.size(), prefix) == 0) kv_.erase(k.get<std::string>());
      kv_.erase(keys[i]);
      r.done.insert(which[i]);
    }
    const bool all = static_cast<int>(r.done.size()) == r.shards * r.members;
    it = all || now - r.since > 10 * s_.o.heartbeat_timeout ? retired_.erase(it) : std::next(it);
  }
}

// ---------------------------------------------------------------- process

namespace {

// The coordinator's own store, through its client.
class TcpKv final : public Kv {
 public:
  explicit TcpKv(c10::intrusive_ptr<c10d::TCPStore> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::string& value) override {
    s_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::vector<std::optional<std::string>> get(const std::vector<std::string>& keys) override {
    std::vector<std::optional<std::string>> out(keys.size());
    if (keys.empty()) return out;
    // multiGet waits for an absent key: ask first (one round trip when all
    // are there, which is the usual case).
    std::vector<std::string> present;
    if (s_->check(keys)) {
      present = keys;
    } else {
      for (const auto& k : keys)
        if (s_->check({k})) present.push_back(k);
    }
    if (present.empty()) return out;
    const auto values = s_->multiGet(present);
    for (size_t i = 0, j = 0; i < keys.size() && j < present.size(); ++i)
      if (keys[i] == present[j]) {
        out[i] = std::string(values[j].begin(), values[j].end());
        ++j;
      }
    return out;
  }
  int64_t add(const std::string& key, int64_t delta) override { return s_->add(key, delta); }
  void erase(const std::string& key) override { s_->deleteKey(key); }
  // Blocks until `key` exists or `timeout` passed (the store answers the
  // moment a client sets it).
  void wait_for(const std::string& key, std::chrono::milliseconds timeout) {
    try {
      s_->wait({key}, std::max(timeout, std::chrono::milliseconds(1)));
    } catch (const c10::DistStoreError&) {
      // Not set within the timeout: the store cancelled the wait, and the
      // connection stays usable. (A broken one throws DistNetworkError.)
    }
  }

 private:
  c10::intrusive_ptr<c10d::TCPStore> s_;
};

}  // namespace

struct Coordinator::Impl {
  CoordinatorOptions o;
  c10d::TCPStore* server = nullptr;
  int port = 0;
  std::unique_ptr<Kv> kv;
  // Blocks until the key is set or the time passed (TcpKv::wait_for).
  std::function<void(const std::string&, std::chrono::milliseconds)> wait_for;
  std::unique_ptr<CoordinatorCore> core;
};

Coordinator::Coordinator(CoordinatorOptions o) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.o = std::move(o);
  if (m.o.heartbeat_timeout.count() <= 0) throw Error("fsdp coordinator: the heartbeat timeout must be > 0");
  m.server = comm::host_store(m.o.host, m.o.port, std::chrono::seconds(30), m.o.bind_all);
  m.port = m.o.port;
  auto kv = std::make_unique<TcpKv>(comm::connect_store_client(m.o.host == "0.0.0.0" ? "127.0.0.1" : m.o.host, m.port,
                                                               std::chrono::seconds(10)));
  m.wait_for = [k = kv.get()](const std::string& key, std::chrono::milliseconds t) { k->wait_for(key, t); };
  m.kv = std::move(kv);
  std::random_device rd;
  const std::string epoch = std::to_string(rd()) + "-" + std::to_string(rd()) + "-" + std::to_string(getpid());
  const int64_t seed =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  RuleOptions rules{m.o.heartbeat_timeout, m.o.min_groups};
  m.core = std::make_unique<CoordinatorCore>(*m.kv, m.o.job_token, rules, epoch, seed, Clock::now(), m.o.log);
  if (m.o.log)
    m.o.log(cat("coordinator on ", m.o.host, ":", m.port, ": heartbeat timeout ", m.o.heartbeat_timeout.count() / 1000.0,
                " s, the first quorum waits for ", m.o.min_groups, " group(s)",
                m.o.job_token.empty() ? "; no FSDP_JOB_TOKEN: any process that reaches the port can write its keys"
                                      : "; keys under the job token"));
}

Coordinator::~Coordinator() {
  impl_->core.reset();
  impl_->kv.reset();
  comm::close_hosted_store(impl_->server);
}

int Coordinator::port() const { return impl_->port; }

void Coordinator::run(const std::atomic<bool>& stop) {
  Impl& m = *impl_;
  // Every mailbox is read when the bell rang (a rank wrote one) or a tick
  // passed (the heartbeats, the join window). In between, the coordinator
  // waits on the bell in its store, which answers the moment a rank rings:
  // a step's votes are decided without a polling delay, and a quiet
  // coordinator costs the ranks' host one wake-up per tick.
  const auto tick = std::chrono::milliseconds(std::clamp<int64_t>(m.o.heartbeat_timeout.count() / 40, 5, 50));
  auto last = Clock::now() - tick;
  std::string failing;  // the store's last error, logged once
  while (!stop.load()) {
    try {
      const bool rung = m.core->rang();
      const auto now = Clock::now();
      if (rung || now - last >= tick) {
        last = now;
        m.core->pass(now);
      }
      failing.clear();
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(last + tick - Clock::now());
      // Bounded by the tick, and by `stop` (checked at least every 50 ms).
      m.wait_for(m.core->keys().bell(), std::clamp(left, std::chrono::milliseconds(1), tick));
    } catch (const std::exception& e) {
      // Its own store failed a call: say so once, and try again.
      if (failing != e.what() && m.o.log) m.o.log(cat("a call to its own store failed (trying again): ", e.what()));
      failing = e.what();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

}  // namespace fsdp::replicas
