// fsdp-cpp: a deterministic simulator of replica groups (fsdp/replicas.h),
// after FoundationDB's simulation: the real rules (src/replicas/rules.*),
// the real coordinator with its store I/O (coordinator.*: CoordinatorCore
// over a simulated store) and the real rank-side protocol (rank_side.*:
// RankSide, heal_plan, the messages of protocol.*), driven by a seeded
// scheduler with simulated time. What a rank does between messages (its
// waits, its heal, its agreement with its group, its training and the mean
// across groups) is the sequence ReplicaGroups and QuorumClient run,
// written as coroutines over simulated links; model state is a hash chain.
//
// Faults drawn from the seed: a rank or a whole group killed at any point
// (during a heal, between a decision and its reading), frozen and thawed
// (shorter and longer than the heartbeat and collective timeouts), groups
// restarted fast or slow, malformed and foreign values in the store, the
// coordinator killed and restarted (at once or later, its port answering
// late) or frozen, the network delayed, spiked and writes duplicated.
//
// Invariants, checked as events happen:
//   outcome   every rank that reads a quorum's outcome reads the same one,
//             and a commit had every rank of every member vote ok
//   order     a rank applies a committed step exactly on top of the state
//             it trained from (each step once, in order)
//   heal      a healed rank holds exactly what its source lent, at the
//             quorum's step
//   torn      no rank trains on a state other than the quorum's step, and
//             the ranks of one group train on the same step
//   replicas  the members' rank r average gradients from equal states
//   split     a group's own collectives (which meet only at the same
//             collective, as real ones do) time out only where a fault
//             explains it: one of its ranks frozen, or the coordinator away
//             for about the collectives' timeout. A coordinator restart that
//             leaves one rank inside a step and its mate still asking costs
//             no group a restart
//   rollback  a step is committed again by another quorum only when every
//             live rank that holds a later state is one the coordinator may
//             have lost (frozen lately): a coordinator restart never makes
//             the job forget how far it got
//   progress  once the faults end, a step commits within a bound and every
//             group finishes (a group refused because nobody holds the
//             job's state any more is the one allowed end short of it)
// A failing seed prints the violation and the last events; the same seed
// replays it exactly (--seed N --verbose).
//
// Usage: fsdp_replica_sim [--seeds N] [--from S] [--seed S] [--verbose] [--quiet]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "replicas/coordinator.h"
#include "replicas/protocol.h"
#include "replicas/rank_side.h"
#include "replicas/rules.h"
#include "task.h"
#include "world.h"

namespace {

using namespace fsdp::replicas;
using sim::Crash;
using sim::kMs;
using sim::Task;

constexpr int64_t kS = 1000 * kMs;

Time tp(int64_t us) { return Time{} + std::chrono::microseconds(us); }

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

// A rank's model state: the steps it holds and a hash of how it got there.
struct Model {
  int64_t step = 0;
  uint64_t hash = 0;
  bool operator==(const Model&) const = default;
};

struct Params {
  int groups = 2, ranks = 2;
  int64_t steps = 12;
  int64_t heartbeat = 1000 * kMs;
  int min_groups = 1;
  int max_restarts = 40;
  std::vector<int64_t> step_time;  // per group
  int64_t fault_window = 0;
};

std::string name_of(const QuorumView& v) {
  std::string m;
  for (int g : v.members) m += (m.empty() ? "" : ",") + std::to_string(g);
  return std::to_string(v.id) + "/e" + std::to_string(v.era % 1000) + "/c" + std::to_string(v.comm) + "/s" + std::to_string(v.step) + "/{" + m + "}";
}

class Sim;

// The simulated store as the coordinator's process sees it: its own, at once.
class SimKv final : public Kv {
 public:
  explicit SimKv(sim::Store& s) : s_(s) {}
  void set(const std::string& k, const std::string& v) override { s_.kv[k] = v; }
  std::vector<std::optional<std::string>> get(const std::vector<std::string>& keys) override {
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) {
      auto it = s_.kv.find(k);
      out.push_back(it == s_.kv.end() ? std::nullopt : std::optional<std::string>(it->second));
    }
    return out;
  }
  int64_t add(const std::string& k, int64_t d) override {
    auto it = s_.kv.find(k);
    const int64_t v = (it == s_.kv.end() ? 0 : std::stoll(it->second)) + d;
    s_.kv[k] = std::to_string(v);
    return v;
  }
  void erase(const std::string& k) override { s_.kv.erase(k); }

 private:
  sim::Store& s_;
};

struct GroupSim;

// One rank of one launch of a group: ReplicaGroups' and QuorumClient's
// sequence over the simulated store and links.
struct RankSim {
  Sim& s;
  GroupSim& g;
  int rank;
  int launch_no;
  sim::Proc proc;
  sim::Conn main, hb;
  int64_t inc = -1;
  std::optional<RankSide> side;
  Model state;
  int64_t coll = 0;  // intra-group collectives issued
  std::string link_comm, last_comm;  // the links' and the previous quorum's (era.comm): "" none
  int64_t link_ops = 0;
  std::string epoch, registered, fatal;
  bool unsent = false;
  int64_t beats = 0;
  std::string phase = "starting";  // what it waits for (printed with a failure)
  bool finished = false;           // exited normally
  int64_t state_gen = 0;           // bumped when a heal replaces its state

  RankSim(Sim& sim, GroupSim& group, int r, int launch);
  Task<void> main_task();
  Task<void> body();
  Task<void> heartbeat();
  Task<void> watch();
  void held_up();
  void reached(bool new_coordinator, int64_t asked);
  int64_t watched = 0;   // when the watch last woke
  int64_t stalled = -1;  // when a stall was last seen
  Task<int64_t> take_launch();
  Task<std::pair<bool, int64_t>> group_coll(const char* what, int64_t value, int64_t duration);
  Task<void> send(RankMessage m);
  Task<std::string> wait_key(std::string key, bool outcome_pending);
  Task<QuorumView> join();
  Task<Outcome> vote(QuorumView v, bool ok, std::string why);
  Task<bool> link_connect(const QuorumView& v, std::string* why);
  Task<bool> heal_copy(const QuorumView& v, const HealPlan& plan, std::optional<Model>* staged, std::string* why);
  Task<bool> all_reduce(const QuorumView& v, std::string* why);
  std::string link_prefix(const QuorumView& v) const;
};

