// fsdp-cpp: the coordinator's rules (see rules.h). Deterministic: the clock
// is an argument, maps are ordered, nothing is read from outside.
#include "replicas/rules.h"

#include <algorithm>
#include <climits>

#include "fsdp/errors.h"

namespace fsdp::replicas {
namespace {

using detail::cat;

std::string ids(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "none" : s;
}

bool in(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

double seconds(Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 1000.0; }

bool all_said_bye(const GroupState& g) {
  if (g.ranks.empty()) return false;
  for (const auto& [r, k] : g.ranks)
    if (!k.gone) return false;
  return true;
}

std::string who(const GroupState& g, int r) {
  auto it = g.ranks.find(r);
  if (it == g.ranks.end()) return cat("group ", g.id, " rank ", r);
  return cat("group ", g.id, " rank ", r, " (host ", it->second.host, ", pid ", it->second.pid, ")");
}

// A vote's reason without Gloo's closing advice.
std::string short_why(const std::string& why) {
  std::string w = why;
  const auto advice = w.find(". This is typically caused by");
  if (advice != std::string::npos) {
    const auto close = w.find(')', advice);
    w = w.substr(0, advice) + (close == std::string::npos ? "" : w.substr(close));
  }
  return w;
}

// Every identity field of `g` against the job's; "" when they agree.
std::string differs(const CoordState::Identity& j, const GroupState& g) {
  std::string d;
  if (j.size != g.size) d += cat("ranks per group: ", g.size, " here, ", j.size, " in group ", j.group, "; ");
  if (j.sharding != g.sharding) d += cat("sharding: ", g.sharding, " here, ", j.sharding, " in group ", j.group, "; ");
  if (j.model != g.model) d += cat("model: ", g.model, " here, ", j.model, " in group ", j.group, "; ");
  if (d.empty()) return "";
  return d + "Expected every replica group to train the same model with the same sharding and the same number of "
             "ranks; start this group like the others";
}

CoordState::Identity identity_of(const GroupState& g) { return {g.size, g.model, g.sharding, g.id}; }

// The job's identity, fixed when its first quorum forms: a member of the
// quorum in flight when there is one (a coordinator that restarted), else
// the identity most of the asking groups share (ties: the lowest group's).
// A registration alone fixes nothing: a group that never asks (a process
// that wrote one registration and left) cannot lock the others out.
CoordState::Identity choose_identity(const CoordState& s, const std::vector<int>& asking) {
  for (int gid : s.q.members) {
    auto it = s.groups.find(gid);
    if (it != s.groups.end() && it->second.inc >= 0) return identity_of(it->second);
  }
  std::map<std::tuple<int, std::string, std::string>, std::pair<int, int>> votes;  // -> (count, -lowest group)
  for (int gid : asking) {
    const GroupState& g = s.groups.at(gid);
    auto& v = votes[{g.size, g.model, g.sharding}];
    if (v.first++ == 0) v.second = -gid;
  }
  auto best = votes.begin();
  for (auto it = votes.begin(); it != votes.end(); ++it)
    if (it->second > best->second) best = it;
  return identity_of(s.groups.at(-best->second.second));
}

void trim(std::map<int64_t, CoordState::Known>& outcomes) {
  while (outcomes.size() > kOutcomes) outcomes.erase(outcomes.begin());
}

}  // namespace

Clock::duration join_window(const RuleOptions& o) {
  return std::max<Clock::duration>(std::chrono::milliseconds(200), o.heartbeat_timeout / 10);
}

// ---------------------------------------------------------------- registry

std::vector<std::string> take_registration(CoordState& s, const Registration& reg, Time now) {
  std::vector<std::string> logs;
  GroupState& G = s.groups[reg.group];
  G.id = reg.group;
  if (reg.inc < G.inc) return logs;  // an earlier launch's
  if (reg.inc > G.inc) {
    // A new launch of the group: what the earlier one held is gone.
    const bool again = G.inc >= 0;
    if (!G.answer_key.empty()) s.garbage.push_back(G.answer_key);  // the earlier launch's last answer
    G.answer_key.clear();
    G.inc = reg.inc;
    G.seen_at = now;
    G.size = reg.size;
    G.model = reg.model;
    G.sharding = reg.sharding;
    G.ranks.clear();
    G.lost = false;
    G.silent.clear();
    G.answered = -1;
    G.whole = false;
    G.stale = false;
    G.step = 0;
    G.refused = s.job ? differs(*s.job, G) : "";
    logs.push_back(cat("group ", G.id, again ? " restarted" : " joined", ": ", G.size,
                       G.size == 1 ? " rank (" : " ranks (", G.sharding, ")",
                       G.refused.empty() ? "" : "; refused: " + G.refused));
  }
  if (reg.size != G.size || reg.model != G.model || reg.sharding != G.sharding) {
    logs.push_back(cat("ignored the registration of group ", G.id, " rank ", reg.rank,
                       ": its size, model or sharding differ from its own launch's first rank's"));
    return logs;
  }
  RankState& R = G.ranks[reg.rank];
  R.host = reg.host;
  R.pid = reg.pid;
  if (R.beat_at == Time{}) R.beat_at = now;
  return logs;
}

namespace {

// What a rank's standing teaches: a coordinator that restarted learns here
// which ids are taken, which step the job reached, which quorum is in
// flight, which outcome a rank read already and which launch of each member
// took part. In steady state it knows all of it, and nothing changes.
int R_index(const GroupState& G, const RankState& R) {
  for (const auto& [r, k] : G.ranks)
    if (&k == &R) return r;
  return -1;
}

void learn(CoordState& s, GroupState& G, RankState& R, const Standing& at, Time now,
           std::vector<std::string>& logs) {
  if (!R.at) {
    // The ranks of a launch report one state; one that differs makes it stale.
    bool first = true;
    for (const auto& [r, k] : G.ranks) first = first && !k.at;
    // A rank first heard after this coordinator recovered (it was stopped
    // through the restart) whose state rests on an outcome this coordinator
    // does not know as it read it: the job may have gone on without that
    // outcome, so its state is no source of anything. It heals.
    const bool stale = !s.recovering && at.whole && at.last && known_outcome(s, *at.last) != at.last_commit;
    if (stale)
      logs.push_back(cat("group ", G.id, " rank ", R_index(G, R), " holds a state from before this coordinator knew the "
                         "job (it was stopped through a coordinator restart): it heals"));
    const bool whole = at.whole && !stale;
    if (stale) G.stale = true;
    if (first) {
      G.whole = whole;
      G.step = at.committed;
    } else {
      if (!whole || at.committed != G.step) G.whole = false;
      G.step = std::min(G.step, at.committed);
    }
    R.at = at;
    if (!whole) R.at->whole = false;
  } else {
    R.at = at;
  }
  if (R.at->whole) s.job_step = std::max(s.job_step, at.committed);
  if (at.last) s.next_q = std::max(s.next_q, at.last->q + 1);
  if (at.cur) {
    s.next_q = std::max(s.next_q, at.cur->q + 1);
    s.next_comm = std::max(s.next_comm, at.cur->comm + 1);
  }
  // Which launch of this group took part in a decided quorum it names.
  for (const auto* ref : {at.last ? &*at.last : nullptr, at.cur ? &*at.cur : nullptr}) {
    if (!ref) continue;
    auto k = s.outcomes.find(ref->q);
    if (k != s.outcomes.end() && k->second.ref == *ref && in(ref->members, G.id)) k->second.launches.emplace(G.id, G.inc);
  }
  // What only a coordinator that restarted needs: the outcome a rank read
  // already, and the quorum in flight. Afterwards a rank that names a quorum
  // this coordinator did not form is stale (frozen through the restart):
  // it learns "expired" and heals.
  if (!s.recovering) {
    if (at.cur && at.cur->q == s.q.id && at.cur == std::optional<QuorumRef>(s.q.ref()) && !s.q.launches.count(G.id) &&
        in(s.q.members, G.id) && !s.q.decided)
      s.q.launches[G.id] = G.inc;
    return;
  }
  if (at.last && !s.outcomes.count(at.last->q)) {
    s.outcomes[at.last->q] = CoordState::Known{*at.last, at.last_commit, {}};
    trim(s.outcomes);
  }
  if (at.last && at.last->q > s.q.id) {
    // Decided by the coordinator before this one.
    s.q = QuorumState{};
    s.q.id = at.last->q;
    s.q.era = at.last->era;
    s.q.comm = at.last->comm;
    s.q.step = at.last->step;
    s.q.members = at.last->members;
    s.q.committed = at.last_commit;
    s.q.decided_at = now;
  }
  if (at.cur && at.cur->q > s.q.id) {
    const QuorumRef& c = *at.cur;
    s.q = QuorumState{};
    s.q.id = c.q;
    s.q.era = c.era;
    s.q.comm = c.comm;
    s.q.step = c.step;
    s.q.members = c.members;
    s.q.decided = false;
    logs.push_back(cat("quorum ", c.q, " (step ", c.step, ", groups ", ids(c.members),
                       ") was in flight: learned from group ", G.id));
  }
  if (at.cur && at.cur->q == s.q.id && *at.cur == s.q.ref() && in(s.q.members, G.id) && !s.q.launches.count(G.id))
    s.q.launches[G.id] = G.inc;
}

}  // namespace

bool take_message(CoordState& s, int g, int r, const RankMessage& m, Time now, std::vector<std::string>& logs) {
  auto git = s.groups.find(g);
  if (git == s.groups.end() || m.inc > git->second.inc) return false;  // its registration comes first
  GroupState& G = git->second;
  if (m.inc < G.inc) return true;  // an earlier launch's leftover
  auto rit = G.ranks.find(r);
  if (rit == G.ranks.end()) return false;
  RankState& R = rit->second;
  if (R.msg && m.seq <= R.msg->seq) return true;  // seen already (a duplicate, or older)
  R.msg = m;
  if (m.kind == Kind::BYE) R.gone = true;
  learn(s, G, R, m.at, now, logs);
  return true;
}

bool take_report(CoordState& s, int g, int r, const Report& rep, Time now, std::vector<std::string>& logs) {
  auto git = s.groups.find(g);
  if (git == s.groups.end() || rep.inc > git->second.inc) return false;
  GroupState& G = git->second;
  if (rep.inc < G.inc) return true;  // another launch's (a leftover, or a zombie of an earlier launch)
  auto rit = G.ranks.find(r);
  if (rit == G.ranks.end()) return false;
  RankState& R = rit->second;
  if (rep.n != R.beat) {
    R.beat = rep.n;
    R.beat_at = now;
  }
  learn(s, G, R, rep.at, now, logs);
  return true;
}

// ---------------------------------------------------------------- liveness

Liveness liveness(const CoordState& s, Time now) {
  Liveness l;
  for (const auto& [gid, G] : s.groups) {
    if (G.inc < 0 || G.ranks.empty()) continue;
    std::string silent;
    for (int r = 0; r < G.size; ++r) {
      auto it = G.ranks.find(r);
      if (it == G.ranks.end()) {
        // Never heard from: silent since its launch was first seen.
        if (now - G.seen_at > s.o.heartbeat_timeout)
          silent += cat(silent.empty() ? "" : ", ", "rank ", r, " never registered in ", seconds(now - G.seen_at), " s");
        continue;
      }
      const RankState& k = it->second;
      if (!k.gone && now - k.beat_at > s.o.heartbeat_timeout)
        silent += cat(silent.empty() ? "" : ", ", "rank ", r, " (host ", k.host, ", pid ", k.pid, ") silent for ",
                      seconds(now - k.beat_at), " s");
    }
    const bool bye = all_said_bye(G) && static_cast<int>(G.ranks.size()) == G.size;
    const bool lost = !silent.empty() || bye;
    if (lost && !G.lost)
      l.changes.push_back({gid, true, silent,
                           bye ? cat("group ", gid, " left (every rank said bye)") : cat("group ", gid, " lost: ", silent)});
    if (!lost && G.lost)
      l.changes.push_back({gid, false, "", cat("group ", gid, " is back: its heartbeats move again (it will heal)")});
  }
  return l;
}

void apply(CoordState& s, const Liveness& l) {
  for (const auto& c : l.changes) {
    GroupState& G = s.groups[c.group];
    G.lost = c.lost;
    if (c.lost) G.silent = c.silent;
    else G.whole = false;  // what it holds may be stale
  }
}

void forgive(CoordState& s, Clock::duration d) {
  s.started += d;
  for (auto& [gid, G] : s.groups) {
    G.seen_at += d;
    for (auto& [r, k] : G.ranks) k.beat_at += d;
  }
  s.q.decided_at += d;
  if (s.q.first_failure != Time{}) s.q.first_failure += d;
}

std::optional<bool> known_outcome(const CoordState& s, const QuorumRef& ref) {
  auto it = s.outcomes.find(ref.q);
  if (it == s.outcomes.end() || !(it->second.ref == ref)) return std::nullopt;
  return it->second.commit;
}

bool recovery_done(const CoordState& s, Time now) {
  if (!s.recovering) return true;
  const auto elapsed = now - s.started;
  if (elapsed >= s.o.heartbeat_timeout) return true;
  // Every live rank says where it stands within a heartbeat period of the
  // coordinator's start (its heartbeat finds the new epoch); a moment more
  // for the connection.
  const auto period = std::max<Clock::duration>(s.o.heartbeat_timeout / 10, std::chrono::milliseconds(5));
  if (elapsed < period + std::chrono::milliseconds(250)) return false;
  auto complete = [&](int gid) {
    auto it = s.groups.find(gid);
    if (it == s.groups.end() || it->second.inc < 0) return false;
    for (int r = 0; r < it->second.size; ++r) {
      auto k = it->second.ranks.find(r);
      if (k == it->second.ranks.end() || !k->second.at) return false;
    }
    return true;
  };
  for (const auto& [gid, G] : s.groups)
    if (!G.lost && !complete(gid)) return false;
  if (!s.q.decided)
    for (int gid : s.q.members)
      if (!complete(gid)) return false;
  return true;
}

// ------------------------------------------------------------------ decide

Verdict decide(const CoordState& s, Time now) {
  Verdict v;
  const QuorumState& q = s.q;
  if (q.decided || q.id < 0 || s.recovering) return v;
  if (const auto known = known_outcome(s, q.ref())) {
    // A rank read it from the coordinator before this one: that outcome stands.
    v.what = *known ? Verdict::COMMIT : Verdict::DROP;
    if (!*known) v.why = "dropped by the coordinator before a restart";
    v.log = cat("quorum ", q.id, " (step ", q.step, ", groups ", ids(q.members), "): ",
                *known ? "committed" : "dropped", " before the coordinator restarted, as a rank read it");
    return v;
  }
  std::string absent, failed, missing;
  int failures = 0, votes = 0;
  bool all_in = true, only_ended = true;
  for (int gid : q.members) {
    auto git = s.groups.find(gid);
    if (git == s.groups.end() || git->second.inc < 0) {
      absent += cat(absent.empty() ? "" : "; ", "group ", gid, " did not report since the coordinator restarted");
      all_in = only_ended = false;
      continue;
    }
    const GroupState& G = git->second;
    auto bound = q.launches.find(gid);
    if (bound == q.launches.end() || bound->second != G.inc) {
      absent += cat(absent.empty() ? "" : "; ", "group ", gid,
                    bound == q.launches.end() ? " (a new launch) did not take part" : " restarted during the step");
      all_in = only_ended = false;
      continue;
    }
    for (int r = 0; r < G.size; ++r) {
      auto it = G.ranks.find(r);
      const bool voted = it != G.ranks.end() && it->second.msg && it->second.msg->kind == Kind::VOTE &&
                         it->second.msg->at.cur && *it->second.msg->at.cur == q.ref();
      if (!voted) {
        all_in = false;
        missing += (missing.empty() ? "" : ", ") + who(G, r);
      } else {
        ++votes;
        if (!it->second.msg->ok && failures++ == 0)
          failed = cat("group ", gid, " rank ", r, " failed: ", short_why(it->second.msg->why));
      }
    }
    if (G.lost) {
      only_ended = only_ended && all_said_bye(G);
      absent += cat(absent.empty() ? "" : "; ", "group ", gid,
                    all_said_bye(G)    ? " left (its run ended)"
                    : G.silent.empty() ? " was lost during the step"
                                       : " was lost during the step: " + G.silent);
    }
  }
  if (failures > 1) failed += cat(" (and ", failures - 1, " more rank", failures > 2 ? "s" : "", ")");
  if (all_in) {
    // Every rank voted: the votes decide, whatever happened since.
    v.what = failures == 0 ? Verdict::COMMIT : Verdict::DROP;
    v.why = failed;
  } else if (!absent.empty()) {
    v.what = Verdict::DROP;
    v.why = absent + (failed.empty() ? "" : "; " + failed);
  } else if (failures > 0) {
    // The ranks that fail see only their neighbour's link break; the one
    // that never votes is the one that went away: give it a moment.
    const Time first = q.first_failure == Time{} ? now : q.first_failure;
    v.first_failure = q.first_failure == Time{};
    if (now - first < join_window(s.o)) return v;
    v.what = Verdict::DROP;
    v.why = "no vote from " + missing + "; " + failed;
  } else {
    return v;
  }
  if (v.what == Verdict::DROP)
    v.log = cat("quorum ", q.id, " (step ", q.step, ", groups ", ids(q.members), ")",
                votes == 0 && only_ended ? " not taken: " : " dropped: ", v.why);
  return v;
}

std::optional<Decision> apply(CoordState& s, const Verdict& v, Time now) {
  if (v.first_failure) s.q.first_failure = now;
  if (v.what == Verdict::WAIT) return std::nullopt;
  QuorumState& q = s.q;
  q.decided = true;
  q.committed = v.what == Verdict::COMMIT;
  q.decided_at = now;
  s.outcomes[q.id] = CoordState::Known{q.ref(), q.committed, q.launches};
  trim(s.outcomes);
  if (q.committed) {
    s.job_step = std::max(s.job_step, q.step + 1);
    for (int gid : q.members) {
      auto it = s.groups.find(gid);
      auto bound = q.launches.find(gid);
      if (it == s.groups.end() || bound == q.launches.end() || bound->second != it->second.inc) continue;
      it->second.whole = true;
      it->second.step = q.step + 1;
    }
  }
  return Decision{q.id, q.era, q.comm, q.step, q.committed, false, v.why};
}

// -------------------------------------------------------------------- form

std::optional<Request> request_of(const CoordState& s, const GroupState& g) {
  Request req;
  bool any = false;
  for (int r = 0; r < g.size; ++r) {
    auto it = g.ranks.find(r);
    if (it == g.ranks.end() || !it->second.msg) return std::nullopt;
    const RankMessage& m = *it->second.msg;
    int64_t round = 0, step = 0;
    if (m.kind == Kind::REQ) {
      round = m.round;
      step = m.at.committed;
    } else if (m.kind == Kind::VOTE) {
      // A vote asks for the round after its outcome: the step after it when
      // it committed (the rank applies it), the same step otherwise.
      if (*m.at.cur == s.q.ref() && !s.q.decided) return std::nullopt;
      round = m.round;
      step = m.at.committed + (known_outcome(s, *m.at.cur).value_or(false) ? 1 : 0);
    } else {
      return std::nullopt;
    }
    if (any && round != req.round) return std::nullopt;
    req.lo = any ? std::min(req.lo, step) : step;
    req.hi = any ? std::max(req.hi, step) : step;
    req.round = round;
    any = true;
  }
  if (!any) return std::nullopt;
  return req;
}

bool released(const CoordState& s, const RankMessage& m) {
  if (!m.at.last) return true;  // it took part in no quorum
  const QuorumRef& last = *m.at.last;
  auto k = s.outcomes.find(last.q);
  if (k == s.outcomes.end() || !(k->second.ref == last)) return true;  // forgotten: nothing left to protect
  for (int gid : last.members) {
    auto bound = k->second.launches.find(gid);
    auto git = s.groups.find(gid);
    if (bound == k->second.launches.end() || git == s.groups.end()) continue;
    const GroupState& G = git->second;
    if (G.inc != bound->second || G.lost) continue;  // relaunched or lost: it heals, whatever it read
    for (int r = 0; r < G.size; ++r) {
      auto it = G.ranks.find(r);
      if (it == G.ranks.end()) return false;
      const RankState& R = it->second;
      if (R.gone) continue;
      if (!R.at || !R.at->last || R.at->last->q < last.q) return false;  // not past it yet
    }
  }
  return true;
}

Formation form(const CoordState& s, Time now) {
  Formation f;
  const QuorumState& q = s.q;
  if (s.recovering) return f;
  // Farewells: a group whose every rank said bye (the same round) may go
  // once each of them is released; ranks that never registered with this
  // coordinator (they left before it started) do not hold the others once
  // the group counts as lost.
  for (const auto& [gid, G] : s.groups) {
    if (G.inc < 0 || G.ranks.empty() || (static_cast<int>(G.ranks.size()) < G.size && !G.lost)) continue;
    int64_t round = -1;
    bool all = true;
    for (const auto& [r, k] : G.ranks) {
      if (!k.msg || k.msg->kind != Kind::BYE || (round >= 0 && k.msg->round != round) || !released(s, *k.msg)) {
        all = false;
        break;
      }
      round = k.msg->round;
    }
    if (all && round > G.answered) {
      Answer a;
      a.farewell = true;
      f.replies.push_back({gid, round, a});
      continue;
    }
    // Some ranks said bye while the others still ask for an earlier round
    // (a coordinator that restarted lost the answer their group-mates read
    // and left on): the group is leaving, and they are told so.
    int64_t bye = -1;
    bool released_all = true;
    std::set<int64_t> asked;
    for (const auto& [r, k] : G.ranks) {
      if (!k.msg) continue;
      if (k.msg->kind == Kind::BYE) {
        bye = std::max(bye, k.msg->round);
        released_all = released_all && released(s, *k.msg);
      } else if (k.msg->kind == Kind::REQ || (k.msg->kind == Kind::VOTE && !(*k.msg->at.cur == s.q.ref() && !s.q.decided))) {
        asked.insert(k.msg->round);
      }
    }
    if (bye < 0 || !released_all) continue;
    for (int64_t r : asked)
      if (r < bye && r > G.answered) {
        Answer a;
        a.farewell = true;
        f.replies.push_back({gid, r, a});
      }
  }
  if (!q.decided) return f;
  std::vector<int> asking, pending;
  std::map<int, int64_t> step_of, round_of;
  std::map<int, bool> agreed;
  for (const auto& [gid, G] : s.groups) {
    if (G.inc < 0 || G.lost || static_cast<int>(G.ranks.size()) < G.size) continue;
    const auto req = request_of(s, G);
    if (!req || req->round <= G.answered) continue;
    asking.push_back(gid);
    round_of[gid] = req->round;
    step_of[gid] = req->lo;
    agreed[gid] = req->lo == req->hi;
  }
  if (asking.empty()) return f;
  // The job's identity: fixed already, or by the quorum this pass forms (a
  // group that differs is refused then, not before: the groups it differs
  // from may not all have asked yet).
  const CoordState::Identity job = s.job ? *s.job : choose_identity(s, asking);
  std::vector<Formation::Reply> refusals;
  std::vector<std::string> refused_logs;
  for (int gid : asking) {
    const std::string why = differs(job, s.groups.at(gid));
    if (why.empty()) {
      pending.push_back(gid);
      continue;
    }
    Answer a;
    a.refused = why;
    refusals.push_back({gid, round_of[gid], a});
    refused_logs.push_back(cat("group ", gid, " refused: ", why));
  }
  if (s.job) {
    f.replies = refusals;
    f.logs = refused_logs;
  }
  if (pending.empty()) return f;
  const bool first = s.next_q == 0;
  // Wait for the members of the previous quorum that still hold its state
  // (a group that restarted or thawed since joins when it asks). After a
  // dropped step only for a moment: the survivors ask again at once, and a
  // group that does not is the one that failed.
  const bool waited_enough = !q.committed && now - q.decided_at > join_window(s.o);
  for (int gid : q.members) {
    auto it = s.groups.find(gid);
    if (it == s.groups.end()) continue;
    const GroupState& G = it->second;
    if (!waited_enough && !G.lost && G.whole && !in(pending, gid) && !all_said_bye(G)) return f;
  }
  if (first && static_cast<int>(pending.size()) < s.o.min_groups) return f;
  int64_t top = 0;
  for (int gid : pending) top = std::max(top, step_of[gid]);
  // Askers all behind the job (fresh, restarted, thawed, resumed from an
  // older checkpoint) wait for a live group that holds a later step and has
  // not asked yet: they heal from it. A quorum of the laggards alone would
  // commit again a step the job committed with other members.
  if (top < s.job_step)
    for (const auto& [gid, G] : s.groups)
      if (!in(pending, gid) && G.inc >= 0 && !G.lost && G.whole && G.step > top && !all_said_bye(G)) return f;
  if (top == 0 && s.job_step > 0) {
    const std::string why = cat(
        "this job committed ", s.job_step, " steps, and no live group holds them (the groups that did left or were "
        "lost). Expected a group with the job's state to heal from; start this group from a checkpoint "
        "(ReplicaOptions::start_step; gpt: --resume), or start a new coordinator for a new job");
    for (int gid : pending) {
      Answer a;
      a.refused = why;
      f.replies.push_back({gid, round_of[gid], a});
      f.logs.push_back(cat("group ", gid, " refused: ", why));
    }
    return f;
  }
  std::vector<int> sources;
  for (int gid : pending)
    if (agreed[gid] && step_of[gid] == top && s.groups.at(gid).whole) sources.push_back(gid);
  if (sources.empty()) {
    // Nobody holds a committed state (the job's first step, or every group
    // restarted): the lowest group at the top step is the state. Not a
    // stale one: its state rests on an outcome the job does not have.
    for (int gid : pending)
      if (agreed[gid] && step_of[gid] == top && !s.groups.at(gid).stale) {
        sources.push_back(gid);
        break;
      }
    if (sources.empty()) {
      const std::string why = cat(
          "its state rests on a step this coordinator does not know as committed (the group was stopped through a "
          "coordinator restart), and no group with the job's state is here to heal from. Start it from a checkpoint");
      for (int gid : pending)
        if (s.groups.at(gid).stale) {
          Answer a;
          a.refused = why;
          f.replies.push_back({gid, round_of[gid], a});
          f.logs.push_back(cat("group ", gid, " refused: ", why));
        }
      if (!f.replies.empty()) return f;
    }
  }
  if (sources.empty()) {
    f.stuck = cat("no group holds step ", top, " whole (their ranks disagree): restore from a checkpoint");
    return f;
  }
  QuorumState n;
  n.id = s.next_q;
  n.era = s.era;
  n.step = top;
  n.members = pending;
  n.decided = false;
  for (int gid : pending) n.launches[gid] = s.groups.at(gid).inc;
  // The links stay when the same launches of the same groups go on.
  const bool same = q.committed && n.members == q.members && n.launches == q.launches;
  n.comm = same ? q.comm : s.next_comm;
  std::vector<int> healing;
  for (int gid : pending)
    if (!in(sources, gid)) healing.push_back(gid);
  if (n.members != q.members || !healing.empty() || !q.committed)
    f.logs.push_back(cat("quorum ", n.id, ": step ", n.step, ", groups ", ids(n.members),
                         healing.empty() ? std::string() : "; healing " + ids(healing) + " from " + ids(sources)));
  for (int gid : pending) {
    Answer a;
    a.quorum = n.ref();
    a.sources = sources;
    a.heal = !in(sources, gid);
    f.replies.push_back({gid, round_of[gid], a});
  }
  f.next = n;
  if (!s.job) {
    f.job = job;
    f.replies.insert(f.replies.begin(), refusals.begin(), refusals.end());
    f.logs.insert(f.logs.begin(), refused_logs.begin(), refused_logs.end());
  }
  return f;
}

Formation reanswer(const CoordState& s) {
  Formation f;
  const QuorumState& q = s.q;
  if (s.recovering || q.decided || q.id < 0) return f;
  // Every member holds the quorum's step whole (as far as it reported).
  for (int gid : q.members) {
    auto it = s.groups.find(gid);
    if (it == s.groups.end() || it->second.inc < 0 || !it->second.whole || it->second.step != q.step) return f;
  }
  for (int gid : q.members) {
    if (q.launches.count(gid)) continue;
    const GroupState& G = s.groups.at(gid);
    if (G.lost || static_cast<int>(G.ranks.size()) < G.size) continue;
    const auto req = request_of(s, G);
    if (!req || req->round <= G.answered || req->lo != q.step || req->hi != q.step) continue;
    Answer a;
    a.quorum = q.ref();
    a.sources = q.members;
    a.heal = false;
    f.replies.push_back({gid, req->round, a});
    f.logs.push_back(cat("quorum ", q.id, ": group ", gid, " asked for it again (it had not read its answer when the "
                         "coordinator restarted)"));
  }
  return f;
}

void apply(CoordState& s, const Formation& f) {
  if (f.job && !s.job) s.job = f.job;
  for (const auto& r : f.replies) {
    GroupState& G = s.groups[r.group];
    G.answered = std::max(G.answered, r.round);
    G.refused = r.answer.refused;
    // A member answered with the quorum in flight (reanswer): its launch takes part.
    if (r.answer.refused.empty() && !r.answer.farewell && !f.next && r.answer.quorum == s.q.ref())
      s.q.launches[r.group] = G.inc;
  }
  if (f.next) {
    if (f.next->comm == s.next_comm) ++s.next_comm;
    s.next_q = f.next->id + 1;
    s.q = *f.next;
  }
  s.stuck = f.stuck;
}

// ----------------------------------------------------------------- cleanup

Cleanup cleanup(const CoordState& s, const Keys& keys) {
  Cleanup c;
  // The decisions some rank waits for: its latest message is a vote on a
  // decided quorum (it has not read the outcome yet, or is reading it).
  std::map<std::pair<int64_t, int64_t>, QuorumRef> waited;  // by (era, quorum)
  for (const auto& [gid, G] : s.groups)
    for (const auto& [r, k] : G.ranks)
      if (k.msg && k.msg->kind == Kind::VOTE && !(*k.msg->at.cur == s.q.ref() && !s.q.decided))
        waited.emplace(std::make_pair(k.msg->at.cur->era, k.msg->at.cur->q), *k.msg->at.cur);
  for (const auto& [id, ref] : waited) {
    if (s.published.count(id)) continue;
    // Never published by this coordinator (it restarted since), or deleted:
    // the outcome when known, else "expired" (the rank applies nothing).
    Decision d{ref.q, ref.era, ref.comm, ref.step, false, true, ""};
    if (const auto o = known_outcome(s, ref)) {
      d.commit = *o;
      d.expired = false;
    }
    c.publish.emplace_back(keys.decision(ref.era, ref.q), d);
  }
  for (const auto& [id, key] : s.published)
    if (!waited.count(id) && !(id == std::make_pair(s.q.era, s.q.id) && !s.q.decided)) c.erase.push_back(key);
  c.erase.insert(c.erase.end(), s.garbage.begin(), s.garbage.end());
  return c;
}

void apply(CoordState& s, const Cleanup& c) {
  for (auto it = s.published.begin(); it != s.published.end();)
    it = std::find(c.erase.begin(), c.erase.end(), it->second) != c.erase.end() ? s.published.erase(it) : std::next(it);
  for (const auto& [key, d] : c.publish) s.published[{d.era, d.q}] = key;
  s.garbage.clear();
}

}  // namespace fsdp::replicas
