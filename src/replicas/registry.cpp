// fsdp-cpp: the coordinator's registry (see rules.h): registrations, messages
// and heartbeats into CoordState, liveness, recovery. Deterministic: the
// clock is an argument, maps are ordered, nothing is read from outside.
#include <algorithm>

#include "replicas/rules.h"
#include "replicas/rules_detail.h"

namespace fsdp::replicas {

using detail::all_said_bye;
using detail::cat;
using detail::differs;
using detail::ids;
using detail::in;
using detail::seconds;
using detail::trim;

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
    G.back = false;
    G.first = reg.first;
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
int rank_of(const GroupState& G, const RankState& R) {
  for (const auto& [r, k] : G.ranks)
    if (&k == &R) return r;
  return -1;
}

void learn(CoordState& s, GroupState& G, RankState& R, const Standing& at, Time now,
           std::vector<std::string>& logs) {
  // A rank first heard after this coordinator recovered (it was stopped
  // through the restart) whose state rests on an outcome this coordinator
  // does not know as it read it: the job may have gone on without that
  // outcome, so its state is no source of anything. It heals. So does a
  // rank that says it was held up while its coordinator changed (suspect):
  // it may have been lost, and the job gone on, before this coordinator.
  const bool stale =
      at.whole && (at.suspect || (!s.recovering && at.last && known_outcome(s, *at.last) != at.last_commit));
  auto held_up = [&] {
    return cat("group ", G.id, " rank ", rank_of(G, R), " was held up past the heartbeat timeout while the "
               "coordinator restarted: it may have been lost, so it heals");
  };
  if (!R.at) {
    // The ranks of a launch report one state; one that differs makes it stale.
    bool first = true;
    for (const auto& [r, k] : G.ranks) first = first && !k.at;
    if (stale)
      logs.push_back(at.suspect ? held_up()
                                : cat("group ", G.id, " rank ", rank_of(G, R), " holds a state from before this coordinator "
                                      "knew the job (it was stopped through a coordinator restart): it heals"));
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
    if (stale) R.at->whole = false;
    if (stale && at.suspect && !G.stale) {
      G.stale = true;
      G.whole = false;
      logs.push_back(held_up());
    }
    // The ranks' reports caught up with each other (one of them read, from
    // this coordinator, an outcome the coordinator before it decided and
    // its mates had read already): once every rank holds the same committed
    // step whole, so does the group. Without this, the group stays "not
    // whole" at the older step for the rest of this coordinator's life, and
    // a rank of it that missed the quorum in flight is never answered it
    // again while its mate waits for it inside the step.
    // Not a group that came back after it was lost: the job may have gone
    // on without it, even to the same step number (its holders lost, the
    // laggards went on from an earlier step), and it heals (seed 2814).
    if (!G.stale && !G.back && static_cast<int>(G.ranks.size()) == G.size) {
      bool agree = true;
      for (const auto& [r, k] : G.ranks) agree = agree && k.at && k.at->whole && k.at->committed == R.at->committed;
      if (agree && (!G.whole || R.at->committed > G.step)) {
        G.whole = true;
        G.step = R.at->committed;
      }
    }
  }
  // How far the job got, as far as any rank knows, stale or not: a
  // coordinator never forgets it, so no fresh launch starts the job again.
  if (at.whole) s.job_step = std::max(s.job_step, at.committed);
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
  // The sources of the quorum in flight, as its answers named them (a
  // coordinator that learned the quorum from a rank that had not said them).
  if (at.cur && s.q.sources.empty() && !at.cur_sources.empty() && *at.cur == s.q.ref()) s.q.sources = at.cur_sources;
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
  // An outcome a rank read is a fact, whoever reports it; a quorum in
  // flight is not, from a suspect rank: it may have been counted lost and
  // the job decided without it (only a dead coordinator knew). What it names
  // in flight is learned from the others, or not at all.
  if (at.suspect) return;
  if (at.cur && at.cur->q > s.q.id) {
    const QuorumRef& c = *at.cur;
    s.q = QuorumState{};
    s.q.id = c.q;
    s.q.era = c.era;
    s.q.comm = c.comm;
    s.q.step = c.step;
    s.q.members = c.members;
    s.q.sources = at.cur_sources;
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
    if (c.lost) {
      G.silent = c.silent;
    } else {
      G.whole = false;  // what it holds may be stale: the job may have gone on without it
      G.back = true;
    }
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

namespace {
// Every live rank says where it stands within a heartbeat period of the
// coordinator's start (its heartbeat finds the new epoch); a moment more
// for the connection.
Clock::duration listen_at_least(const CoordState& s) {
  const auto period = std::max<Clock::duration>(s.o.heartbeat_timeout / 10, std::chrono::milliseconds(5));
  return period + std::chrono::milliseconds(250);
}
}  // namespace

bool launches_open(const CoordState& s, Time now) { return !s.recovering || now - s.started >= listen_at_least(s); }

bool recovery_done(const CoordState& s, Time now) {
  if (!s.recovering) return true;
  const auto elapsed = now - s.started;
  if (elapsed >= s.o.heartbeat_timeout) return true;
  if (elapsed < listen_at_least(s)) return false;
  auto complete = [&](int gid) {
    auto it = s.groups.find(gid);
    if (it == s.groups.end() || it->second.inc < 0) return false;
    for (int r = 0; r < it->second.size; ++r) {
      auto k = it->second.ranks.find(r);
      if (k == it->second.ranks.end() || !k->second.at) return false;
    }
    return true;
  };
  // A coordinator that heard no rank that knows the job (only fresh
  // launches, or nobody) knows nothing yet, not "the job starts": ranks
  // reconnecting to a restarted coordinator on a loaded host may take longer
  // than the period. Had it ended here, the ranks that hold the job's state
  // would be taken for ones frozen through the restart (stale), and a fresh
  // launch for the start of the job. Unless fresh launches all in their
  // launcher's first round, as many as the first quorum waits for, say it
  // is the job's start (a relaunch says it is one), a new job's first
  // quorum waits the timeout.
  bool knows = false;
  int starting = 0;
  bool only_first = true;
  for (const auto& [gid, G] : s.groups) {
    if (G.inc < 0 || G.lost) continue;
    only_first = only_first && G.first;
    ++starting;
    for (const auto& [r, k] : G.ranks)
      knows = knows || (k.at && !k.at->suspect && (k.at->whole || k.at->committed > 0 || k.at->last || k.at->cur));
  }
  if (!knows && !(only_first && starting >= std::max(1, s.o.min_groups))) return false;
  for (const auto& [gid, G] : s.groups)
    if (!G.lost && !complete(gid)) return false;
  // The members of the latest quorum known (in flight or decided) hold the
  // job's newest state: each is waited for, heard of or not.
  if (s.q.id >= 0)
    for (int gid : s.q.members)
      if (!complete(gid)) return false;
  return true;
}

}  // namespace fsdp::replicas