struct GroupSim {
  int id = 0, size = 1;
  int64_t step_time = 0;
  int restarts_left = 0;
  int launches = 0;
  std::vector<std::unique_ptr<RankSim>> all;  // every launch's ranks (they outlive their coroutines)
  std::vector<RankSim*> current;
  int exited_ok = 0;
  bool done = false, gave_up = false, restarting = false;
  std::string last_crash;
  int64_t next_delay = -1;  // the next restart's delay, when a fault chose it
  int64_t finished_at = -1;
  // Refused because no live group holds the job's state (the rules' answer
  // when every holder was lost, or left at the end of its run): it ends
  // short of its steps, by design.
  bool orphan_refused = false;
  std::vector<std::pair<int64_t, int64_t>> frozen;  // when one of its ranks was frozen (faults)
};

struct CoordSim {
  std::vector<std::unique_ptr<sim::Proc>> lives;  // every life's process (they outlive their coroutines)
  sim::Proc* proc = nullptr;
  std::unique_ptr<SimKv> kv;
  std::unique_ptr<CoordinatorCore> core;
  std::shared_ptr<sim::Gate> wake;
  int64_t clock_offset = 0;  // its wall clock against simulated time (a host whose clock is behind)
  std::vector<std::pair<int64_t, int64_t>> away;  // when it was dead or frozen
};

class Sim {
 public:
  Sim(uint64_t seed, bool verbose) : w(seed), seed_(seed) { w.verbose = verbose; }
  bool run();
  const std::string& failure() const { return failure_; }
  void print_trace() const {
    for (const auto& l : w.trace) std::printf("  %s\n", l.c_str());
    if (coord.core) {
      const CoordState& cs = coord.core->state();
      std::printf("  coordinator: %s, quorum %lld (step %lld, %s), job step %lld, next q %lld\n",
                  cs.recovering ? "recovering" : "serving", static_cast<long long>(cs.q.id),
                  static_cast<long long>(cs.q.step), cs.q.decided ? (cs.q.committed ? "committed" : "dropped") : "in flight",
                  static_cast<long long>(cs.job_step), static_cast<long long>(cs.next_q));
      for (const auto& [gid, G] : cs.groups) {
        std::printf("    group %d launch %lld: %s%s, whole %d at step %lld, answered %lld%s\n", gid,
                    static_cast<long long>(G.inc), G.lost ? "lost" : "live", G.refused.empty() ? "" : " refused",
                    G.whole ? 1 : 0, static_cast<long long>(G.step), static_cast<long long>(G.answered),
                    G.silent.empty() ? "" : (" (" + G.silent + ")").c_str());
        for (const auto& [r, k] : G.ranks) {
          auto mb = w.store.kv.find(keys.mailbox(gid, G.inc, r));
          std::printf("      rank %d: %s round %lld, committed %lld%s; its mailbox: %s\n", r,
                      k.msg ? name_of(k.msg->kind) : "no message", static_cast<long long>(k.msg ? k.msg->round : -1),
                      static_cast<long long>(k.at ? k.at->committed : -1), k.gone ? " (bye)" : "",
                      mb == w.store.kv.end() ? "(none)" : mb->second.substr(0, 160).c_str());
        }
      }
    }
    std::printf("  live ranks:\n");
    for (const auto& g : groups)
      for (const RankSim* r : g->current)
        if (r->proc.alive)
          std::printf("    %s%s: step %lld, %s\n", r->proc.name.c_str(), r->proc.frozen ? " (frozen)" : "",
                      static_cast<long long>(r->state.step), r->phase.c_str());
  }
  std::string summary() const;

  sim::World w;
  Params p;
  std::string token = "sim-token-0123456789";
  Keys keys{token};
  std::vector<std::unique_ptr<GroupSim>> groups;
  CoordSim coord;
  int64_t coordinator_timeout = 60 * kS;
  int64_t fsdp_timeout = 0;
  int64_t quiet_after = 0;  // when the last fault's effects are over

  // What the invariants remember.
  // A quorum is its whole QuorumRef: a coordinator that restarted knowing
  // nothing may use the same id again for another quorum.
  struct Read {
    const RankSim* rank;
    bool commit;
    int64_t state_gen;  // the rank's state then (a heal replaces it)
  };
  std::map<std::string, std::vector<Read>> outcome_read;  // quorum -> who read what
  std::map<std::tuple<std::string, int, int64_t, int>, bool> votes;  // (quorum, group, launch, rank) -> ok
  std::map<std::pair<std::string, int>, int64_t> trained_at;         // (quorum, group) -> step its ranks trained from
  std::map<std::string, Model> lent;                                 // heal meeting -> what the source lent
  std::map<std::string, std::vector<Model>> reduce_states;           // all-reduce meeting -> the members' states
  int64_t last_commit = 0, commits = 0, drops = 0, heals = 0, coordinator_restarts = 0;

  void violate(const std::string& what) {
    if (failure_.empty()) {
      failure_ = what;
      w.note("VIOLATION: " + what);
    }
  }
  bool failed() const { return !failure_.empty(); }

  // A collective of group `g` timed out (`key`): the group restarts. Allowed
  // only where a fault explains it: one of its ranks frozen, or the
  // coordinator away so long that a rank waiting for its answer could not
  // reach the collective in time. Anything else is a group split by the
  // protocol (one rank in the step, its mate still asking): a violation.
  void check_split(const GroupSim& g, const std::string& key);
  // Quorum `v` committed (`by` read it and applied it): a step committed once already
  // (by another quorum) is a rollback, allowed only when no live rank holds
  // a later state that the coordinator could have known of: every holder
  // was killed, or frozen (lost) at some point in the last collective
  // timeouts.
  void check_rollback(const QuorumView& v, const RankSim& by);
  std::map<int64_t, std::string> committed_by;  // step -> the first quorum that committed it
  void launch(GroupSim& g);
  void on_rank_exit(GroupSim& g, RankSim& r, bool ok, const std::string& why);
  void start_coordinator();
  void kill_coordinator(const std::string& why);
  Task<void> coordinator_main(sim::Proc& proc);
  void draw();
  void schedule_faults(int n);
  RankSim* random_live_rank();

 private:
  uint64_t seed_;
  std::string failure_;
};

