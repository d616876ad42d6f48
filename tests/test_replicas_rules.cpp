// fsdp-cpp tests: the replica groups' protocol and rules in one process —
// every parser refuses what is malformed with a reason (never a throw), the
// coordinator's pass survives junk in every key, and the rules' decisions
// on hand-built snapshots. The same code runs under faults in the simulator
// (tests/sim/replica_sim.cpp); real processes in tests/test_replicas.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "replicas/coordinator.h"
#include "replicas/protocol.h"
#include "replicas/rank_side.h"
#include "replicas/rules.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

using namespace fsdp::replicas;

Time at_ms(int64_t ms) { return Time{} + std::chrono::milliseconds(ms); }

// An in-memory store for the coordinator's pass.
class MapKv final : public Kv {
 public:
  std::map<std::string, std::string> kv;
  void set(const std::string& k, const std::string& v) override { kv[k] = v; }
  std::vector<std::optional<std::string>> get(const std::vector<std::string>& keys) override {
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) {
      auto it = kv.find(k);
      out.push_back(it == kv.end() ? std::nullopt : std::optional<std::string>(it->second));
    }
    return out;
  }
  int64_t add(const std::string& k, int64_t d) override {
    auto it = kv.find(k);
    const int64_t v = (it == kv.end() ? 0 : std::stoll(it->second)) + d;
    kv[k] = std::to_string(v);
    return v;
  }
  void erase(const std::string& k) override { kv.erase(k); }
};

TEST(ReplicaProtocol, EveryMalformedValueParsesToAReasonNeverAThrow) {
  const std::vector<std::string> junk = {
      "", "{", "[1,2]", "null", "\"text\"", "\xff\xfe\x00 bytes", "{\"v\": 2}", "{\"v\": 99, \"seq\": 1}",
      R"({"v":2,"seq":1,"kind":"vote","inc":1,"committed":0,"whole":false,"cur":null,"last":null,"last_commit":false,"round":2,"ok":true,"why":""})",
      R"({"v":2,"seq":1,"kind":"req","inc":1,"committed":-5,"whole":false,"cur":null,"last":null,"last_commit":false,"round":1})",
      R"({"v":2,"seq":1,"kind":"req","inc":1,"committed":0,"whole":"yes","cur":null,"last":null,"last_commit":false,"round":1})",
      R"({"v":2,"seq":1,"kind":"req","inc":1,"committed":0,"whole":false,"cur":{"q":1,"era":1,"comm":1,"step":1,"members":[2,1]},"last":null,"last_commit":false,"round":1})",
      R"({"v":2,"seq":1,"kind":"jump","inc":1,"committed":0,"whole":false,"cur":null,"last":null,"last_commit":false,"round":1})",
      R"({"v":2,"seq":1,"kind":"req","inc":1,"committed":0,"whole":false,"cur":null,"cur_sources":[1,"x"],"last":null,"last_commit":false,"round":1})",
      R"({"group":1e300,"rank":0})", R"({"group":-1})", R"({"inc":1,"n":"seven"})",
      R"({"refused":7})", R"({"q":1,"era":1,"comm":1,"step":1,"members":[],"sources":[],"heal":false})",
      std::string(1 << 20, '['),
  };
  for (const auto& text : junk) {
    std::string why;
    EXPECT_NO_THROW({
      EXPECT_FALSE(parse_message(text, &why)) << text.substr(0, 80);
      EXPECT_FALSE(why.empty());
      why.clear();
      EXPECT_FALSE(parse_registration(text, &why)) << text.substr(0, 80);
      EXPECT_FALSE(parse_report(text, &why)) << text.substr(0, 80);
      EXPECT_FALSE(parse_answer(text, &why)) << text.substr(0, 80);
      EXPECT_FALSE(parse_decision(text, &why)) << text.substr(0, 80);
      EXPECT_FALSE(parse_settings(text, &why)) << text.substr(0, 80);
    });
  }
  // What a rank writes parses back to the same.
  RankMessage m;
  m.seq = 3;
  m.kind = Kind::VOTE;
  m.inc = 17;
  m.at.committed = 4;
  m.at.whole = true;
  m.at.cur = QuorumRef{5, 99, 2, 4, {0, 2}};
  m.at.cur_sources = {2};
  m.at.suspect = true;
  m.round = 6;
  m.ok = false;
  m.why = "a peer died";
  std::string why;
  const auto back = parse_message(to_json(m), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->at.cur, m.at.cur);
  EXPECT_EQ(back->at.cur_sources, m.at.cur_sources);
  EXPECT_TRUE(back->at.suspect);
  EXPECT_EQ(back->why, m.why);
  EXPECT_EQ(back->round, 6);
  std::string other = to_json(m);
  other.replace(other.find("\"v\":2"), 5, "\"v\":3");
  EXPECT_FALSE(parse_message(other, &why));
  EXPECT_NE(why.find("of protocol 3, expected 2"), std::string::npos) << why;
}

