// Reading a failure, in three steps kept apart: the evidence, the decision
// (no words), and the words. The rank's reading of a failed collective
// (comm/diagnosis.h), the launcher's naming of the rank that stopped a job
// (tools/launch_diagnosis.h), and the one /proc reader both use
// (common/proc_state.h). The end-to-end wording is tested by
// test_watchdog.cpp and test_launcher.cpp with real ranks.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/diagnosis.h"
#include "comm/mesh.h"
#include "comm/ring.h"
#include "common/proc_state.h"
#include "launch_diagnosis.h"
#include "observe/flight_hooks.h"

using fsdp::comm::Evidence;
using fsdp::comm::RankReading;
using fsdp::watchdog::Entered;
using fsdp::watchdog::Heartbeat;

namespace FSDP_TEST_ID {
namespace proc = fsdp::proc;
namespace diagnosis = fsdp::tools::diagnosis;

Heartbeat beat(int rank, double time, uint64_t seq = 0) {
  Heartbeat h;
  h.rank = rank;
  h.pid = 1000 + rank;
  h.host = "h";
  h.time = time;
  h.interval = 1;
  h.step = 3;
  h.phase = "forward";
  h.seq = seq;
  if (seq) {
    h.kind = "all_gather";
    h.unit = "blocks.1";
  }
  return h;
}

Evidence four_ranks() {
  Evidence ev;
  ev.self = 0;
  ev.world = 4;
  ev.comm = 0;
  ev.seq = 7;
  ev.what = "all_gather 'blocks.1' (fp32, 10 elements, 40 B)";
  ev.kind = "all_gather";
  ev.unit = "blocks.1";
  ev.now = 100;
  ev.silent_after = 3;
  ev.beats.resize(4);
  ev.entered.resize(4);
  return ev;
}

TEST(ProcState, OneReaderOneAnswerPerState) {
  const auto self = proc::read_state(getpid());
  EXPECT_TRUE(self == proc::State::Running || self == proc::State::Sleeping) << proc::describe(self);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) pause();
  }
  int status = 0;
  kill(child, SIGSTOP);
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  EXPECT_EQ(proc::read_state(child), proc::State::Stopped);
  EXPECT_TRUE(proc::is_stopped(proc::read_state(child)));
  EXPECT_EQ(proc::describe(proc::State::Stopped, SIGSTOP), "stopped (SIGSTOP)");
  kill(child, SIGKILL);
  // Killed, not yet reaped: a zombie, which counts as gone.
  auto state = proc::read_state(child);
  for (int i = 0; i < 200 && state != proc::State::Zombie; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    state = proc::read_state(child);
  }
  EXPECT_EQ(state, proc::State::Zombie);
  EXPECT_TRUE(proc::is_gone(state));
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(proc::read_state(child), proc::State::Gone);  // reaped: no /proc entry
  // The state is the letter after the last ')': a command name may hold both.
  EXPECT_EQ(proc::parse_stat_line("42 (a) b) T) S 1 2 3"), proc::State::Sleeping);
  EXPECT_EQ(proc::parse_stat_line("42 (x) t 1"), proc::State::TracingStop);
  EXPECT_EQ(proc::parse_stat_line("garbage"), proc::State::Unreadable);
  EXPECT_EQ(proc::read_state(0), proc::State::Unreadable);
}