RankSim::RankSim(Sim& sim, GroupSim& group, int r, int launch) : s(sim), g(group), rank(r), launch_no(launch) {
  proc.name = "g" + std::to_string(group.id) + "r" + std::to_string(r) + "#" + std::to_string(launch);
  // Every launch starts from the same initial weights (the same seed).
  state = Model{0, mix(0xabcdef, static_cast<uint64_t>(r))};
}

std::string links_of(const QuorumView& v) { return std::to_string(v.era) + "." + std::to_string(v.comm); }

std::string RankSim::link_prefix(const QuorumView& v) const {
  return "link/" + links_of(v) + "/r" + std::to_string(rank) + "/";
}

Task<void> RankSim::main_task() {
  bool ok = true;
  std::string why;
  try {
    co_await body();
  } catch (const Crash& c) {
    ok = false;
    why = c.why;
  } catch (const std::exception& e) {
    ok = false;
    why = std::string("exception: ") + e.what();
    s.violate(proc.name + " threw " + e.what());
  }
  s.w.exit(proc, ok, why);
}

// One of the group's own collectives (Gloo or NCCL among its ranks): the
// ranks meet only at the same collective (`what`): a rank in forward's
// all-gather and its mate in the agreement's all-reduce do not meet, as they
// would not in a real group (there: a hang until the collective timeout).
Task<std::pair<bool, int64_t>> RankSim::group_coll(const char* what, int64_t value, int64_t duration) {
  const std::string key =
      "grp/" + std::to_string(g.id) + "/L" + std::to_string(launch_no) + "/" + std::to_string(coll++) + "/" + what;
  phase = "in group collective " + key;
  std::string why;
  auto r = co_await s.w.meet(proc, key, g.size, value, s.fsdp_timeout, duration, &why);
  if (!r.first) {
    if (why.rfind("timed out", 0) == 0) s.check_split(g, key);
    throw Crash{"a collective of the group failed: " + why};
  }
  co_return r;
}

Task<void> RankSim::send(RankMessage m) {
  sim::Op op;
  op.sets = {{s.keys.mailbox(g.id, inc, rank), to_json(m)}, {s.keys.bell(), ""}};
  auto r = co_await s.w.call(proc, main, op, 2 * kS);
  unsent = !r;
}

Task<int64_t> RankSim::take_launch() {
  const int64_t deadline = s.w.now() + 60 * kS;
  for (;;) {
    sim::Op read;
    read.gets = {Keys::job(), s.keys.cfg(), s.keys.launches()};
    auto r = co_await s.w.call(proc, main, read, 2 * kS);
    if (r && r->values[0] && r->values[1] && r->values[2]) {
      sim::Op add;
      add.add = std::make_pair(s.keys.launches(), int64_t{1});
      auto a = co_await s.w.call(proc, main, add, 2 * kS);
      if (a) co_return a->added;
    }
    if (s.w.now() > deadline) throw Crash{"no coordinator answered"};
    co_await s.w.sleep(proc, 20 * kMs);
  }
}

Task<std::string> RankSim::wait_key(std::string key, bool outcome_pending) {
  int64_t last_answer = s.w.now();
  phase = "waits for " + key;
  for (int i = 0;; ++i) {
    if (unsent) co_await send(side->resync());
    sim::Op op;
    op.gets = {key, s.keys.cfg()};
    const int64_t asked = s.w.now();
    auto r = co_await s.w.call(proc, main, op, 2 * kS);
    if (!fatal.empty()) throw Crash{fatal};
    if (r && r->values[1]) {
      last_answer = s.w.now();
      if (*r->values[1] != epoch) {
        // Another coordinator: say it again; the answer comes at the same key.
        std::string why;
        const auto st = parse_settings(*r->values[1], &why);
        if (!st || st->protocol != kProtocol) s.violate("a rank could not read the coordinator's settings: " + why);
        epoch = *r->values[1];
        s.w.note(proc.name + " found a new coordinator");
        reached(true, asked);
        co_await send(side->resync());
        continue;
      }
      if (r->values[0]) co_return *r->values[0];
    } else if (r) {
      last_answer = s.w.now();
    } else if (s.w.now() - last_answer > s.coordinator_timeout) {
      throw Crash{std::string("the coordinator stopped answering") + (outcome_pending ? " (outcome unknown)" : "")};
    }
    co_await s.w.sleep(proc, i < 10 ? 2 * kMs : 10 * kMs);
  }
}

Task<void> RankSim::heartbeat() {
  const int64_t period = std::max<int64_t>(s.p.heartbeat / 10, 5 * kMs);
  for (;;) {
    sim::Op op;
    op.sets = {{s.keys.heartbeat(g.id, inc, rank), to_json(side->report(++beats))}};
    op.gets = {s.keys.cfg()};
    const int64_t asked = s.w.now();
    auto r = co_await s.w.call(proc, hb, op, 1 * kS);
    if (r && r->values[0]) {
      // QuorumClient's beat: a new coordinator finds the rank suspect if it
      // was held up meanwhile; the beat it reads before the registration is
      // one written after this (the one above may predate it).
      const bool fresh = *r->values[0] != registered;
      reached(fresh, asked);
      if (fresh) {
        if (side->standing().suspect) s.w.note(proc.name + " was held up while its coordinator changed: suspect");
        sim::Op again;
        again.sets = {{s.keys.heartbeat(g.id, inc, rank), to_json(side->report(++beats))}};
        co_await s.w.call(proc, hb, again, 1 * kS);
      }
    }
    if (r && r->values[0] && *r->values[0] != registered) {
      const std::string cfg = *r->values[0];
      sim::Op job;
      job.gets = {Keys::job()};
      auto j = co_await s.w.call(proc, hb, job, 1 * kS);
      if (j && j->values[0]) {
        std::string why;
        const auto st = parse_settings(cfg, &why);
        if (!st || st->protocol != kProtocol) fatal = "settings: " + why;
        sim::Op add;
        const int64_t era = st ? era_of(st->epoch) : 0;
        add.add = std::make_pair(s.keys.nreg(era), int64_t{1});
        auto a = co_await s.w.call(proc, hb, add, 1 * kS);
        if (a) {
          sim::Op reg;
          reg.sets = {{s.keys.reg(era, a->added - 1), to_json(side->registration())}, {s.keys.bell(), ""}};
          if (co_await s.w.call(proc, hb, reg, 1 * kS)) registered = cfg;
        }
      }
    }
    co_await s.w.sleep(proc, period);
  }
}