TEST(ReplicaCoordinator, JunkInEveryKeyIsLoggedOnceAndIgnored) {
  MapKv kv;
  std::vector<std::string> logs;
  RuleOptions o{std::chrono::milliseconds(1000), 1};
  CoordinatorCore core(kv, "", o, "epoch-1", 1000, at_ms(0), [&](const std::string& l) { logs.push_back(l); });
  const Keys& keys = core.keys();
  const int64_t era = era_of("epoch-1");
  kv.kv[keys.nreg(era)] = "5";
  kv.kv[keys.reg(era, 0)] = "{not json";
  kv.kv[keys.reg(era, 1)] = to_json(Registration{7, 0, 1, 1, "h", 1, "m", "s"});
  // reg(2): a hole, counted and never written (its rank killed between the
  // two); reg(3): of a rank past its group's size; reg(4): a group that
  // registers after the hole, and is not held up by it.
  kv.kv[keys.reg(era, 3)] = R"({"group":8,"rank":3,"inc":1,"size":2,"host":"h","pid":1,"model":"m","sharding":"s"})";
  kv.kv[keys.reg(era, 4)] = to_json(Registration{9, 0, 2, 1, "h", 2, "m", "s"});
  kv.kv[keys.mailbox(7, 1, 0)] = R"({"v":99})";
  kv.kv[keys.heartbeat(7, 1, 0)] = "\xff";
  for (int i = 0; i < 5; ++i) EXPECT_NO_THROW(core.pass(at_ms(100 * i)));
  size_t ignored = 0;
  for (const auto& l : logs) ignored += l.rfind("ignored ", 0) == 0;
  EXPECT_EQ(ignored, 4u) << ::testing::PrintToString(logs);  // each once: reg 0, reg 3, the mailbox, the heartbeat
  EXPECT_EQ(kv.kv.count(keys.reg(era, 0)), 0u) << "a registration is deleted once read";
  EXPECT_NE(std::find(logs.begin(), logs.end(), "group 9 joined: 1 rank (s)"), logs.end())
      << ::testing::PrintToString(logs);
  // The hole is read again later: its rank (slow, not dead) writes it.
  kv.kv[keys.reg(era, 2)] = to_json(Registration{10, 0, 3, 1, "h", 3, "m", "s"});
  // A registration counted with an earlier coordinator (its rank was
  // stopped through the restart, and wrote when it resumed) lands where this
  // one never reads: it cannot take the place of a later one.
  kv.kv[keys.reg(era_of("epoch-0"), 5)] = to_json(Registration{11, 0, 4, 1, "h", 4, "m", "s"});
  core.pass(at_ms(600));
  EXPECT_NE(std::find(logs.begin(), logs.end(), "group 10 joined: 1 rank (s)"), logs.end())
      << ::testing::PrintToString(logs);
  EXPECT_EQ(std::find(logs.begin(), logs.end(), "group 11 joined: 1 rank (s)"), logs.end())
      << ::testing::PrintToString(logs);
}

// Two groups of two ranks in quorum 0 (era 5), as the coordinator formed it.
CoordState two_groups_in_a_quorum() {
  CoordState s;
  s.o.heartbeat_timeout = std::chrono::milliseconds(1000);
  s.recovering = false;
  s.era = 5;
  for (int g = 0; g < 2; ++g) {
    take_registration(s, Registration{g, 0, 10 + g, 2, "h", 1, "m", "FULL_SHARD"}, at_ms(0));
    take_registration(s, Registration{g, 1, 10 + g, 2, "h", 2, "m", "FULL_SHARD"}, at_ms(0));
  }
  s.q.id = 0;
  s.q.era = 5;
  s.q.comm = 0;
  s.q.step = 3;
  s.q.members = {0, 1};
  s.q.launches = {{0, 10}, {1, 11}};
  s.q.decided = false;
  s.next_q = 1;
  s.next_comm = 1;
  return s;
}

