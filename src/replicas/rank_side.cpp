// fsdp-cpp: a rank's side of the replica-group protocol (see rank_side.h).
#include "replicas/rank_side.h"

#include <algorithm>

namespace fsdp::replicas {

HealPlan heal_plan(const QuorumView& v, int group, int rank) {
  HealPlan p;
  std::vector<int> healing;
  for (int g : v.members)
    if (std::find(v.sources.begin(), v.sources.end(), g) == v.sources.end()) healing.push_back(g);
  if (healing.empty() || v.sources.empty()) return p;
  p.any = true;
  p.source = v.sources[static_cast<size_t>(rank) % v.sources.size()];
  auto index_of = [&](int g) {
    return static_cast<int>(std::find(v.members.begin(), v.members.end(), g) - v.members.begin());
  };
  if (group == p.source)
    for (int g : healing) p.send_to.push_back(index_of(g));
  if (v.heal) p.receive_from = index_of(p.source);
  return p;
}

RankSide::RankSide(GroupIdentity id, int64_t start_step) : id_(std::move(id)) {
  at_.committed = start_step;
  at_.whole = false;  // a fresh launch: what it holds is not a state the job committed (as far as it knows)
}

Registration RankSide::registration() const {
  return Registration{id_.group, id_.rank,  id_.incarnation, id_.group_size, id_.host,
                      id_.pid,   id_.model, id_.sharding,    id_.first_launch};
}

RankMessage RankSide::message(Kind k) {
  RankMessage m;
  m.seq = ++seq_;
  m.kind = k;
  m.inc = id_.incarnation;
  m.at = at_;
  m.round = round_;
  last_ = m;
  return m;
}

RankMessage RankSide::hello() { return message(Kind::HELLO); }

std::optional<RankMessage> RankSide::ask() {
  if (asked_) {
    asked_ = false;
    return std::nullopt;
  }
  ++round_;
  return message(Kind::REQ);
}

RankSide::Joined RankSide::on_answer(const Answer& a) {
  Joined j;
  if (!a.refused.empty()) {
    j.refused = a.refused;
    return j;
  }
  if (a.farewell) {
    j.leaving = true;
    return j;
  }
  QuorumView v;
  v.id = a.quorum.q;
  v.era = a.quorum.era;
  v.comm = a.quorum.comm;
  v.step = a.quorum.step;
  v.members = a.quorum.members;
  v.sources = a.sources;
  v.heal = a.heal;
  const auto at = std::find(v.members.begin(), v.members.end(), id_.group);
  if (at == v.members.end()) {
    j.internal = "the answer's quorum does not name this group";
    return j;
  }
  v.index = static_cast<int>(at - v.members.begin());
  if (!v.heal && at_.committed != v.step) {
    j.internal = "the coordinator counts this group a source of step " + std::to_string(v.step) +
                 ", and it holds step " + std::to_string(at_.committed);
    return j;
  }
  at_.cur = v.ref();
  at_.cur_sources = v.sources;
  view_ = v;
  j.view = v;
  return j;
}

void RankSide::healed() {
  if (!view_) return;
  at_.committed = view_->step;
  at_.whole = true;
  at_.suspect = false;
}

RankMessage RankSide::vote(bool ok, const std::string& why) {
  ++round_;
  asked_ = true;
  RankMessage m = message(Kind::VOTE);
  m.ok = ok;
  m.why = why;
  last_ = m;
  return m;
}

std::string RankSide::decision_key(const Keys& keys) const {
  return view_ ? keys.decision(view_->era, view_->id) : keys.decision(0, -1);
}

Outcome RankSide::on_decision(const Decision& d) {
  Outcome o;
  if (!view_) {
    o.expired = true;
    return o;
  }
  const QuorumView& v = *view_;
  if (d.expired || d.q != v.id || d.era != v.era || d.comm != v.comm || d.step != v.step) {
    // Not this quorum's outcome as the rank knows it: apply nothing, and
    // count the state stale (the next quorum heals it).
    o.expired = true;
    at_.whole = false;
  } else {
    o.commit = d.commit;
    o.why = d.why;
    if (d.commit) {
      at_.committed = v.step + 1;
      at_.whole = true;
    }
    at_.last = v.ref();
    at_.last_commit = d.commit;
  }
  at_.cur.reset();
  at_.cur_sources.clear();
  view_.reset();
  return o;
}

RankMessage RankSide::resync() {
  if (last_.kind == Kind::VOTE && !view_) {
    // It read the vote's outcome: what it waits for now is the round the
    // vote asked for.
    RankMessage m = message(Kind::REQ);
    return m;
  }
  RankMessage m = last_;
  m.seq = ++seq_;
  m.at = at_;
  last_ = m;
  return m;
}

RankMessage RankSide::bye() {
  ++round_;
  asked_ = false;
  return message(Kind::BYE);
}

}  // namespace fsdp::replicas
