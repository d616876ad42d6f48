// fsdp-cpp: the coordinator's rules (see rules.h): whether the quorum in
// flight commits, which groups form the next one, farewells, cleanup.
// Deterministic: the clock is an argument, maps are ordered, nothing is read
// from outside.
#include "replicas/rules.h"

#include <algorithm>
#include <climits>
#include <set>

#include "replicas/rules_detail.h"

namespace fsdp::replicas {
namespace {

using detail::all_said_bye;
using detail::cat;
using detail::differs;
using detail::ids;
using detail::in;
using detail::trim;

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

}  // namespace

Clock::duration join_window(const RuleOptions& o) {
  return std::max<Clock::duration>(std::chrono::milliseconds(200), o.heartbeat_timeout / 10);
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
      it->second.back = false;
      it->second.step = q.step + 1;
    }
  }
  return Decision{q.id, q.era, q.comm, q.step, q.committed, false, v.why};
}

// -------------------------------------------------------------------- form

namespace {

// What one rank's last message asks for, when it asks: the round of its
// request and the step it will hold by then. A vote asks for the round after
// its outcome: the step after it when it committed (the rank applies it), the
// same step otherwise; not while its quorum is still being decided.
struct Ask {
  int64_t round = 0, step = 0;
};
std::optional<Ask> ask_of(const CoordState& s, const RankMessage& m) {
  if (m.kind == Kind::REQ) return Ask{m.round, m.at.committed};
  if (m.kind != Kind::VOTE || !m.at.cur) return std::nullopt;
  if (*m.at.cur == s.q.ref() && !s.q.decided) return std::nullopt;
  return Ask{m.round, m.at.committed + (known_outcome(s, *m.at.cur).value_or(false) ? 1 : 0)};
}

}  // namespace