void vote(CoordState& s, int g, int r, bool ok, int64_t seq, Time now) {
  RankMessage m;
  m.seq = seq;
  m.kind = Kind::VOTE;
  m.inc = s.groups.at(g).inc;
  m.at.committed = 3;
  m.at.whole = true;
  m.at.cur = s.q.ref();
  m.round = 2;
  m.ok = ok;
  m.why = ok ? "" : "the link broke";
  std::vector<std::string> logs;
  ASSERT_TRUE(take_message(s, g, r, m, now, logs));
}

// A rank's heartbeat: its launch, the step it holds, whether whole, and the
// quorum it stands in.
Report report(int64_t inc, int64_t committed, bool whole, std::optional<QuorumRef> cur) {
  Report r;
  r.inc = inc;
  r.n = 1;
  r.at.committed = committed;
  r.at.whole = whole;
  r.at.cur = std::move(cur);
  return r;
}

// A rank's request for the next round: its launch, the step it holds (whole)
// and the round.
RankMessage request(int64_t inc, int64_t committed, int64_t round) {
  RankMessage m;
  m.seq = 1;
  m.kind = Kind::REQ;
  m.inc = inc;
  m.at.committed = committed;
  m.at.whole = true;
  m.round = round;
  return m;
}

// A coordinator restarted between writing a group's answer and the read of
// one of its ranks: the other rank read it (and reported the quorum: its
// launch is bound) and waits inside the step for its group-mate, which asks
// the new coordinator again. It is answered the same quorum, not left to
// wait until the collectives' timeout restarts the group; a launch other
// than the bound one is not.
TEST(ReplicaRules, ARankThatMissedTheAnswerItsGroupMateReadIsAnsweredTheSameQuorum) {
  CoordState s = two_groups_in_a_quorum();
  for (int g = 0; g < 2; ++g) {
    s.groups[g].whole = true;
    s.groups[g].step = 3;
  }
  for (int r = 0; r < 2; ++r) {
    const RankMessage m = request(11, 3, 2);
    std::vector<std::string> logs;
    ASSERT_TRUE(take_message(s, 1, r, m, at_ms(10), logs));
  }
  const Formation f = reanswer(s);
  ASSERT_EQ(f.replies.size(), 1u) << ::testing::PrintToString(f.logs);
  EXPECT_EQ(f.replies[0].group, 1);
  EXPECT_EQ(f.replies[0].round, 2);
  EXPECT_TRUE(f.replies[0].answer.quorum == s.q.ref());
  // The rank inside the step has sent this coordinator nothing (it computes;
  // only its heartbeat says it stands in the quorum): its group-mate is
  // answered all the same.
  s.groups[1].ranks[0].msg.reset();
  Standing in;
  in.committed = 3;
  in.whole = true;
  in.cur = s.q.ref();
  s.groups[1].ranks[0].at = in;
  const Formation g = reanswer(s);
  ASSERT_EQ(g.replies.size(), 1u) << ::testing::PrintToString(g.logs);
  EXPECT_EQ(g.replies[0].group, 1);
  EXPECT_EQ(g.replies[0].round, 2);
  s.q.launches[1] = 7;  // bound to an earlier launch of group 1: not this one's quorum
  EXPECT_TRUE(reanswer(s).replies.empty());
}