// QuorumClient's watch: a thread that only sleeps; a sleep that took past
// the heartbeat timeout is this process held up.
Task<void> RankSim::watch() {
  const int64_t period = std::max<int64_t>(s.p.heartbeat / 10, 5 * kMs);
  for (;;) {
    const int64_t before = s.w.now();
    co_await s.w.sleep(proc, period);
    watched = s.w.now();
    if (watched - before > s.p.heartbeat) held_up();
  }
}

void RankSim::held_up() {
  side->held_up();
  stalled = s.w.now();
}

// QuorumClient's Shared::reached: a call made at `asked` reached a
// coordinator; a stall the watch has not woken from yet counts too.
void RankSim::reached(bool new_coordinator, int64_t asked) {
  if (s.w.now() - watched > s.p.heartbeat) held_up();
  side->reached(new_coordinator, asked > stalled);
}

Task<QuorumView> RankSim::join() {
  const auto m = side->ask();
  const std::string key = side->answer_key(s.keys);
  if (m) co_await send(*m);
  const std::string text = co_await wait_key(key, false);
  std::string why;
  const auto a = parse_answer(text, &why);
  if (!a) {
    s.violate("the coordinator wrote an answer a rank cannot read: " + why);
    throw Crash{"unreadable answer"};
  }
  const auto j = side->on_answer(*a);
  if (!j.refused.empty()) throw Crash{"refused: " + j.refused};
  if (j.leaving) throw Crash{"the other ranks of this group ended their run"};
  if (!j.internal.empty()) {
    s.violate(proc.name + ": " + j.internal);
    throw Crash{j.internal};
  }
  co_return *j.view;
}

Task<Outcome> RankSim::vote(QuorumView v, bool ok, std::string why) {
  const RankMessage m = side->vote(ok, why);
  const std::string key = side->decision_key(s.keys);
  s.votes[{name_of(v), g.id, inc, rank}] = ok;
  co_await send(m);
  const std::string text = co_await wait_key(key, true);
  std::string bad;
  auto d = parse_decision(text, &bad);
  if (!d) {
    s.violate("the coordinator wrote a decision a rank cannot read: " + bad);
    d = Decision{-1, 0, -1, 0, false, true, ""};
  }
  const Outcome o = side->on_decision(*d);
  if (!o.expired) {
    // Checked at the end against what the others read (Sim::check_outcomes).
    s.outcome_read[name_of(v)].push_back({this, o.commit, state_gen});
    if (o.commit) {
      // Every rank of every member voted ok (some launch of each member).
      const std::string name = name_of(v);
      for (int member : v.members) {
        const int size = s.groups[static_cast<size_t>(member)]->size;
        bool some_launch = false;
        std::set<int64_t> launches;
        for (auto it2 = s.votes.lower_bound({name, member, INT64_MIN, 0});
             it2 != s.votes.end() && std::get<0>(it2->first) == name && std::get<1>(it2->first) == member; ++it2)
          launches.insert(std::get<2>(it2->first));
        for (int64_t L : launches) {
          bool all = true;
          for (int r = 0; r < size; ++r) {
            auto it2 = s.votes.find({name, member, L, r});
            all = all && it2 != s.votes.end() && it2->second;
          }
          some_launch = some_launch || all;
        }
        if (!some_launch)
          s.violate("quorum " + name_of(v) + " committed without an ok vote from every rank of group " +
                    std::to_string(member));
      }
    }
  }
  s.w.note(proc.name + " quorum " + std::to_string(v.id) + " step " + std::to_string(v.step) + ": " +
           (o.expired ? "expired" : o.commit ? "commit" : "drop"));
  co_return o;
}

Task<bool> RankSim::link_connect(const QuorumView& v, std::string* why) {
  // Through the coordinator's store, as the Gloo links connect.
  sim::Op probe;
  probe.gets = {s.keys.link(v.era, v.comm, rank) + "probe"};
  if (!co_await s.w.call(proc, main, probe, s.p.heartbeat)) {
    *why = "the coordinator's store did not answer while connecting";
    co_return false;
  }
  const std::string prefix = link_prefix(v);
  auto r = co_await s.w.meet(proc, prefix + "connect", static_cast<int>(v.members.size()), 0, s.p.heartbeat, kMs, why);
  if (!r.first) co_return false;
  link_comm = links_of(v);
  link_ops = 0;
  proc.links = {prefix};
  co_return true;
}

Task<bool> RankSim::heal_copy(const QuorumView& v, const HealPlan& plan, std::optional<Model>* staged,
                              std::string* why) {
  const std::string prefix = link_prefix(v) + "heal/";
  const int64_t copy_time = s.w.range(2 * kMs, 30 * kMs);
  for (int to : plan.send_to) {
    const std::string key = prefix + std::to_string(v.index) + ">" + std::to_string(to);
    if (state.step != v.step)
      s.violate(proc.name + " lends a state of step " + std::to_string(state.step) + " as step " +
                std::to_string(v.step));
    s.lent[key] = state;
    auto r = co_await s.w.meet(proc, key, 2, 0, s.p.heartbeat, copy_time, why);
    if (!r.first) co_return false;
  }
  if (plan.receive_from >= 0) {
    const std::string key = prefix + std::to_string(plan.receive_from) + ">" + std::to_string(v.index);
    auto r = co_await s.w.meet(proc, key, 2, 0, s.p.heartbeat, copy_time, why);
    if (!r.first) co_return false;
    auto it = s.lent.find(key);
    if (it == s.lent.end()) {
      s.violate(proc.name + " received a heal nobody lent");
      co_return false;
    }
    *staged = it->second;
  }
  co_return true;
}

Task<bool> RankSim::all_reduce(const QuorumView& v, std::string* why) {
  const std::string key = link_prefix(v) + "ar/" + std::to_string(link_ops++);
  s.reduce_states[key].push_back(state);
  auto r = co_await s.w.meet(proc, key, static_cast<int>(v.members.size()), 0, s.p.heartbeat, 2 * kMs, why);
  if (r.first) {
    const auto& states = s.reduce_states[key];
    for (const auto& st : states)
      if (!(st == states.front()))
        s.violate("quorum " + std::to_string(v.id) + ": shard " + std::to_string(rank) +
                  " averaged gradients of members that hold different states (steps " + std::to_string(st.step) +
                  " and " + std::to_string(states.front().step) + ")");
  }
  co_return r.first;
}