std::optional<Request> request_of(const CoordState& s, const GroupState& g) {
  Request req;
  bool any = false;
  for (int r = 0; r < g.size; ++r) {
    auto it = g.ranks.find(r);
    if (it == g.ranks.end() || !it->second.msg) return std::nullopt;
    const auto a = ask_of(s, *it->second.msg);
    if (!a) return std::nullopt;
    const int64_t round = a->round, step = a->step;
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
    // A round below the one answered too: a rank stopped through a
    // coordinator restart asks one whose answer the dead coordinator wrote
    // (seed 49678).
    for (int64_t r : asked)
      if (r < bye && r != G.answered) {
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
  // Every asker refused, for one reason.
  auto refuse_all = [&](const std::string& why) {
    for (int gid : pending) {
      Answer a;
      a.refused = why;
      f.replies.push_back({gid, round_of[gid], a});
      f.logs.push_back(cat("group ", gid, " refused: ", why));
    }
    return f;
  };
  if (top == 0 && s.job_step > 0)
    return refuse_all(cat(
        "this job committed ", s.job_step, " steps, and no live group holds them (the groups that did left or were "
        "lost). Expected a group with the job's state to heal from; start this group from a checkpoint "
        "(ReplicaOptions::start_step; gpt: --resume), or start a new coordinator for a new job"));
  // A group that held a later step and left because its run ended (a
  // fresh one was refused above): the job is over, and laggards would only
  // train again, alone, steps it committed (a model of their own under the
  // job's name).
  for (const auto& [gid, G] : s.groups)
    if (!in(pending, gid) && G.inc >= 0 && G.whole && G.step > top && all_said_bye(G))
      return refuse_all(cat("the job's run ended: group ", gid, " finished it at step ", G.step,
                            " and left, and this group holds step ", top,
                            ", behind it. Expected to join while a group with the job's state trains; its final "
                            "state is the one group ", gid, " left"));
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
  n.sources = sources;
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

namespace {

// The request of a group split around quorum `ref`: its ranks inside the
// step (their heartbeats stand in `ref` and they have not voted in it; they
// send this coordinator nothing until they vote) and the others, who missed
// its answer and still ask, all in one round, from the state the ranks
// inside hold: `ref`'s step for a source, the group's own for a group that
// heals in it. Nothing when any rank does something else; a rank that voted
// in `ref` missed nothing.
std::optional<Request> split_around(const CoordState& s, const GroupState& G, const QuorumRef& ref, bool source) {
  auto voted_in = [&](const RankState& R) { return R.msg && R.msg->at.cur && *R.msg->at.cur == ref; };
  std::optional<Request> req;
  std::optional<int64_t> held;  // the step the ranks inside hold
  int64_t inside_round = -1;
  bool inside = false;
  for (int r = 0; r < G.size; ++r) {
    auto it = G.ranks.find(r);
    if (it == G.ranks.end() || voted_in(it->second)) return std::nullopt;
    const RankState& R = it->second;
    // A suspect rank's word is no evidence of where its group stands (seed
    // 24727): the group restarts by its collectives' timeout instead.
    if ((R.at && R.at->suspect) || (R.msg && R.msg->at.suspect)) return std::nullopt;
    if (R.at && R.at->cur && *R.at->cur == ref) {
      if (held && *held != R.at->committed) return std::nullopt;
      held = R.at->committed;
      inside = true;
      if (R.msg) inside_round = std::max(inside_round, R.msg->round);
      continue;
    }
    // Its request: a REQ, or its vote of the quorum before (it read that
    // outcome from this coordinator and asks with the vote).
    const auto a = R.msg ? ask_of(s, *R.msg) : std::nullopt;
    if (!a || (req && (a->round != req->round || a->step != req->lo))) return std::nullopt;
    if (!req) req = Request{};
    req->round = a->round;
    req->lo = req->hi = a->step;
  }
  // The ranks inside asked at most the round the others ask (`ref` answered it).
  if (!inside || !req || inside_round > req->round || req->lo != *held || (source && req->lo != ref.step))
    return std::nullopt;
  return req;
}

}  // namespace

Formation reanswer(const CoordState& s) {
  Formation f;
  if (s.recovering) return f;
  auto answer = [&](int gid, int64_t round, const QuorumRef& ref, const std::vector<int>& sources, const char* why) {
    Answer a;
    a.quorum = ref;
    a.sources = sources;
    a.heal = !in(sources, gid);
    f.replies.push_back({gid, round, a});
    f.logs.push_back(cat("quorum ", ref.q, ": group ", gid, " asked for it again (", why, ")"));
  };
  std::set<int> answered;
  const QuorumState& q = s.q;
  // The quorum in flight, to the members that missed its answer: with the
  // sources its answers named (a rank inside it reported them), or, not
  // knowing them, when every member holds its step whole (then every member
  // is one).
  bool all_whole = !q.decided && q.id >= 0;
  for (int gid : q.members) {
    auto it = s.groups.find(gid);
    all_whole = all_whole && it != s.groups.end() && it->second.inc >= 0 && it->second.whole && it->second.step == q.step;
  }
  const std::vector<int> sources = !q.sources.empty() ? q.sources : all_whole ? q.members : std::vector<int>{};
  for (int gid : !q.decided && q.id >= 0 && !sources.empty() ? q.members : std::vector<int>{}) {
    const auto git = s.groups.find(gid);
    if (git == s.groups.end() || git->second.inc < 0) continue;
    const GroupState& G = git->second;
    // A launch bound to it already (one of its ranks read the answer and
    // reported it) whose other ranks still ask: they missed it, and their
    // group-mates wait for them inside the step. Another launch: not its.
    const auto bound = q.launches.find(gid);
    if (bound != q.launches.end() && bound->second != G.inc) continue;
    if (G.lost || static_cast<int>(G.ranks.size()) < G.size) continue;
    // Every rank asks again (none read the answer): only where nobody heals.
    auto req = all_whole ? request_of(s, G) : std::nullopt;
    if (req && (req->lo != q.step || req->hi != q.step)) req.reset();
    if (!req && bound != q.launches.end()) req = split_around(s, G, q.ref(), in(sources, gid));
    if (!req || req->round <= G.answered) continue;
    answer(gid, req->round, q.ref(), sources, "it had not read its answer when the coordinator restarted");
    answered.insert(gid);
  }
  // A quorum dropped while a group stood split around it (a coordinator
  // restart between its ranks' readings of the answer, then a member lost):
  // the ranks inside the step cannot leave their group's collectives until
  // the others join them. Answered the dropped quorum, those do what their
  // mates do in it (heal, train), vote, read the drop, and the whole group
  // asks again together.
  for (const auto& [gid, G] : s.groups) {
    if (answered.count(gid) || G.lost || G.inc < 0 || !G.refused.empty() || static_cast<int>(G.ranks.size()) < G.size)
      continue;
    const RankState* in_step = nullptr;
    for (const auto& [r, R] : G.ranks)
      if (R.at && R.at->cur) in_step = &R;
    if (!in_step) continue;
    const QuorumRef& ref = *in_step->at->cur;
    const std::vector<int>& named = in_step->at->cur_sources;
    if (known_outcome(s, ref) != std::optional<bool>(false) || !in(ref.members, gid)) continue;
    // Not knowing the sources, only where this group is one and all are.
    const std::vector<int>& src = named.empty() ? ref.members : named;
    const auto req = split_around(s, G, ref, in(src, gid) || named.empty());
    if (!req || req->round <= G.answered) continue;
    answer(gid, req->round, ref, src, "dropped while its ranks were split: the ones that missed it join the others in it");
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
    } else if (s.recovering) {
      // Not yet "expired": a rank this coordinator has not heard since it
      // started may have read the outcome (its group-mate, say), and its
      // report comes before the recovery ends.
      continue;
    }
    c.publish.emplace_back(keys.decision(ref.era, ref.q), d);
  }
  // The current quorum's decision stays while it is current, read or not:
  // its members that are still connecting its links watch it (ReplicaLink)
  // and give up at once when it is a drop.
  for (const auto& [id, key] : s.published)
    if (!waited.count(id) && id != std::make_pair(s.q.era, s.q.id)) c.erase.push_back(key);
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