// Found by the simulator (seed 1072 once its group collectives met only at
// the same collective): a coordinator restarted while group 1's rank 0 had
// not read the previous quorum's outcome. Rank 1's first report stood at
// step 4 inside quorum 0, rank 0's at step 3: the group was "not whole". Rank
// 0 then read the outcome from the new coordinator and asks with its vote:
// once the reports agree the group is whole at step 4 again, and rank 0 is
// answered the quorum its mate waits in. Without both, the group waited for
// the collectives' timeout and restarted.
TEST(ReplicaRules, AGroupWhoseRanksCaughtUpAfterARestartIsWholeAgainAndItsLateRankIsAnswered) {
  CoordState s = two_groups_in_a_quorum();
  s.q.step = 4;
  s.q.launches.erase(1);
  QuorumRef before = s.q.ref();
  before.q = -1;  // the quorum before, as its ranks report it
  before.step = 3;
  s.outcomes[-1] = CoordState::Known{before, true, {}};
  s.groups[0].whole = true;
  s.groups[0].step = 4;
  std::vector<std::string> logs;
  Report inside = report(11, 4, true, s.q.ref());
  inside.at.last = before;
  inside.at.last_commit = true;
  Report behind = report(11, 3, true, before);
  s.recovering = true;
  ASSERT_TRUE(take_report(s, 1, 1, inside, at_ms(5), logs));
  ASSERT_TRUE(take_report(s, 1, 0, behind, at_ms(5), logs));
  EXPECT_FALSE(s.groups[1].whole);  // the two reports differ
  s.recovering = false;
  EXPECT_TRUE(reanswer(s).replies.empty());
  // Rank 0 read the previous quorum's commit and asks with its vote.
  RankMessage v;
  v.seq = 1;
  v.kind = Kind::VOTE;
  v.inc = 11;
  v.round = 6;
  v.ok = true;
  v.at = behind.at;
  ASSERT_TRUE(take_message(s, 1, 0, v, at_ms(6), logs));
  Report caught_up = behind;
  caught_up.n = 2;
  caught_up.at.committed = 4;
  caught_up.at.cur.reset();
  caught_up.at.last = before;
  caught_up.at.last_commit = true;
  ASSERT_TRUE(take_report(s, 1, 0, caught_up, at_ms(7), logs));
  EXPECT_TRUE(s.groups[1].whole);
  EXPECT_EQ(s.groups[1].step, 4);
  ASSERT_TRUE(take_report(s, 1, 1, inside, at_ms(7), logs));  // binds its launch (it stands in the quorum)
  const Formation f = reanswer(s);
  ASSERT_EQ(f.replies.size(), 1u) << ::testing::PrintToString(f.logs);
  EXPECT_EQ(f.replies[0].group, 1);
  EXPECT_EQ(f.replies[0].round, 6);
  EXPECT_TRUE(f.replies[0].answer.quorum == s.q.ref());
}

// Found by the simulator (seed 1728): group 2's ranks 1 and 2 read quorum 3's
// answer and went into the step; the coordinator restarted before rank 0
// read it, then group 0 was lost and quorum 3 dropped. The next quorum does
// not take group 2 (it never asked whole), and its ranks inside the step
// wait for rank 0. Rank 0 is answered the dropped quorum: it trains it too,
// votes, reads the drop, and the group asks again together.
TEST(ReplicaRules, ARankThatMissedAQuorumDroppedSinceJoinsItsMatesInsideIt) {
  CoordState s = two_groups_in_a_quorum();
  s.q.decided = true;
  s.q.committed = false;
  s.outcomes[0] = CoordState::Known{s.q.ref(), false, s.q.launches};
  std::vector<std::string> logs;
  Report inside = report(11, 3, true, s.q.ref());
  ASSERT_TRUE(take_report(s, 1, 1, inside, at_ms(5), logs));
  RankMessage m = request(11, 3, 2);
  ASSERT_TRUE(take_message(s, 1, 0, m, at_ms(5), logs));
  const Formation f = reanswer(s);
  ASSERT_EQ(f.replies.size(), 1u) << ::testing::PrintToString(f.logs);
  EXPECT_EQ(f.replies[0].group, 1);
  EXPECT_EQ(f.replies[0].round, 2);
  EXPECT_TRUE(f.replies[0].answer.quorum == s.q.ref());
  EXPECT_FALSE(f.replies[0].answer.heal);
  // Answered once: the same round is not answered again.
  apply(s, f);
  EXPECT_TRUE(reanswer(s).replies.empty());
  // A quorum that committed is not answered to a rank that never voted in
  // it (it cannot have committed without that rank): nothing to join.
  CoordState c = two_groups_in_a_quorum();
  c.q.decided = true;
  c.q.committed = true;
  c.outcomes[0] = CoordState::Known{c.q.ref(), true, c.q.launches};
  ASSERT_TRUE(take_report(c, 1, 1, inside, at_ms(5), logs));
  ASSERT_TRUE(take_message(c, 1, 0, m, at_ms(5), logs));
  EXPECT_TRUE(reanswer(c).replies.empty());
}