Task<void> RankSim::body() {
  // The launch number: rank 0 takes it from the coordinator's counter, the
  // group agrees by broadcast.
  int64_t launch = 0;
  phase = "takes a launch number";
  if (rank == 0) launch = co_await take_launch();
  const auto [ok0, sum] = co_await group_coll("launch", launch, kMs);
  inc = sum;
  GroupIdentity id;
  id.group = g.id;
  id.rank = rank;
  id.group_size = g.size;
  id.incarnation = inc;
  id.model = "sim model";
  id.sharding = "FULL_SHARD, params fp32";
  id.host = "sim";
  id.pid = 1000 * g.id + 10 * launch_no + rank;
  id.first_launch = launch_no == 1;
  side.emplace(id, 0);
  // Connect: the coordinator's settings, then hello and the heartbeat.
  phase = "connects";
  for (int64_t deadline = s.w.now() + 60 * kS;;) {
    sim::Op op;
    op.gets = {Keys::job(), s.keys.cfg()};
    auto r = co_await s.w.call(proc, main, op, 2 * kS);
    if (r && r->values[0] && r->values[1]) {
      epoch = *r->values[1];
      break;
    }
    if (s.w.now() > deadline) throw Crash{"no coordinator answered"};
    co_await s.w.sleep(proc, 20 * kMs);
  }
  co_await send(side->hello());
  if (unsent) throw Crash{"the coordinator stopped answering while this rank said hello"};
  watched = s.w.now();
  proc.tasks.push_back(heartbeat());
  proc.tasks.push_back(watch());
  for (size_t i = proc.tasks.size() - 2; i < proc.tasks.size(); ++i) {
    sim::Proc* pp = &proc;
    s.w.at(proc, s.w.now(), [pp, i] { pp->tasks[i].start(); });
  }
  while (side->committed() < s.p.steps) {
    const QuorumView v = co_await join();
    phase = "in quorum " + name_of(v);
    if (v.step >= s.p.steps) break;
    const HealPlan plan = heal_plan(v, g.id, rank);
    const bool agree = plan.any || (v.members.size() > 1 && links_of(v) != last_comm);
    last_comm = links_of(v);
    bool ok = true;
    std::string why;
    std::optional<Model> staged;
    if (v.members.size() > 1 && link_comm != links_of(v)) {
      link_comm.clear();
      proc.links.clear();
      ok = co_await link_connect(v, &why);
    }
    if (ok && plan.any) ok = co_await heal_copy(v, plan, &staged, &why);
    if (agree) {
      const auto [cok, failures] = co_await group_coll("agree", ok ? 0 : 1, kMs);
      if (failures > 0) ok = false;
    }
    if (ok && staged) {
      if (staged->step != v.step)
        s.violate(proc.name + " healed to step " + std::to_string(staged->step) + " in a quorum at step " +
                  std::to_string(v.step));
      state = *staged;
      ++state_gen;
      side->healed();
      ++s.heals;
    }
    if (!ok) {
      link_comm.clear();
      last_comm.clear();
      proc.links.clear();
      co_await vote(v, false, why);
      continue;
    }
    // Training: the state must be the quorum's step, the same on every rank
    // of the group.
    if (state.step != v.step)
      s.violate(proc.name + " trains on a state of step " + std::to_string(state.step) + " in quorum " +
                std::to_string(v.id) + " at step " + std::to_string(v.step));
    auto [it, fresh] = s.trained_at.emplace(std::make_pair(name_of(v), g.id), state.step);
    if (!fresh && it->second != state.step)
      s.violate("group " + std::to_string(g.id) + " trains quorum " + name_of(v) +
                " on two steps (a torn group)");
    co_await group_coll("step", 0, g.step_time);  // forward and backward, with the group's collectives
    bool reduced = true;
    if (v.members.size() > 1) reduced = co_await all_reduce(v, &why);
    if (!reduced) {
      link_comm.clear();
      proc.links.clear();
    }
    const Outcome o = co_await vote(v, reduced, why);
    if (o.commit) {
      if (state.step != v.step) s.violate(proc.name + " applies step " + std::to_string(v.step) + " on another state");
      uint64_t h = state.hash;
      h = mix(h, static_cast<uint64_t>(v.step));
      for (int m : v.members) h = mix(h, static_cast<uint64_t>(m) + 1000);
      state = Model{v.step + 1, h};
      s.check_rollback(v, *this);
      s.last_commit = std::max(s.last_commit, s.w.now());
      ++s.commits;
      g.orphan_refused = false;
    } else {
      link_comm.clear();
      last_comm.clear();
      proc.links.clear();
      ++s.drops;
    }
  }
  // QuorumClient's destructor: bye, then stay until the farewell (every rank
  // of the last quorum read the outcome: a coordinator that restarts
  // meanwhile learns it from this rank).
  co_await send(side->bye());
  const std::string text = co_await wait_key(side->answer_key(s.keys), false);
  std::string why;
  const auto a = parse_answer(text, &why);
  if (!a || !a->farewell) s.violate(proc.name + " said bye and read something else than a farewell: " + text);
}

void Sim::check_rollback(const QuorumView& v, const RankSim& by) {
  const std::string name = name_of(v);
  auto [it, fresh] = committed_by.emplace(v.step, name);
  if (fresh || it->second == name) return;
  const int64_t since = w.now() - 2 * fsdp_timeout - 4 * p.heartbeat;
  auto was_frozen = [&](const GroupSim& g) {
    for (const auto& f : g.frozen)
      if (f.second >= since) return true;
    return false;
  };
  // A reader frozen lately reads late: the quorum it reads may be the
  // earlier of the two.
  if (was_frozen(by.g)) return;
  for (const auto& g : groups) {
    if (was_frozen(*g)) continue;
    for (const RankSim* r : g->current)
      if (r->rank == by.rank && r->proc.alive && !r->finished && r->state.step > v.step && !(r->state == by.state))
        violate("rollback: " + by.proc.name + " read quorum " + name + " commit step " + std::to_string(v.step) +
                ", which quorum " + it->second + " committed, while " + r->proc.name + " holds step " +
                std::to_string(r->state.step));
  }
}

