// fsdp-cpp: a rank's connection to the coordinator (see client.h).
#include "replicas/client.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/rendezvous.h"
#include "comm/store_client.h"
#include "comm/store_listen.h"
#include "fsdp/config.h"
#include "fsdp/errors.h"

namespace fsdp::replicas {
namespace {

using detail::cat;
using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kCall{2000};  // one store round trip's budget

double seconds_of(std::chrono::milliseconds d) { return d.count() / 1000.0; }

std::string fingerprint(const std::string& token) { return token.empty() ? "none" : comm::token_fingerprint(token); }

comm::StoreClient::Connect connector(const ReplicaPlace& p) {
  return [addr = p.host, port = p.port] { return comm::connect_store_client(addr, port, std::chrono::seconds(5)); };
}

std::string where(const ReplicaPlace& p) { return p.host + ":" + std::to_string(p.port); }

// The keys this rank uses with the coordinator whose token fingerprint is
// `theirs`: a coordinator started without FSDP_JOB_TOKEN serves every rank
// under the token-less keys (`fsdp run` gives each launch a random token of
// its own when none is set); one started with a token serves only ranks
// that hold the same. nullopt and why when this rank is not the
// coordinator's.
std::optional<Keys> keys_for(const ReplicaPlace& p, const std::string& theirs, std::string* why) {
  if (theirs == "none") return Keys("");
  const std::string mine = fingerprint(p.job_token);
  if (theirs == mine) return Keys(p.job_token);
  *why = cat("the coordinator at ", where(p), " belongs to another job: its FSDP_JOB_TOKEN fingerprint is ", theirs,
             ", this rank's ", mine == "none" ? "is unset" : "fingerprint is " + mine,
             ". Start the coordinator and every group of the job with the same FSDP_JOB_TOKEN");
  return std::nullopt;
}

// Why a coordinator with settings `cfg` cannot serve this rank; "" when it can.
std::string refuse(const ReplicaPlace& p, const std::string& cfg, Settings* out) {
  std::string why;
  const auto s = parse_settings(cfg, &why);
  if (!s) return cat("the coordinator at ", where(p), " published settings this rank cannot read (", why, ")");
  if (s->protocol != kProtocol)
    return cat("the coordinator at ", where(p), " speaks protocol ", s->protocol, ", this rank ", kProtocol,
               ". Expected `fsdp coordinator` of the same fsdp-cpp as the groups");
  if (out) *out = *s;
  return "";
}

// A coordinator's keys for this rank and its settings, once it published
// both; throws fsdp::Error when it is another job's or cannot serve it.
std::optional<std::pair<Keys, std::string>> coordinator_at(comm::StoreClient& c, const ReplicaPlace& p,
                                                          const std::string& who) {
  auto job = c.read({Keys::job()}, kCall);
  if (!job || !(*job)[0]) return std::nullopt;
  std::string why;
  auto keys = keys_for(p, *(*job)[0], &why);
  if (!keys) throw Error(who + ": " + why);
  auto cfg = c.read({keys->cfg()}, kCall);
  if (!cfg || !(*cfg)[0]) return std::nullopt;
  return std::make_pair(*keys, *(*cfg)[0]);
}

}  // namespace

struct QuorumClient::Shared {
  std::mutex mu;
  RankSide side;         // guarded by mu
  std::string fatal;     // guarded by mu: why this rank cannot go on (the heartbeat found it)
  const Keys keys;              // as the coordinator serves this rank (with or without the token)
  const ReplicaPlace place;
  int64_t n = 0;               // the heartbeat thread's own
  std::string registered;      // the heartbeat thread's own: the settings it last registered with
  // The watch: a thread that only sleeps; a sleep that took past the
  // heartbeat timeout is this process held up (stopped, its host paused),
  // whatever the store did meanwhile.
  std::condition_variable watch_cv;
  bool stop_watch = false;    // guarded by mu
  Clock::time_point watched;  // guarded by mu: when the watch last woke
  Clock::time_point stalled;  // guarded by mu: when a stall was last seen
  std::chrono::milliseconds timeout{10000};
  void held_up(Clock::time_point now) {
    side.held_up();
    stalled = now;
  }
  // Guarded by mu: a call made at `asked` reached a coordinator. A stall the
  // watch has not woken from yet counts too (after SIGCONT any thread may
  // run first).
  void reached(bool new_coordinator, Clock::time_point asked) {
    const auto now = Clock::now();
    if (now - watched > timeout) held_up(now);
    side.reached(new_coordinator, asked > stalled);
  }
  Shared(GroupIdentity id, int64_t start, const ReplicaPlace& p, Keys k)
      : side(std::move(id), start), keys(std::move(k)), place(p) {}
};

ReplicaPlace resolve_replica_place(const std::string& coordinator, int group,
                                   std::chrono::milliseconds coordinator_timeout) {
  const config::EnvConfig env = config::read_env();
  const std::string at = coordinator.empty() ? env.coordinator : coordinator;
  const int g = group >= 0 ? group : env.replica_group.value_or(-1);
  if (at.empty())
    throw Error("fsdp::ReplicaGroups: no coordinator. Expected ReplicaOptions::coordinator or FSDP_COORDINATOR "
                "set to the host:port `fsdp coordinator` listens on");
  if (g < 0)
    throw Error("fsdp::ReplicaGroups: no replica group. Expected ReplicaOptions::group or FSDP_REPLICA_GROUP set to "
                "this group's id (0, 1, ...: one per `fsdp run` of the job)");
  const auto colon = at.rfind(':');
  int port = 0;
  try {
    port = colon == std::string::npos ? 0 : std::stoi(at.substr(colon + 1));
  } catch (const std::exception&) {
    port = 0;
  }
  if (colon == std::string::npos || colon == 0 || port < 1 || port > 65535)
    throw Error(cat("fsdp::ReplicaGroups: coordinator '", at, "': expected host:port (e.g. 10.0.0.5:29400)"));
  ReplicaPlace p;
  p.host = at.substr(0, colon);
  p.port = port;
  p.group = g;
  p.transport = env.transport;
  p.host_id = env.host_id;
  p.job_token = env.job_token;
  p.coordinator_timeout = env.coordinator_timeout_ms ? std::chrono::milliseconds(*env.coordinator_timeout_ms)
                                                     : coordinator_timeout;
  return p;
}

int64_t take_launch(const ReplicaPlace& place, std::chrono::milliseconds budget) {
  comm::StoreClient c(connector(place), std::chrono::seconds(1));
  const auto deadline = Clock::now() + budget;
  const std::string who = cat("replica group ", place.group);
  for (;;) {
    if (auto at = coordinator_at(c, place, who)) {
      const std::string why = refuse(place, at->second, nullptr);
      if (!why.empty()) throw Error(who + ": " + why);
      // The counter exists once the live ranks had a moment to register with
      // the coordinator (it numbers new launches above every one it heard of).
      const auto open = c.read({at->first.launches()}, kCall);
      if (open && (*open)[0])
        if (auto n = c.add(at->first.launches(), 1, kCall)) return *n;
    }
    if (Clock::now() > deadline)
      throw Error(cat("replica group ", place.group, ": no coordinator answered at ", where(place), " within ",
                      seconds_of(budget), " s. Expected `fsdp coordinator` listening there (FSDP_COORDINATOR names it); "
                      "start it first, or fix the address"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

QuorumClient::QuorumClient(const ReplicaPlace& place, GroupIdentity id, int64_t start_step,
                           std::chrono::milliseconds connect_budget)
    : place_(place), keys_("") {
  const int group = id.group, rank = id.rank;
  const std::string who = cat("replica group ", group, " rank ", rank);
  client_ = std::make_unique<comm::StoreClient>(connector(place_), std::chrono::seconds(1));
  const auto deadline = Clock::now() + connect_budget;
  std::optional<std::pair<Keys, std::string>> at;
  while (!(at = coordinator_at(*client_, place_, who))) {
    if (Clock::now() > deadline)
      throw Error(cat("replica group ", group, " rank ", rank, ": no coordinator answered at ", where(place_),
                      " within ", seconds_of(connect_budget),
                      " s. Expected `fsdp coordinator` listening there (FSDP_COORDINATOR names it); start it first, or "
                      "fix the address"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Settings settings;
  const std::string why = refuse(place_, at->second, &settings);
  if (!why.empty()) throw Error(who + ": " + why);
  keys_ = at->first;
  shared_ = std::make_shared<Shared>(std::move(id), start_step, place_, keys_);
  epoch_ = at->second;
  heartbeat_timeout_ = std::chrono::milliseconds(settings.heartbeat_ms);
  RankMessage hello;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    hello = shared_->side.hello();
  }
  send(hello);
  if (unsent_)
    throw Error(cat("replica group ", group, " rank ", rank, ": the coordinator at ", where(place_),
                    " stopped answering while this rank said hello"));
  // The heartbeat: its own connection, so a wait for an answer never delays
  // it. Its first beat registers the rank.
  comm::StoreClient::Periodic beats;
  beats.every = std::chrono::microseconds(std::max<int64_t>(heartbeat_timeout_.count() * 1000 / 10, 5000));
  beats.tick = [sh = shared_](comm::StoreSession& s) {
    const auto asked = Clock::now();
    std::string report, key;
    {
      std::lock_guard<std::mutex> lock(sh->mu);
      report = to_json(sh->side.report(++sh->n));
      const GroupIdentity& id = sh->side.identity();
      key = sh->keys.heartbeat(id.group, id.incarnation, id.rank);
    }
    s.set(key, report);
    const auto cfg = s.get(sh->keys.cfg());
    if (cfg) {
      // Reached a coordinator: a new one finds this rank suspect if it was
      // held up meanwhile; the beat it reads once the rank registers is one
      // written after this (the one above may predate it).
      const bool fresh = *cfg != sh->registered;
      {
        std::lock_guard<std::mutex> lock(sh->mu);
        sh->reached(fresh, asked);
        if (fresh) report = to_json(sh->side.report(++sh->n));
      }
      if (fresh) s.set(key, report);
    }
    if (cfg && *cfg == sh->registered) return;
    // A new coordinator (or the first): this job's, with the same keys, and
    // of this protocol?
    const auto job = s.get(Keys::job());
    if (!job) return;  // it has not published itself yet
    std::string why;
    const auto keys = keys_for(sh->place, *job, &why);
    if (keys && keys->base() != sh->keys.base())
      why = "the coordinator restarted with another FSDP_JOB_TOKEN than the one this rank started with";
    if (why.empty() && !cfg) return;  // its settings come next
    if (why.empty()) why = refuse(sh->place, *cfg, nullptr);
    Registration reg;
    {
      std::lock_guard<std::mutex> lock(sh->mu);
      if (!why.empty()) {
        sh->fatal = why;
        return;
      }
      reg = sh->side.registration();
    }
    // Counted and written under the coordinator these settings name: if
    // another took its place meanwhile, this write is never read and the
    // next beat registers with the new one.
    std::string bad;
    const auto settings = parse_settings(*cfg, &bad);
    if (!settings) return;  // not this protocol's: refuse() said so above
    const int64_t era = era_of(settings->epoch);
    const int64_t i = s.add(sh->keys.nreg(era), 1);
    s.set(sh->keys.reg(era, i - 1), to_json(reg));
    s.set(sh->keys.bell(), "");
    sh->registered = *cfg;
  };
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->timeout = heartbeat_timeout_;
    shared_->watched = Clock::now();
  }
  heartbeat_ = std::make_unique<comm::StoreClient>(connector(place_), std::chrono::seconds(1), std::move(beats));
  watch_ = std::thread([sh = shared_] {
    std::unique_lock<std::mutex> lock(sh->mu);
    const auto period = std::max<Clock::duration>(sh->timeout / 10, std::chrono::milliseconds(5));
    for (;;) {
      const auto before = Clock::now();
      if (sh->watch_cv.wait_for(lock, period, [&] { return sh->stop_watch; })) return;
      sh->watched = Clock::now();
      if (sh->watched - before > sh->timeout) sh->held_up(sh->watched);
    }
  });
}

QuorumClient::~QuorumClient() {
  try {
    RankMessage bye;
    std::string key;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      bye = shared_->side.bye();
      key = shared_->side.answer_key(keys_);
    }
    send(bye);
    if (std::uncaught_exceptions() == 0)
      wait_key(key, "its farewell", false, Clock::now() + place_.coordinator_timeout + heartbeat_timeout_);
  } catch (const std::exception&) {
    // The coordinator is gone, or kept it past the bound: it counts this
    // rank lost, which is right.
  }
  heartbeat_.reset();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stop_watch = true;
  }
  shared_->watch_cv.notify_all();
  if (watch_.joinable()) watch_.join();
}

void QuorumClient::send(const RankMessage& m) {
  const GroupIdentity& id = identity();
  unsent_ = !(client_->write(keys_.mailbox(id.group, id.incarnation, id.rank), to_json(m), kCall) &&
              client_->write(keys_.bell(), "", kCall));
}

const GroupIdentity& QuorumClient::identity() const { return shared_->side.identity(); }

int64_t QuorumClient::committed() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->side.committed();
}

std::string QuorumClient::wait_key(const std::string& key, const char* what, bool outcome_pending,
                                   Clock::time_point give_up) {
  const GroupIdentity& id = identity();
  auto last_answer = Clock::now();
  for (int i = 0;; ++i) {
    if (Clock::now() > give_up)
      throw Error(cat("replica group ", id.group, " rank ", id.rank, ": gave up waiting for ", what));
    if (unsent_) {
      // The latest message never reached the store: again (the coordinator
      // reads only what is there).
      RankMessage m;
      {
        std::lock_guard<std::mutex> lock(shared_->mu);
        m = shared_->side.resync();
      }
      send(m);
    }
    const auto asked = Clock::now();
    auto v = client_->read({key, keys_.cfg()}, kCall);
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->fatal.empty())
        throw Error(cat("replica group ", id.group, " rank ", id.rank, ": ", shared_->fatal));
    }
    if (v && (*v)[1]) {
      last_answer = Clock::now();
      if (*(*v)[1] != epoch_) {
        // Another coordinator on the same address (it restarted): it has
        // none of what this rank sent. Say it again; the heartbeat registers
        // the rank with it. The answer will be at the same key.
        Settings settings;
        const std::string why = refuse(place_, *(*v)[1], &settings);
        if (!why.empty()) throw Error(cat("replica group ", id.group, " rank ", id.rank, ": ", why));
        epoch_ = *(*v)[1];
        heartbeat_timeout_ = std::chrono::milliseconds(settings.heartbeat_ms);
        ++restarts_;
        RankMessage m;
        {
          std::lock_guard<std::mutex> lock(shared_->mu);
          shared_->reached(true, asked);
          shared_->timeout = heartbeat_timeout_;
          m = shared_->side.resync();
        }
        send(m);
        continue;
      }
      if ((*v)[0]) return *(*v)[0];
    } else if (v) {
      last_answer = Clock::now();  // a store that answers, before its coordinator published its settings
    } else if (Clock::now() - last_answer > place_.coordinator_timeout) {
      throw Error(cat("replica group ", id.group, " rank ", id.rank, ": the coordinator at ", where(place_),
                      " stopped answering for ", seconds_of(place_.coordinator_timeout),
                      " s while this rank waited for ", what, ". ",
                      outcome_pending ? "This rank does not know whether its step was applied: "
                                      : "Nothing of this step was applied. ",
                      "Expected the coordinator back on the same address within FSDP_COORDINATOR_TIMEOUT (restart it "
                      "and the groups go on); else restart the groups from their last checkpoint"));
    }
    // Often at first (the answer usually comes within milliseconds), then
    // every 2 ms: a rank that waits for slower ones leaves them the CPU.
    std::this_thread::sleep_for(std::chrono::microseconds(i < 10 ? 500 : i < 50 ? 1000 : 2000));
  }
}

QuorumView QuorumClient::join() {
  const GroupIdentity& id = identity();
  std::optional<RankMessage> m;
  std::string key;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    m = shared_->side.ask();
    key = shared_->side.answer_key(keys_);
  }
  if (m) send(*m);
  const std::string text = wait_key(key, "a quorum", false);
  std::string why;
  const auto a = parse_answer(text, &why);
  if (!a)
    throw Error(cat("replica group ", id.group, " rank ", id.rank, ": the coordinator's answer cannot be read (", why,
                    "). Expected `fsdp coordinator` of the same fsdp-cpp as the groups"));
  RankSide::Joined j;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    j = shared_->side.on_answer(*a);
  }
  if (!j.refused.empty())
    throw Error(cat("replica group ", id.group, " was refused by the coordinator at ", where(place_), ": ", j.refused));
  if (j.leaving)
    throw Error(cat("replica group ", id.group, " rank ", id.rank, ": the other ranks of this group ended their run "
                    "(they said bye) while this rank asked for the step after ", committed(),
                    " (a coordinator restart came between their reads of one answer); this rank ends too"));
  FSDP_CHECK(j.internal.empty(), "replica group ", id.group, " rank ", id.rank, ": ", j.internal);
  return *j.view;
}

void QuorumClient::healed() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->side.healed();
}

Outcome QuorumClient::vote(bool ok, const std::string& why) {
  RankMessage m;
  std::string key;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    m = shared_->side.vote(ok, why);
    key = shared_->side.decision_key(keys_);
  }
  send(m);
  const std::string text = wait_key(key, "the step's outcome", true);
  std::string bad;
  auto d = parse_decision(text, &bad);
  if (!d) d = Decision{-1, 0, -1, 0, false, true, ""};  // unreadable: applied nowhere by this rank, its state stale
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->side.on_decision(*d);
}

}  // namespace fsdp::replicas