// Found by the simulator (seed 25157): the split around a quorum in which
// the split group heals. Its rank inside the step reports the sources its
// answer named; the new coordinator learns them with the quorum and answers
// the rank that missed it the same heal, from the same source.
TEST(ReplicaRules, ARankThatMissedAHealsAnswerIsAnsweredTheSameHeal) {
  CoordState s = two_groups_in_a_quorum();
  s.q = QuorumState{};
  s.recovering = true;
  s.groups[0].whole = true;
  s.groups[0].step = 3;
  QuorumRef q{0, 5, 0, 3, {0, 1}};
  std::vector<std::string> logs;
  Report source = report(10, 3, true, q);
  source.at.cur_sources = {0};
  ASSERT_TRUE(take_report(s, 0, 0, source, at_ms(1), logs));
  ASSERT_TRUE(take_report(s, 0, 1, source, at_ms(1), logs));
  Report healing = source;
  healing.inc = 11;
  healing.at.committed = 0;
  healing.at.whole = false;
  ASSERT_TRUE(take_report(s, 1, 0, healing, at_ms(1), logs));
  EXPECT_TRUE(s.q.ref() == q);
  EXPECT_EQ(s.q.sources, std::vector<int>({0}));
  RankMessage m;
  m.seq = 1;
  m.kind = Kind::REQ;
  m.inc = 11;
  m.at.committed = 0;
  m.round = 2;
  ASSERT_TRUE(take_message(s, 1, 1, m, at_ms(2), logs));
  s.recovering = false;
  ASSERT_TRUE(take_report(s, 1, 0, healing, at_ms(3), logs));  // binds group 1's launch
  const Formation f = reanswer(s);
  ASSERT_EQ(f.replies.size(), 1u) << ::testing::PrintToString(f.logs);
  EXPECT_EQ(f.replies[0].group, 1);
  EXPECT_EQ(f.replies[0].round, 2);
  EXPECT_TRUE(f.replies[0].answer.quorum == q);
  EXPECT_TRUE(f.replies[0].answer.heal);
  EXPECT_EQ(f.replies[0].answer.sources, std::vector<int>({0}));
  // A rank that asks from another state than its mates inside hold is not
  // theirs to join: nothing.
  m.seq = 2;
  m.at.committed = 2;
  ASSERT_TRUE(take_message(s, 1, 1, m, at_ms(4), logs));
  EXPECT_TRUE(reanswer(s).replies.empty());
}