void Sim::check_split(const GroupSim& g, const std::string& key) {
  const int64_t to = w.now(), from = to - fsdp_timeout - p.heartbeat;
  auto overlap = [&](const std::pair<int64_t, int64_t>& i) {
    return std::max<int64_t>(0, std::min(i.second, to) - std::max(i.first, from));
  };
  for (const auto& i : g.frozen)
    if (overlap(i) > 0) return;
  int64_t away = 0;
  for (const auto& i : coord.away) away += overlap(i);
  if (away >= fsdp_timeout - 2 * p.heartbeat) return;
  std::string where;
  for (const RankSim* r : g.current)
    where += (where.empty() ? "" : "; ") + r->proc.name + " " + r->phase;
  violate("group " + std::to_string(g.id) + "'s collective " + key + " timed out though none of its ranks was frozen " +
          "and the coordinator was away " + std::to_string(away / kMs) + " ms of it (its ranks split: " + where + ")");
}

// ---------------------------------------------------------------- launcher

void Sim::launch(GroupSim& g) {
  ++g.launches;
  g.current.clear();
  g.exited_ok = 0;
  g.restarting = false;
  for (int r = 0; r < g.size; ++r) {
    g.all.push_back(std::make_unique<RankSim>(*this, g, r, g.launches));
    RankSim& rs = *g.all.back();
    g.current.push_back(&rs);
    rs.proc.on_exit = [this, &g, &rs](bool ok, const std::string& why) { on_rank_exit(g, rs, ok, why); };
  }
  w.note("launch group " + std::to_string(g.id) + " #" + std::to_string(g.launches));
  for (RankSim* rs : g.current) {
    std::vector<Task<void>> t;
    t.push_back(rs->main_task());
    w.start(rs->proc, std::move(t));
  }
}

void Sim::on_rank_exit(GroupSim& g, RankSim& r, bool ok, const std::string& why) {
  if (r.launch_no != g.launches || g.restarting) return;  // an earlier launch's, or already restarting
  if (ok) {
    r.finished = true;
    if (++g.exited_ok == g.size) {
      g.done = true;
      g.finished_at = w.now();
      w.note("group " + std::to_string(g.id) + " finished");
    }
    return;
  }
  // `fsdp run`: one rank failed, so it stops the others and restarts all.
  g.last_crash = why;
  g.orphan_refused = why.find("no live group holds them") != std::string::npos ||
                     why.find("no group with the job's state is here to heal from") != std::string::npos ||
                     why.find("the job's run ended") != std::string::npos;
  g.restarting = true;
  for (RankSim* other : g.current) w.kill(other->proc, "the launcher restarts its group");
  w.break_meetings("grp/" + std::to_string(g.id) + "/L" + std::to_string(g.launches) + "/", "the group restarts");
  if (g.restarts_left-- <= 0) {
    g.gave_up = true;
    w.note("group " + std::to_string(g.id) + " gave up: " + why);
    return;
  }
  const int64_t delay = g.next_delay >= 0 ? g.next_delay : w.range(5 * kMs, 200 * kMs);
  g.next_delay = -1;
  w.sched.at(w.now() + delay, [this, &g] { launch(g); });
}

// ------------------------------------------------------------- coordinator

Task<void> Sim::coordinator_main(sim::Proc& proc) {
  const int64_t tick = std::clamp<int64_t>(p.heartbeat / 40, 5 * kMs, 50 * kMs);
  int64_t last = -tick;
  for (;;) {
    auto g = w.gate(proc);
    coord.wake = g;
    w.sched.at(w.now() + tick, [this, g] { w.open(g, true, "", w.now()); });
    sim::World::Wait wait{g.get()};
    co_await wait;
    coord.wake.reset();
    try {
      const bool rung = coord.core->rang();
      if (rung || w.now() - last >= tick) {
        last = w.now();
        coord.core->pass(tp(w.now()));
      }
    } catch (const std::exception& e) {
      violate(std::string("the coordinator's pass threw: ") + e.what());
    }
  }
}

void Sim::start_coordinator() {
  w.store.gen++;
  w.store.alive = true;
  w.store.frozen = false;
  w.store.kv.clear();
  coord.lives.push_back(std::make_unique<sim::Proc>());
  sim::Proc& proc = *coord.lives.back();
  proc.name = "coordinator#" + std::to_string(coord.lives.size());
  coord.proc = &proc;
  coord.kv = std::make_unique<SimKv>(w.store);
  RuleOptions rules{std::chrono::milliseconds(p.heartbeat / kMs), p.min_groups};
  const std::string epoch = "epoch-" + std::to_string(seed_) + "-" + std::to_string(coord.lives.size());
  const int64_t seed = 1'800'000'000'000'000 + w.now() + coord.clock_offset;
  coord.core = std::make_unique<CoordinatorCore>(*coord.kv, token, rules, epoch, seed, tp(w.now()),
                                                 [this](const std::string& l) { w.note("coordinator: " + l); });
  w.note("start " + proc.name);
  if (!coord.away.empty() && coord.away.back().second == INT64_MAX) coord.away.back().second = w.now();
  std::vector<Task<void>> t;
  t.push_back(coordinator_main(proc));
  w.start(proc, std::move(t));
}

void Sim::kill_coordinator(const std::string& why) {
  if (!coord.proc || !coord.proc->alive) return;
  w.kill(*coord.proc, why);
  w.store.alive = false;
  w.store.frozen = false;
  coord.wake.reset();
  coord.core.reset();
  ++coordinator_restarts;
  coord.away.emplace_back(w.now(), INT64_MAX);
}

// ------------------------------------------------------------------- setup

RankSim* Sim::random_live_rank() {
  std::vector<RankSim*> live;
  for (auto& g : groups)
    for (RankSim* r : g->current)
      if (r->proc.alive) live.push_back(r);
  if (live.empty()) return nullptr;
  return live[static_cast<size_t>(w.range(0, static_cast<int64_t>(live.size()) - 1))];
}

void Sim::draw() {
  static const int kGroups[] = {1, 2, 2, 3, 3, 4};
  p.groups = kGroups[w.range(0, 5)];
  p.ranks = static_cast<int>(w.range(1, 3));
  p.steps = w.range(6, 20);
  p.heartbeat = w.chance(0.5) ? 1000 * kMs : 500 * kMs;
  p.min_groups = static_cast<int>(w.range(1, p.groups));
  fsdp_timeout = 3 * p.heartbeat;
  w.net_base = w.range(30, 400);
  w.net_spike = w.chance(0.3) ? 0.05 : 0.005;
  w.dup_chance = w.chance(0.3) ? 0.1 : 0.01;
  int64_t longest = 0;
  for (int i = 0; i < p.groups; ++i) {
    p.step_time.push_back(w.range(10 * kMs, 120 * kMs));
    longest = std::max(longest, p.step_time.back());
  }
  p.fault_window = p.steps * longest + 2 * kS;
}