TEST(Diagnosis, TheDecisionIsMadeWithoutWordsAndWordedApart) {
  Evidence ev = four_ranks();
  // Rank 1: in this collective, bytes moved a moment ago (slow). Rank 2: no
  // heartbeat at all (silent). Rank 3: alive outside any collective.
  Heartbeat h1 = beat(1, 99.5, 7);
  h1.moved = 99.8;
  h1.recv_done = 10;
  h1.recv_total = 40;
  ev.beats[1] = h1;
  ev.beats[3] = beat(3, 99.6);
  const auto d = fsdp::comm::decide(ev);
  ASSERT_EQ(d.ranks.size(), 3u);
  EXPECT_EQ(d.ranks[0].is, RankReading::Is::Slow);
  EXPECT_EQ(d.ranks[1].is, RankReading::Is::NoBeat);
  EXPECT_EQ(d.ranks[2].is, RankReading::Is::Elsewhere);
  EXPECT_EQ(d.ranks[2].place, RankReading::Place::Outside);
  EXPECT_EQ(d.verdict.silent, std::vector<int>{2});
  EXPECT_EQ(d.verdict.slow, std::vector<int>{1});
  EXPECT_EQ(d.verdict.elsewhere, std::vector<int>{3});
  EXPECT_EQ(d.verdict.culprits, std::vector<int>{2});  // silent first
  EXPECT_TRUE(d.verdict.summary.empty()) << "the decision carries no words";
  const auto x = fsdp::comm::explain(ev, d);
  EXPECT_NE(x.lines.find("rank 2: SILENT, no heartbeat at all; entered no collective yet"), std::string::npos)
      << x.lines;
  EXPECT_EQ(x.summary, "rank 2 is silent: it never published a heartbeat; entered no collective yet.");

  // Without the silent rank the one elsewhere is the cause; a rank whose
  // entered collective at #7 is another one is a desync.
  ev.beats[2] = beat(2, 99.7, 7);
  ev.beats[2]->comm = 1;  // its heartbeat: another communicator's #7
  Entered e;
  e.comm = 0;
  e.seq = 7;
  e.time = 99.9;
  e.what = "reduce_scatter 'blocks.1' (fp32, 10 elements, 40 B)";
  ev.entered[2] = e;
  const auto c = fsdp::comm::classify(ev);
  EXPECT_EQ(c.verdict.elsewhere, (std::vector<int>{2, 3}));
  EXPECT_EQ(c.verdict.desync, std::vector<int>{2});
  EXPECT_EQ(c.verdict.culprits, (std::vector<int>{2, 3}));
  EXPECT_NE(c.verdict.summary.find("rank 2 is elsewhere: alive; it entered #7 as reduce_scatter"), std::string::npos)
      << c.verdict.summary;

  // The store did not answer: this host's ranks by their /proc, the others
  // cut off.
  Evidence off = four_ranks();
  off.store_reachable = false;
  off.beats.clear();
  off.entered.clear();
  off.my_identity = "me";
  off.where.resize(4);
  off.where[1] = fsdp::comm::Watchdog::Where{"h", "me", 1001};
  off.where[2] = fsdp::comm::Watchdog::Where{"far-host", "other", 2002};
  off.local_state.resize(4);
  off.local_state[1] = proc::State::Stopped;
  const auto o = fsdp::comm::decide(off);
  EXPECT_EQ(o.ranks[0].is, RankReading::Is::HereStopped);
  EXPECT_EQ(o.ranks[1].is, RankReading::Is::Far);
  EXPECT_EQ(o.ranks[2].is, RankReading::Is::Unknown);
  EXPECT_EQ(o.verdict.silent, (std::vector<int>{1, 2}));
  const auto ox = fsdp::comm::explain(off, o);
  EXPECT_NE(ox.lines.find("rank 1: SILENT, its process (pid 1001) is stopped"), std::string::npos) << ox.lines;
  EXPECT_NE(ox.summary.find("rank 2 on 'far-host' is silent: cut off"), std::string::npos) << ox.summary;
}