// Found by the chaos test, then by the simulator once a restarted
// coordinator's port could answer late (seed 2134): the ranks reconnected
// after the recovery's short window, so the new coordinator ended it having
// heard nobody; every rank then counted as stopped through the restart
// (stale) and was refused, the groups relaunched fresh, and the first of
// them started the job again at step 0, alone; the others healed from it.
// A coordinator that heard no rank knowing the job keeps listening for the
// heartbeat timeout; it waits for every member of the latest quorum it
// learned of; and it never forgets how far the job got, from any rank.
TEST(ReplicaRules, ARestartedCoordinatorListensForTheJobsRanksAndNeverStartsTheJobAgain) {
  CoordState s;
  s.o.heartbeat_timeout = std::chrono::milliseconds(1000);
  s.era = 9;
  s.started = at_ms(0);
  std::vector<std::string> logs;
  EXPECT_FALSE(recovery_done(s, at_ms(400))) << "nobody heard yet";
  // Group 1, relaunched fresh, is heard first: it knows nothing of the job.
  for (int r = 0; r < 2; ++r) {
    take_registration(s, Registration{1, r, 21, 2, "h", 1 + r, "m", "FULL_SHARD"}, at_ms(100));
    ASSERT_TRUE(take_report(s, 1, r, report(21, 0, false, std::nullopt), at_ms(100), logs));
  }
  EXPECT_FALSE(recovery_done(s, at_ms(400))) << "only a fresh launch heard";
  EXPECT_FALSE(recovery_done(s, at_ms(999)));
  // Group 0 reports the job's state: step 240, whole, after quorum 249 of
  // groups 0, 1, 2 committed.
  const QuorumRef last{249, 3, 7, 239, {0, 1, 2}};
  auto group0_reports_step_240 = [&](CoordState& c, Time when) {
    for (int r = 0; r < 2; ++r) {
      take_registration(c, Registration{0, r, 20, 2, "h", 3 + r, "m", "FULL_SHARD"}, when);
      Report rep = report(20, 240, true, std::nullopt);
      rep.at.last = last;
      rep.at.last_commit = true;
      ASSERT_TRUE(take_report(c, 0, r, rep, when, logs));
    }
  };
  group0_reports_step_240(s, at_ms(450));
  EXPECT_EQ(s.job_step, 240);
  EXPECT_FALSE(recovery_done(s, at_ms(500))) << "group 2, a member of quorum 249, was not heard yet";
  EXPECT_TRUE(recovery_done(s, at_ms(1000))) << "the heartbeat timeout bounds the wait";
  s.recovering = false;
  // Group 1's fresh launch asks: it is not the job's state, and it waits for
  // group 0, which holds step 240 whole.
  for (int r = 0; r < 2; ++r) {
    RankMessage m = request(21, 0, 1);
    m.at.whole = false;
    ASSERT_TRUE(take_message(s, 1, r, m, at_ms(1001), logs));
  }
  Formation f = form(s, at_ms(1001));
  EXPECT_FALSE(f.next) << ::testing::PrintToString(f.logs);

  // A job's start: fresh launches in their launcher's first round, as many
  // as the first quorum waits for, end the listening after its moment; and
  // new launches take a number once the live ranks had that moment.
  CoordState u;
  u.o.heartbeat_timeout = std::chrono::milliseconds(1000);
  u.o.min_groups = 2;
  u.started = at_ms(0);
  EXPECT_FALSE(launches_open(u, at_ms(300)));
  EXPECT_TRUE(launches_open(u, at_ms(350)));
  for (int g = 0; g < 2; ++g) {
    take_registration(u, Registration{g, 0, 30 + g, 1, "h", 1 + g, "m", "FULL_SHARD", /*first=*/true}, at_ms(360));
    ASSERT_TRUE(take_report(u, g, 0, report(30 + g, 0, false, std::nullopt), at_ms(360), logs));
    EXPECT_EQ(recovery_done(u, at_ms(400)), g == 1) << "the first quorum waits for 2 groups";
  }

  // A coordinator that did end its recovery before the ranks that hold the
  // job reported: they are stale (it cannot know what they hold), yet the
  // job's step is known from them, so a fresh launch alone is refused
  // rather than started at step 0.
  CoordState t;
  t.o.heartbeat_timeout = std::chrono::milliseconds(1000);
  t.era = 9;
  t.recovering = false;
  group0_reports_step_240(t, at_ms(0));
  EXPECT_TRUE(t.groups[0].stale);
  EXPECT_EQ(t.job_step, 240);
  for (int r = 0; r < 2; ++r) {
    take_registration(t, Registration{1, r, 21, 2, "h", 1 + r, "m", "FULL_SHARD"}, at_ms(0));
    RankMessage m = request(21, 0, 1);
    m.at.whole = false;
    ASSERT_TRUE(take_message(t, 1, r, m, at_ms(1), logs));
  }
  f = form(t, at_ms(1));
  EXPECT_FALSE(f.next) << ::testing::PrintToString(f.logs);
  bool refused = false;
  for (const auto& l : f.logs) refused = refused || l.find("group 1 refused: this job committed 240 steps") == 0;
  EXPECT_TRUE(refused) << ::testing::PrintToString(f.logs);
}