void Sim::schedule_faults(int n) {
  for (int i = 0; i < n; ++i) {
    const int64_t t = w.range(0, p.fault_window);
    const int kind = static_cast<int>(w.range(0, 9));
    w.sched.at(t, [this, kind] {
      const int64_t H = p.heartbeat;
      auto slow_or_fast = [&](GroupSim& g) { g.next_delay = w.chance(0.5) ? w.range(kMs, 100 * kMs) : w.range(H, 4 * H); };
      auto later = [&](int64_t d) { quiet_after = std::max(quiet_after, w.now() + d); };
      switch (kind) {
        case 0:
        case 1: {  // a rank killed
          if (RankSim* r = random_live_rank()) {
            slow_or_fast(r->g);
            w.kill(r->proc, "fault: killed");
            later(4 * H);
          }
          break;
        }
        case 2: {  // a whole group killed (its host lost)
          if (RankSim* r = random_live_rank()) {
            GroupSim& g = r->g;
            slow_or_fast(g);
            for (RankSim* x : g.current) w.kill(x->proc, "fault: the group's host lost");
            later(4 * H);
          }
          break;
        }
        case 3:
        case 4: {  // a rank frozen, then thawed
          if (RankSim* r = random_live_rank()) {
            const int64_t d = w.chance(0.5) ? w.range(H / 10, H) : w.range(H, 2 * fsdp_timeout);
            w.freeze(r->proc);
            r->g.frozen.emplace_back(w.now(), w.now() + d);
            sim::Proc* pp = &r->proc;
            w.sched.at(w.now() + d, [this, pp] { w.thaw(*pp); });
            later(d + 4 * H);
          }
          break;
        }
        case 5:
        case 6: {  // the coordinator killed, restarted at once or later
          if (coord.proc && coord.proc->alive) {
            kill_coordinator("fault: the coordinator killed");
            const int64_t d = w.chance(0.5) ? w.range(kMs, 50 * kMs) : w.range(H / 2, 3 * H);
            if (w.chance(0.3)) coord.clock_offset -= w.range(kS, 3600 * kS);  // restarted on a host whose clock is behind
            // Half the time on a loaded host: every rank reconnects late
            // (up to 60% of the heartbeat timeout, each its own delay).
            const int64_t slow = w.chance(0.5) ? w.range(H / 4, 3 * H / 5) : 0;
            w.sched.at(w.now() + d, [this, slow, H] {
              start_coordinator();
              if (slow > 0) {
                w.slow_connect_until = w.now() + 2 * H;
                w.slow_connect_max = slow;
                w.note("the new coordinator's port answers late (up to " + std::to_string(slow / kMs) + " ms)");
              }
            });
            later(d + 4 * H);
          }
          break;
        }
        case 7: {  // the coordinator frozen (its store with it)
          if (coord.proc && coord.proc->alive && !coord.proc->frozen) {
            const int64_t d = w.range(H / 10, 2 * H);
            w.freeze(*coord.proc);
            w.store.frozen = true;
            coord.away.emplace_back(w.now(), w.now() + d);
            sim::Proc* pp = coord.proc;
            w.sched.at(w.now() + d, [this, pp] {
              if (pp != coord.proc) return;
              w.thaw(*pp);
              w.store.frozen = false;
            });
            later(d + 4 * H);
          }
          break;
        }
        case 8: {  // malformed and foreign values in the store
          if (!w.store.alive) break;
          auto& kv = w.store.kv;
          // Where this coordinator reads registrations (its settings' epoch).
          std::string bad;
          const auto st = kv.count(keys.cfg()) ? parse_settings(kv[keys.cfg()], &bad) : std::nullopt;
          const int64_t era = st ? era_of(st->epoch) : 0;
          const int64_t n = (kv.count(keys.nreg(era)) ? std::stoll(kv[keys.nreg(era)]) : 0);
          static const char* junk[] = {"", "{", "[1,2]", "null", "{\"group\": \"x\"}", "\xff\xfe garbage",
                                       "{\"v\": 99, \"seq\": 1}", "{\"group\": 1e300, \"rank\": -1}"};
          const std::string j = junk[w.range(0, 7)];
          kv[keys.nreg(era)] = std::to_string(n + 3);
          kv[keys.reg(era, n)] = j;
          // A registration of a group nobody runs, with a mailbox and a heartbeat of junk.
          Registration fake{900, 0, 1, 1, "nowhere", 1, "other model", "other"};
          kv[keys.reg(era, n + 1)] = to_json(fake);
          kv[keys.mailbox(900, 1, 0)] = j;
          kv[keys.heartbeat(900, 1, 0)] = "{\"inc\": 1, \"n\": \"seven\"}";
          // n + 2 stays a hole: counted, never written (a rank killed between the two).
          if (RankSim* r = random_live_rank(); r && r->inc >= 0)
            kv[keys.heartbeat(r->g.id, r->inc, r->rank)] = j;  // overwritten at its next beat
          w.note("fault: junk in the store");
          break;
        }
        case 9: {  // a network spike
          const double before = w.net_spike;
          w.net_spike = 0.5;
          w.sched.at(w.now() + H, [this, before] { w.net_spike = before; });
          later(2 * H);
          break;
        }
      }
    });
  }
}