// The message is rendered from data alone (no store, no clock): the call,
// where its transfer stood, the ranks the evidence shows behind or unknown,
// the classification, and the transport's own error last.
TEST(Diagnosis, TheMessageIsRenderedFromTheEvidenceAlone) {
  Evidence ev = four_ranks();
  ev.store = "127.0.0.1:29500";
  ev.store_budget = std::chrono::milliseconds(1500);
  Entered at6;
  at6.seq = 6;
  at6.what = "all_gather 'blocks.0' (fp32, 10 elements, 40 B)";
  ev.entered[0] = Entered{0, 7, 99.0, 3, "forward", ev.what};
  ev.entered[1] = ev.entered[0];
  ev.entered[2] = at6;  // behind: never arrived at #7; rank 3's progress unknown
  ev.beats[1] = beat(1, 99.9, 7);
  ev.beats[2] = beat(2, 99.9);
  fsdp::comm::FailedCall call;
  call.seq = 7;
  call.what = ev.what;
  call.kind = ev.kind;
  call.unit = ev.unit;
  call.error = "Timed out waiting 2000ms for recv operation to complete";
  call.seconds = 2.01;
  call.timeout_s = 2;
  call.peer = 1;
  call.waiting = 1;  // receive
  call.recv_total = 40;
  fsdp::comm::Naming names{"", {0, 1, 2, 3}, "gloo/tcp world=4 rank=0"};
  const auto c = fsdp::comm::classify(ev);
  const std::string m = fsdp::comm::render_failure(call, ev, c, names, "gloo");
  EXPECT_EQ(m.rfind("all_gather 'blocks.1' (fp32, 10 elements, 40 B), collective #7 of rank 0 in a world of 4 "
                    "(gloo/tcp world=4 rank=0), timed out after 2.01 s (timeout 2 s, FSDP_TIMEOUT).",
                    0),
            0u)
      << m;
  EXPECT_NE(m.find("\nWaiting on: rank 1 (this rank was waiting to receive from it); 0 B of 40 B had arrived."),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("\nRanks that never arrived at #7: rank 2 (last entered #6 all_gather 'blocks.0'"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("\nProgress of ranks 3 is unknown: the store at 127.0.0.1:29500 did not answer within 1500 ms."),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(c.lines), std::string::npos) << m;
  EXPECT_EQ(m.substr(m.rfind('\n')), "\n(gloo: Timed out waiting 2000ms for recv operation to complete)") << m;
  // A group's ranks by their global numbers, and the legend at the end.
  names = {"shard", {4, 5, 6, 7}, "gloo/tcp group 'shard' of ranks 4, 5, 6, 7 rank=4"};
  const std::string g = fsdp::comm::render_failure(call, ev, c, names, "gloo");
  EXPECT_NE(g.find("collective #7 of rank 4 (group rank 0) in a group of 4"), std::string::npos) << g;
  EXPECT_NE(g.find("rank 6 (group rank 2) (last entered #6"), std::string::npos) << g;
  EXPECT_NE(g.find("group 'shard' is global ranks 4, 5, 6, 7 in that order)"), std::string::npos) << g;
}

// The evidence is read on an injected clock (the watchdog's, WatchClock):
// what the reading may cost is checked against the budget without waiting
// for it, and the wait for a heartbeat that is neither fresh nor overdue is
// an event on that clock.
struct FakeTime {
  using Clock = fsdp::comm::WatchClock::Clock;
  Clock::time_point t = Clock::time_point(std::chrono::seconds(1000));
  double wall = 100;
  std::vector<std::chrono::milliseconds> budgets;  // of each read
  std::optional<std::vector<std::optional<std::string>>> answer;  // nullopt: the store is silent
  void advance(Clock::duration d) {
    t += d;
    wall += std::chrono::duration<double>(d).count();
  }
  fsdp::comm::EvidenceSource source() {
    fsdp::comm::EvidenceSource src;
    src.read = [this](const std::vector<std::string>& keys, std::chrono::milliseconds budget) {
      budgets.push_back(budget);
      if (!answer) {
        advance(budget);  // a silent store takes all the budget it is given
        return decltype(answer)();
      }
      advance(std::chrono::milliseconds(5));
      return answer;
    };
    src.prefix = "fsdp/c0/";
    src.base = "fsdp/";
    src.store = "127.0.0.1:1";
    src.interval = 1;
    src.silent_after = 3;
    src.pid_of = [](int) { return -1; };
    src.gone_peers = [] { return std::string(); };
    src.gone = [](pid_t) { return false; };
    src.clock.now = [this] { return t; };
    src.clock.wall = [this] { return wall; };
    src.clock.sleep_until = [this](Clock::time_point until) {
      if (until > t) advance(until - t);
    };
    return src;
  }
};

fsdp::comm::FailedCall failed_at(uint64_t seq) {
  fsdp::comm::FailedCall call;
  call.seq = seq;
  call.what = "all_gather 'blocks.1' (fp32, 10 elements, 40 B)";
  call.kind = "all_gather";
  call.unit = "blocks.1";
  return call;
}

TEST(DiagnosisEvidence, ASilentStoreCostsNoMoreThanTheBudget) {
  FakeTime time;  // the store never answers
  const auto start = time.t;
  fsdp::comm::Evidence ev = fsdp::comm::collect_evidence(time.source(), {0, 1, 2}, 0, failed_at(4));
  EXPECT_FALSE(ev.store_reachable);
  EXPECT_EQ(ev.store_budget, std::chrono::milliseconds(1500));
  ASSERT_EQ(time.budgets.size(), 1u);
  EXPECT_EQ(time.budgets[0], std::chrono::milliseconds(1500));
  EXPECT_LE(time.t - start, std::chrono::milliseconds(1500));
  // A store that has not answered the heartbeats for longer than a rank
  // takes to be silent gets one short try.
  FakeTime cut;
  auto src = cut.source();
  src.store_silent_for = 10;
  ev = fsdp::comm::collect_evidence(src, {0, 1, 2}, 0, failed_at(4));
  EXPECT_TRUE(ev.store_silent);
  ASSERT_EQ(cut.budgets.size(), 1u);
  EXPECT_EQ(cut.budgets[0], std::chrono::milliseconds(200));
}

TEST(DiagnosisEvidence, AHeartbeatNeitherFreshNorOverdueIsWaitedForOnTheClock) {
  FakeTime time;
  // Rank 1's last heartbeat is 2.5 intervals old: not fresh, not yet silent
  // (3). The reading waits on the clock until it is overdue, then reads
  // again, within the budget; rank 2's is fresh.
  Heartbeat h1 = beat(1, time.wall - 2.5), h2 = beat(2, time.wall - 0.1);
  time.answer = std::vector<std::optional<std::string>>{"4|99|3|forward|" + failed_at(4).what, "3|99|3|forward|x",
                                                         "4|99|3|forward|" + failed_at(4).what,
                                                         std::nullopt, h1.to_json().dump(), h2.to_json().dump()};
  const auto start = time.t;
  const fsdp::comm::Evidence ev = fsdp::comm::collect_evidence(time.source(), {0, 1, 2}, 0, failed_at(4));
  ASSERT_TRUE(ev.store_reachable);
  ASSERT_EQ(time.budgets.size(), 2u) << "read, waited, read again";
  EXPECT_LT(time.budgets[1], time.budgets[0]) << "the second read has what is left of the budget";
  EXPECT_LE(time.t - start, std::chrono::milliseconds(1500));
  ASSERT_TRUE(ev.beats[1].has_value());
  EXPECT_GT(ev.beats[1]->age(ev.now), ev.silent_after) << "overdue once the wait is over";
  const auto c = fsdp::comm::classify(ev);
  EXPECT_EQ(c.verdict.silent, std::vector<int>{1});
}

TEST(LaunchDiagnosis, TheFindingIsDecidedBeforeItIsWorded) {
  diagnosis::Evidence ev;
  ev.now = 1000;
  ev.world = 4;
  diagnosis::RankFacts r0, r1;
  r0.local = 0, r0.global = 0, r0.pid = 500, r0.running = true, r0.state = proc::State::Stopped;
  r0.stop_signal = SIGSTOP;
  r1.local = 1, r1.global = 1, r1.pid = 501, r1.running = false, r1.status = 1 << 8;  // exited with code 1
  ev.local = {r0, r1};
  ev.first = 1;
  Heartbeat h0 = beat(0, 990);
  h0.dumps_on_signal = true;
  ev.records[0].beat = h0;
  // A stopped local rank: named, and continued once to dump first.
  auto f = diagnosis::decide(ev);
  EXPECT_EQ(f.kind, diagnosis::Finding::Kind::Stopped);
  EXPECT_EQ(f.culprit, 0);
  EXPECT_TRUE(f.ask_dump);
  EXPECT_TRUE(f.continue_first);
  EXPECT_EQ(f.waiting, std::vector<int>{1});  // failed on its own, no verdict
  const std::string text = diagnosis::cause_text(ev, f);
  EXPECT_NE(text.find("rank 0 (pid 500) stopped responding at "), std::string::npos) << text;
  EXPECT_NE(text.find("no heartbeat for 10.0 s, process state: stopped (SIGSTOP)"), std::string::npos) << text;
  EXPECT_NE(text.find("; rank 1 failed after it."), std::string::npos) << text;
  // The same finding as data (launcher-node<k>.json), with the words in it.
  auto j = diagnosis::finding_json(ev, f);
  EXPECT_EQ(j.at("kind"), "stopped") << j.dump();
  EXPECT_EQ(j.at("culprit"), 0) << j.dump();
  EXPECT_EQ(j.at("pid"), 500) << j.dump();
  EXPECT_EQ(j.at("on_this_node"), true) << j.dump();
  EXPECT_EQ(j.at("process_state"), "stopped (SIGSTOP)") << j.dump();
  EXPECT_EQ(j.at("signal"), SIGSTOP) << j.dump();
  EXPECT_DOUBLE_EQ(j.at("heartbeat").at("age_s").get<double>(), 10.0) << j.dump();
  EXPECT_EQ(j.at("waiting").get<std::vector<int>>(), std::vector<int>{1}) << j.dump();
  EXPECT_EQ(j.at("first_failed"), 1) << j.dump();
  EXPECT_EQ(j.at("first_failed_exit_code"), 1) << j.dump();
  EXPECT_EQ(j.at("cause"), text) << j.dump();

  // No stopped rank: the verdicts name a rank of another node, as a desync.
  ev.local[0].state = proc::State::Sleeping;
  ev.local[0].stop_signal = 0;
  fsdp::watchdog::Verdict v;
  v.rank = 1;
  v.seq = 9;
  v.kind = "all_gather";
  v.timed_out = true;
  v.culprits = {3};
  v.elsewhere = {3};
  v.desync = {3};
  ev.verdicts[1] = v;
  ev.records[3].beat = beat(3, 999.5, 9);
  ev.records[3].beat->host = "node-b";
  f = diagnosis::decide(ev);
  EXPECT_EQ(f.kind, diagnosis::Finding::Kind::Named);
  EXPECT_EQ(f.named, diagnosis::Finding::Named::Desync);
  EXPECT_EQ(f.culprit, 3);
  EXPECT_EQ(f.local, -1);
  EXPECT_EQ(f.judge, 1);
  EXPECT_FALSE(f.ask_dump);  // not this node's
  j = diagnosis::finding_json(ev, f);
  EXPECT_EQ(j.at("kind"), "named") << j.dump();
  EXPECT_EQ(j.at("named"), "desync") << j.dump();
  EXPECT_EQ(j.at("judge"), 1) << j.dump();
  EXPECT_EQ(j.at("on_this_node"), false) << j.dump();
  EXPECT_EQ(j.at("pid"), 1003) << j.dump();
  EXPECT_EQ(j.at("host"), "node-b") << j.dump();
  EXPECT_EQ(j.at("collective").at("seq"), 9) << j.dump();
  EXPECT_EQ(j.at("collective").at("kind"), "all_gather") << j.dump();
  EXPECT_EQ(j.at("collective").at("unit"), "blocks.1") << j.dump();
  EXPECT_EQ(j.at("waiting").get<std::vector<int>>(), std::vector<int>{1}) << j.dump();
  EXPECT_EQ(j.at("waiting_timed_out"), true) << j.dump();
  EXPECT_EQ(diagnosis::cause_text(ev, f),
            "rank 3 (pid 1003 on node-b) issued a different collective — in all_gather 'blocks.1' #9 (step 3, "
            "forward) — while rank 1 waited in all_gather #9 (a desync: every rank must issue the same collectives "
            "in the same order).");

  // A rank killed by a signal answers for itself.
  ev.local[1].status = SIGKILL;  // WIFSIGNALED
  ev.local[1].exited_at = 1000;
  f = diagnosis::decide(ev);
  EXPECT_EQ(f.kind, diagnosis::Finding::Kind::Killed);
  EXPECT_EQ(f.culprit, 1);
  EXPECT_FALSE(f.print_now);
  EXPECT_NE(diagnosis::cause_text(ev, f).find("rank 1 (local rank 1, pid 501) was killed by signal SIGKILL (9)"),
            std::string::npos);
  j = diagnosis::finding_json(ev, f);
  EXPECT_EQ(j.at("kind"), "killed") << j.dump();
  EXPECT_EQ(j.at("culprit"), 1) << j.dump();
  EXPECT_EQ(j.at("signal"), SIGKILL) << j.dump();
  EXPECT_EQ(j.at("first_failed_signal"), SIGKILL) << j.dump();
  EXPECT_FALSE(j.contains("exit_code") || j.contains("first_failed_exit_code")) << j.dump();

  // A culprit alive in no collective: the data names the one it entered last.
  ev.local[1].status = 1 << 8;  // exited with code 1, as at first
  ev.verdicts[1].desync.clear();
  ev.records[3].beat = beat(3, 999.5);  // in no collective now
  fsdp::watchdog::Entered last;
  last.seq = 8;
  last.time = 990;
  last.what = "reduce_scatter 'fc1' (fp32, 10 elements, 40 B)";
  ev.records[3].entered = last;
  f = diagnosis::decide(ev);
  ASSERT_EQ(f.named, diagnosis::Finding::Named::AliveElsewhere);
  j = diagnosis::finding_json(ev, f);
  EXPECT_EQ(j.at("named"), "elsewhere") << j.dump();
  EXPECT_FALSE(j.contains("collective")) << j.dump();
  EXPECT_EQ(j.at("last_entered").at("seq"), 8) << j.dump();
  EXPECT_EQ(j.at("last_entered").at("what"), last.what) << j.dump();
}


// Links that broke before anything was posted on them, as Gloo's are once a
// peer died: every post throws its error.
class BrokenLinks : public c10d::Backend {
 public:
  BrokenLinks() : c10d::Backend(0, 3) {}
  const std::string getBackendName() const override { return "broken-links"; }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override {
    throw std::runtime_error("Connection closed by peer [127.0.0.1]:40123");
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override {
    throw std::runtime_error("Connection closed by peer [127.0.0.1]:40124");
  }
};

// A rank whose peer died before it posted (the race of a kill against the
// next collective) fails in the post, not in a wait: the failure still names
// that peer, and the progress the verdict's waited_on is read from records
// it, by the communicator's name of the rank.
TEST(DiagnosisEvidence, APostOnABrokenLinkRecordsThePeerWaitedOn) {
  fsdp::comm::Mesh mesh(c10::make_intrusive<BrokenLinks>(), 0, 3);
  const std::vector<int> names = {10, 11, 12};  // a tier's ranks, named by the communicator
  std::vector<char> buf(96);
  auto failure = [&](auto collective, fsdp::flight::Progress& progress) {
    fsdp::comm::Wire w;
    w.mesh = &mesh;
    w.seq = 7;
    w.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    w.progress = &progress;
    w.names = &names;
    try {
      collective(w);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "the collective did not fail";
    return std::string();
  };
  {  // The ring's first post: the send to its right.
    fsdp::flight::Progress progress;
    const std::string e = failure(
        [&](const fsdp::comm::Wire& w) { fsdp::comm::ring_all_gather(w, buf.data(), {0, 32, 64}, {32, 32, 32}); },
        progress);
    EXPECT_NE(e.find("sending to rank 11: the link to it had already failed (Connection closed by peer"),
              std::string::npos)
        << e;
    EXPECT_EQ(progress.peer.load(), 11);
    EXPECT_EQ(progress.waiting.load(), fsdp::flight::Progress::SEND);
  }
  {  // A broadcast's receiver: its one post, the receive from the root.
    fsdp::flight::Progress progress;
    const std::string e = failure(
        [&](const fsdp::comm::Wire& w) { fsdp::comm::direct_broadcast(w, buf.data(), 32, /*root=*/2); }, progress);
    EXPECT_NE(e.find("receiving from rank 12: the link to it had already failed (Connection closed by peer"),
              std::string::npos)
        << e;
    EXPECT_EQ(progress.peer.load(), 12);
    EXPECT_EQ(progress.waiting.load(), fsdp::flight::Progress::RECEIVE);
  }
}

}  // namespace FSDP_TEST_ID