// Found by the simulator (seeds 7389, 29612): group 0 was frozen inside
// quorum 4 past the heartbeat timeout and counted lost; group 2 read the
// commit, trained on alone and finished the run; then the coordinator
// restarted twice. The newest one learned quorum 4 "in flight" from group 0
// alone, dropped it (group 2 never reported), and group 0 trained the job's
// last steps again with a fresh launch: two final models. A rank knows when
// its own process was held up: held up while its coordinator changed, it is
// suspect, teaches the new coordinator nothing, and heals (or is refused
// when nobody holds the job's state).
TEST(ReplicaRules, ARankHeldUpWhileItsCoordinatorChangedTeachesNothingAndHeals) {
  GroupIdentity id;
  id.group = 0;
  id.group_size = 1;
  id.incarnation = 20;
  RankSide side(id, 0);
  side.held_up();
  side.reached(false, /*after=*/false);  // a reply that waited through the stall
  side.reached(true, true);
  EXPECT_TRUE(side.standing().suspect) << "the stall was not cleared by a reply from before it";
  GroupIdentity id2 = id;
  RankSide other(id2, 0);
  other.held_up();
  other.reached(false, true);  // the coordinator that watched the stall judges it
  other.reached(true, true);
  EXPECT_FALSE(other.standing().suspect);
  side.reached(true, true);
  EXPECT_TRUE(side.standing().suspect) << "until it heals";

  CoordState s;
  s.o.heartbeat_timeout = std::chrono::milliseconds(1000);
  s.era = 9;
  s.started = at_ms(0);
  std::vector<std::string> logs;
  const QuorumRef q4{4, 3, 1, 4, {0, 1, 2}};
  take_registration(s, Registration{0, 0, 20, 1, "h", 1, "m", "FULL_SHARD"}, at_ms(10));
  Report rep = report(20, 4, true, q4);
  rep.at.suspect = true;
  ASSERT_TRUE(take_report(s, 0, 0, rep, at_ms(10), logs));
  EXPECT_EQ(s.q.id, -1) << "the quorum it names in flight is not learned from it";
  EXPECT_TRUE(s.groups[0].stale);
  EXPECT_FALSE(s.groups[0].whole);
  EXPECT_EQ(s.job_step, 4) << "how far the job got is still learned";
  EXPECT_FALSE(recovery_done(s, at_ms(500))) << "a suspect rank is no rank that knows the job";
  bool said = false;
  for (const auto& l : logs) said = said || l.find("group 0 rank 0 was held up past the heartbeat timeout") == 0;
  EXPECT_TRUE(said) << ::testing::PrintToString(logs);
  // A fresh launch of group 1 and the suspect group ask: nobody holds step
  // 4 as this coordinator can know it, so both are refused, loudly.
  ASSERT_TRUE(recovery_done(s, at_ms(1000)));
  s.recovering = false;
  take_registration(s, Registration{1, 0, 21, 1, "h", 2, "m", "FULL_SHARD"}, at_ms(1001));
  RankMessage fresh = request(21, 0, 1);
  fresh.at.whole = false;
  ASSERT_TRUE(take_message(s, 1, 0, fresh, at_ms(1001), logs));
  RankMessage asks = request(20, 4, 1);
  asks.at.whole = false;  // it read "expired" for quorum 4
  asks.at.suspect = true;
  asks.seq = 2;
  ASSERT_TRUE(take_message(s, 0, 0, asks, at_ms(1001), logs));
  const Formation f = form(s, at_ms(1002));
  EXPECT_FALSE(f.next) << ::testing::PrintToString(f.logs);
  EXPECT_EQ(f.replies.size(), 1u) << ::testing::PrintToString(f.logs);
  for (const auto& r : f.replies) EXPECT_FALSE(r.answer.refused.empty());
}

// Found by the simulator (seed 29876): three groups finished the run at
// step 12 and said bye; a fourth, frozen since step 6 and counted lost,
// thawed and trained steps 6 to 12 again alone. It is refused: the job's
// run ended, and its state is behind the one the others left with.
TEST(ReplicaRules, AGroupBehindAJobWhoseRunEndedIsRefused) {
  CoordState s = two_groups_in_a_quorum();
  s.q.decided = true;
  s.q.committed = true;
  s.job_step = 12;
  std::vector<std::string> logs;
  GroupState& done = s.groups[0];
  done.whole = true;
  done.step = 12;
  for (int r = 0; r < 2; ++r) {
    RankMessage bye = request(10, 12, 9);
    bye.kind = Kind::BYE;
    ASSERT_TRUE(take_message(s, 0, r, bye, at_ms(10), logs));
  }
  ASSERT_TRUE(done.ranks.at(0).msg && done.ranks.at(0).msg->kind == Kind::BYE);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(take_message(s, 1, r, request(11, 6, 4), at_ms(10), logs));
  const Formation f = form(s, at_ms(11));
  EXPECT_FALSE(f.next) << ::testing::PrintToString(f.logs);
  bool refused = false;
  for (const auto& r : f.replies)
    refused = refused || (r.group == 1 && r.answer.refused.find("the job's run ended: group 0 finished it at step 12") == 0);
  EXPECT_TRUE(refused) << ::testing::PrintToString(f.logs);
}