bool Sim::run() {
  draw();
  for (int i = 0; i < p.groups; ++i) {
    groups.push_back(std::make_unique<GroupSim>());
    GroupSim& g = *groups.back();
    g.id = i;
    g.size = p.ranks;
    g.step_time = p.step_time[static_cast<size_t>(i)];
    g.restarts_left = p.max_restarts;
  }
  w.note("seed " + std::to_string(seed_) + ": " + summary());
  w.on_bell = [this] {
    if (coord.wake) w.open(coord.wake, true, "", w.now() + kMs);  // it checks the bell every millisecond or so
  };
  start_coordinator();
  for (auto& g : groups) {
    GroupSim* gp = g.get();
    w.sched.at(w.range(0, 300 * kMs), [this, gp] { launch(*gp); });
  }
  schedule_faults(static_cast<int>(w.range(0, 6)));
  quiet_after = p.fault_window;
  const int64_t limit = p.fault_window + 120 * kS;
  const int64_t bound = 6 * p.heartbeat + 4 * 120 * kMs + 2 * kS;  // a step commits within this once quiet
  // A group may end short of its steps, by design, when it is refused
  // because no live group holds the job's state any more, or when it comes
  // back after every other group finished and a coordinator restarted since
  // (the new one knows nothing of the job: the group waits for --min-groups).
  auto excused = [this](const GroupSim& g) {
    if (g.orphan_refused) return true;
    // The job forgotten: groups finished, the coordinator knows no step of
    // the job (it started after they left it), and no unfinished group
    // knows of any quorum.
    bool any_finished = false;
    for (auto& o : groups) any_finished = any_finished || o->done;
    if (!any_finished || !coord.core) return false;
    const CoordState& cs = coord.core->state();
    if (cs.job_step > 0 || !cs.outcomes.empty()) return false;
    for (auto& o : groups) {
      if (o->done || o->gave_up) continue;
      for (const RankSim* r : o->current)
        if (r->proc.alive && r->side && (r->side->standing().last || r->side->standing().cur)) return false;
    }
    return true;
  };
  int64_t checked = -1;
  bool stuck_excused = false;
  for (;;) {
    if (failed()) break;
    if (w.now() != checked) {  // once per simulated instant
      checked = w.now();
      bool finished = true;
      stuck_excused = true;
      for (auto& g : groups) {
        finished = finished && (g->done || g->gave_up);
        if (!g->done && !g->gave_up) stuck_excused = stuck_excused && excused(*g);
      }
      if (finished) break;
      if (stuck_excused && w.now() > quiet_after) break;
    }
    if (!w.sched.step()) {
      violate("nothing left to run and not every group finished (a hang)");
      break;
    }
    const int64_t settled = quiet_after + fsdp_timeout + 4 * p.heartbeat;
    if (w.now() > settled && w.now() - std::max(last_commit, settled) > bound && !stuck_excused) {
      std::string who;
      for (auto& g : groups)
        if (!g->done && !g->gave_up) who += (who.empty() ? "" : ", ") + std::to_string(g->id);
      violate("no step committed for " + std::to_string((w.now() - std::max(last_commit, settled)) / kMs) +
              " ms after the faults ended (groups " + who + " unfinished)");
    }
    if (w.now() > limit) {
      violate("past the time limit with groups unfinished");
      break;
    }
  }
  for (auto& g : groups)
    if (g->gave_up && !g->orphan_refused)
      violate("group " + std::to_string(g->id) + " gave up: " + g->last_crash);
  // Outcomes: every rank whose state still rests on what it read (alive or
  // finished, and not healed since) read the same outcome of each quorum. A
  // rank that died took what it read with it; one whose state a heal
  // replaced (stopped through a coordinator restart, it read an outcome the
  // new coordinator could not learn) no longer holds it.
  if (!failed())
    for (const auto& [name, reads] : outcome_read) {
      const Read* first = nullptr;
      for (const auto& r : reads) {
        if (!(r.rank->proc.alive || r.rank->finished) || r.rank->state_gen != r.state_gen) continue;
        if (!first) first = &r;
        else if (first->commit != r.commit)
          violate("quorum " + name + ": " + first->rank->proc.name + " read " + (first->commit ? "commit" : "drop") +
                  " and " + r.rank->proc.name + " read " + (r.commit ? "commit" : "drop") + ", and both still hold it");
      }
    }
  // Bounded keys: what the store holds at the end is the current launches'
  // mailboxes and heartbeats, an answer per group, the decisions some rank
  // still waits for and a few fixed keys, whatever the run went through
  // (the junk a fault wrote aside).
  if (!failed() && w.store.alive) {
    size_t keys_left = 0;
    std::string which;
    for (const auto& [k, v] : w.store.kv)
      if (k.find("/900/") == std::string::npos) {
        ++keys_left;
        which += " " + k;
      }
    const size_t bound = 10 + 3 * static_cast<size_t>(p.groups * p.ranks) + 3 * static_cast<size_t>(p.groups);
    if (keys_left > bound)
      violate("the store holds " + std::to_string(keys_left) + " keys at the end, more than " + std::to_string(bound) +
              ":" + which);
  }
  return !failed();
}

std::string Sim::summary() const {
  return std::to_string(p.groups) + " groups of " + std::to_string(p.ranks) + " ranks, " + std::to_string(p.steps) +
         " steps, heartbeat " + std::to_string(p.heartbeat / kMs) + " ms, min groups " + std::to_string(p.min_groups);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t from = 1, count = 200;
  bool verbose = false, quiet = false, one = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> uint64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fsdp_replica_sim: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (a == "--seeds") count = next();
    else if (a == "--from") from = next();
    else if (a == "--seed") {
      from = next();
      count = 1;
      one = true;
    } else if (a == "--verbose") verbose = true;
    else if (a == "--quiet") quiet = true;
    else {
      std::fprintf(stderr, "usage: fsdp_replica_sim [--seeds N] [--from S] [--seed S] [--verbose] [--quiet]\n");
      return 2;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t commits = 0, drops = 0, heals = 0, restarts = 0;
  uint64_t failures = 0;
  for (uint64_t seed = from; seed < from + count; ++seed) {
    Sim s(seed, verbose);
    const bool ok = s.run();
    commits += s.commits;
    drops += s.drops;
    heals += s.heals;
    restarts += s.coordinator_restarts;
    if (!ok) {
      ++failures;
      std::printf("seed %llu FAILED (%s): %s\n  last events:\n", static_cast<unsigned long long>(seed),
                  s.summary().c_str(), s.failure().c_str());
      if (!verbose) s.print_trace();
      std::printf("  replay: fsdp_replica_sim --seed %llu --verbose\n", static_cast<unsigned long long>(seed));
      if (!one && failures >= 3) break;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!quiet || failures)
    std::printf("fsdp_replica_sim: seeds %llu..%llu: %llu violation(s); %lld steps committed, %lld dropped, %lld heals, "
                "%lld coordinator restarts; %.1f s\n",
                static_cast<unsigned long long>(from), static_cast<unsigned long long>(from + count - 1),
                static_cast<unsigned long long>(failures), static_cast<long long>(commits),
                static_cast<long long>(drops), static_cast<long long>(heals), static_cast<long long>(restarts), secs);
  return failures ? 1 : 0;
}