// Found by the simulator (seed 2814): group 1, the only holder of step 11,
// was lost; group 0 went on alone from step 8 and reached step 11 again;
// group 1 came back and its ranks' reports (whole, step 11) made it whole
// once more, so the next quorum averaged two different states of step 11.
// A group that came back heals before it counts whole again.
TEST(ReplicaRules, AGroupThatCameBackHealsEvenWhenItsRanksReportTheSameStepWhole) {
  CoordState s = two_groups_in_a_quorum();
  std::vector<std::string> logs;
  GroupState& G = s.groups[1];
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(take_report(s, 1, r, report(11, 11, true, std::nullopt), at_ms(0), logs));
  G.lost = true;
  Liveness back;
  back.changes.push_back({1, false, "", "group 1 is back"});
  apply(s, back);
  EXPECT_FALSE(G.whole);
  for (int r = 0; r < 2; ++r) {
    Report rep = report(11, 11, true, std::nullopt);
    rep.n = 2;
    ASSERT_TRUE(take_report(s, 1, r, rep, at_ms(10), logs));
  }
  EXPECT_FALSE(G.whole) << "its ranks agree, but the job may have gone on without it to the same step";
}

TEST(ReplicaRules, AStepCommitsExactlyWhenEveryRankOfEveryMemberVotedOk) {
  CoordState s = two_groups_in_a_quorum();
  vote(s, 0, 0, true, 1, at_ms(10));
  vote(s, 0, 1, true, 1, at_ms(10));
  vote(s, 1, 0, true, 1, at_ms(10));
  EXPECT_EQ(decide(s, at_ms(20)).what, Verdict::WAIT);
  vote(s, 1, 1, true, 1, at_ms(30));
  // Even with a member's heartbeat late: the votes decide.
  s.groups[1].lost = true;
  const Verdict v = decide(s, at_ms(40));
  EXPECT_EQ(v.what, Verdict::COMMIT) << v.why;
  const auto d = apply(s, v, at_ms(40));
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->commit);
  EXPECT_EQ(d->era, 5);
  EXPECT_EQ(s.job_step, 4);
}

TEST(ReplicaRules, AFailedVoteDropsAfterTheJoinWindowAndARelaunchDropsAtOnce) {
  CoordState s = two_groups_in_a_quorum();
  vote(s, 0, 0, false, 1, at_ms(10));
  Verdict v = decide(s, at_ms(10));
  EXPECT_EQ(v.what, Verdict::WAIT);  // the rank that never votes gets a moment
  apply(s, v, at_ms(10));
  v = decide(s, at_ms(10) + join_window(s.o) + std::chrono::milliseconds(1));
  EXPECT_EQ(v.what, Verdict::DROP);
  EXPECT_NE(v.why.find("group 0 rank 0 failed: the link broke"), std::string::npos) << v.why;

  // Group 1 relaunched during the step (faster than any heartbeat timeout):
  // the votes its earlier launch would have cast never come.
  CoordState r = two_groups_in_a_quorum();
  vote(r, 0, 0, true, 1, at_ms(10));
  vote(r, 0, 1, true, 1, at_ms(10));
  take_registration(r, Registration{1, 0, 21, 2, "h", 3, "m", "FULL_SHARD"}, at_ms(20));
  const Verdict w = decide(r, at_ms(20));
  EXPECT_EQ(w.what, Verdict::DROP);
  EXPECT_NE(w.why.find("group 1 restarted during the step"), std::string::npos) << w.why;
}

TEST(ReplicaRules, TheJobsIdentityIsFixedByItsFirstQuorumNotByARegistration) {
  CoordState s;
  s.o.heartbeat_timeout = std::chrono::milliseconds(1000);
  s.o.min_groups = 2;
  s.recovering = false;
  // A registration of another model that never asks: it fixes nothing.
  take_registration(s, Registration{9, 0, 1, 1, "h", 1, "other", "FULL_SHARD"}, at_ms(0));
  for (int g = 0; g < 2; ++g) {
    take_registration(s, Registration{g, 0, 2 + g, 1, "h", 1, "m", "FULL_SHARD"}, at_ms(0));
    RankMessage m;
    m.seq = 1;
    m.kind = Kind::REQ;
    m.inc = 2 + g;
    m.round = 1;
    std::vector<std::string> logs;
    ASSERT_TRUE(take_message(s, g, 0, m, at_ms(1), logs));
  }
  const Formation f = form(s, at_ms(2));
  ASSERT_TRUE(f.next);
  EXPECT_EQ(f.next->members, (std::vector<int>{0, 1}));
  ASSERT_TRUE(f.job);
  EXPECT_EQ(f.job->model, "m");
}

}  // namespace FSDP_TEST_ID
}  // namespace fsdp::testing
