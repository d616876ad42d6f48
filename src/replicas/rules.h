// fsdp-cpp: the coordinator's memory and its rules — which groups take part
// in the next step, and whether a step commits — as deterministic functions
// of a snapshot (the groups, their latest messages and heartbeats, the
// quorum in flight, the clock). No I/O here: coordinator.cpp reads the
// store into a CoordState and writes back what the rules decided, and the
// simulator (tests/sim/) drives the same functions under injected faults.
// (registry.cpp: the registry, liveness and recovery; rules.cpp: the decisions.)
// defines: RuleOptions, RankState, GroupState, QuorumState, CoordState,
//          take_registration, take_message, take_report, Liveness, liveness, apply,
//          recovery_done, Verdict, decide, Formation, form, Cleanup, cleanup,
//          join_window
//
// The rules (docs/DESIGN.md, "Replica groups that come and go"):
// * A group asks for a quorum when every rank of its current launch asked
//   for the same round. A quorum forms when every live member of the
//   previous one that holds its state asked (after a drop, only for a
//   moment); its step is the most any asker committed; the askers that hold
//   that step whole are its sources, the others heal from them first.
// * A step commits exactly when every rank of every member voted ok: the
//   outcome is a function of the votes, so a coordinator that restarted
//   decides what the first one would have. It drops when a vote failed, or
//   a member was lost or relaunched before voting.
// * A coordinator starts by recovering: for a moment (until every group it
//   heard of and every member of the latest quorum it learned of reported,
//   and at least one rank that knows the job did; at most one heartbeat
//   timeout) it only listens, and learns the quorum in flight, the outcome a
//   rank already read, the steps the groups hold and the ids in use from the
//   ranks' messages. How far the job got it learns from every rank, so a
//   fresh launch never starts the job again, and laggards never train again
//   alone the steps of a job whose run ended.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "replicas/protocol.h"

namespace fsdp::replicas {

using Clock = std::chrono::steady_clock;
using Time = Clock::time_point;

struct RuleOptions {
  std::chrono::milliseconds heartbeat_timeout{10000};
  int min_groups = 1;  // groups the job's first quorum waits for
};

// How long survivors are waited for after a drop, and missing votes after a
// failed one: max(0.2 s, timeout / 10).
Clock::duration join_window(const RuleOptions& o);

struct RankState {
  std::string host;
  int64_t pid = 0;
  std::optional<RankMessage> msg;  // the latest message of this launch
  std::optional<Standing> at;      // where it stands: its latest heartbeat or message
  int64_t beat = -1;               // the latest heartbeat counter of this launch
  Time beat_at{};                  // when it last moved (or the rank registered)
  bool gone = false;               // said bye
};

struct GroupState {
  int id = 0;
  int64_t inc = -1;  // its current launch; -1: none seen
  Time seen_at{};    // when the launch was first registered
  int size = 0;
  std::string model, sharding;
  std::map<int, RankState> ranks;
  bool lost = false;
  std::string silent;        // when lost: its silent ranks, as first seen
  std::string refused;       // why, when refused
  int64_t answered = -1;     // the last request round answered (this launch)
  std::string answer_key;    // the key of that answer (deleted when the next is written)
  bool whole = false;        // holds a state a committed quorum left (this launch)
  bool stale = false;        // its state rests on an outcome this coordinator does not know (see learn)
  bool first = false;        // this launch is its launcher's first round (Registration::first)
  bool back = false;         // came back after it was lost: it heals before it is whole again
  int64_t step = 0;          // steps that state holds
};

struct QuorumState {
  int64_t id = -1, era = 0, comm = -1, step = 0;
  std::vector<int> members;
  std::map<int, int64_t> launches;  // member -> its launch in this quorum (absent: not known yet)
  std::vector<int> sources;         // the members its answers named sources (empty: not known)
  bool decided = true, committed = false;
  Time decided_at{};
  Time first_failure{};  // the first failed vote
  QuorumRef ref() const { return {id, era, comm, step, members}; }
};

struct CoordState {
  RuleOptions o;
  int64_t era = 0;  // this coordinator process's: the quorums it forms carry it
  Time started{};
  bool recovering = true;
  std::map<int, GroupState> groups;
  QuorumState q;
  int64_t next_q = 0, next_comm = 0;
  int64_t job_step = 0;  // the most steps any quorum committed (as far as known)
  // Decided quorums (the latest kOutcomes), by id; a quorum is its whole
  // QuorumRef: an id a rank names with another comm or step is another
  // quorum (of a coordinator that knew nothing of this one).
  struct Known {
    QuorumRef ref;
    bool commit = false;
    std::map<int, int64_t> launches;  // member -> its launch that took part (as far as known)
  };
  std::map<int64_t, Known> outcomes;
  std::map<std::pair<int64_t, int64_t>, std::string> published;  // decision keys written, by (era, quorum)
  // The job's identity, fixed by the first group accepted.
  struct Identity {
    int size = 0;
    std::string model, sharding;
    int group = -1;
  };
  std::optional<Identity> job;
  std::string stuck;  // why no quorum forms, as last logged
  std::vector<std::string> garbage;  // keys no rank reads again (an earlier launch's answer), for cleanup()
};

constexpr size_t kOutcomes = 4096;

// The registry. A registration of a later launch of a group replaces the
// earlier launch (what it held is gone); an earlier launch's registration,
// message or heartbeat is ignored, and so is a message not newer than the
// rank's latest. Each returns the lines to log; take_message and
// take_report return false when they did not take what they were given
// (not registered yet: read it again later).
std::vector<std::string> take_registration(CoordState& s, const Registration& reg, Time now);
bool take_message(CoordState& s, int g, int r, const RankMessage& m, Time now, std::vector<std::string>& logs);
bool take_report(CoordState& s, int g, int r, const Report& rep, Time now, std::vector<std::string>& logs);

// Which groups are lost (a rank silent for the timeout, or every rank said
// bye) and which came back.
struct Liveness {
  struct Change {
    int group = 0;
    bool lost = false;
    std::string silent;
    std::string log;
  };
  std::vector<Change> changes;
};
Liveness liveness(const CoordState& s, Time now);
void apply(CoordState& s, const Liveness& l);

// The outcome of the quorum `ref` names, when known (the same id with
// another comm or step is not the same quorum: nullopt).
std::optional<bool> known_outcome(const CoordState& s, const QuorumRef& ref);

// The coordinator itself was held up for `d` (stopped, paused, starved):
// no rank is blamed for it. Every time the rules measure from moves `d`
// later, so that silence and windows count only while it ran.
void forgive(CoordState& s, Clock::duration d);

// Whether the coordinator has heard enough to decide: every group it heard
// of reported from every rank (and a moment passed for the others to), or
// the heartbeat timeout passed since it started.
bool recovery_done(const CoordState& s, Time now);
// Whether new launches may take a number (the launch counter is made): once
// the ranks that live had a heartbeat period to register with a coordinator
// that restarted, so no new launch numbers below one of theirs.
bool launches_open(const CoordState& s, Time now);

// The quorum in flight: commit, drop, or wait.
struct Verdict {
  enum What { WAIT, COMMIT, DROP } what = WAIT;
  std::string why;          // a drop's reason
  bool first_failure = false;  // record now as the first failed vote
  std::string log;
};
Verdict decide(const CoordState& s, Time now);
// Records the outcome; returns the decision to publish (when decided).
std::optional<Decision> apply(CoordState& s, const Verdict& v, Time now);

// Whether a rank that says bye (`m`) may go: every rank that took part in
// its last quorum read the outcome (or its group was lost or relaunched).
// Until then it stays, so that a coordinator that restarts meanwhile
// learns the outcome from it.
bool released(const CoordState& s, const RankMessage& m);

// The next quorum, and the answers to the groups that asked (and to those
// that said bye).
struct Formation {
  struct Reply {
    int group = 0;
    int64_t round = 0;
    Answer answer;
  };
  std::vector<Reply> replies;           // refusals, and the new quorum's answers
  std::optional<QuorumState> next;      // a new quorum
  std::vector<std::string> logs;
  std::string stuck;                    // why none forms (logged once)
  std::optional<CoordState::Identity> job;  // the job's identity (fixed by its first quorum)
};
Formation form(const CoordState& s, Time now);
void apply(CoordState& s, const Formation& f);

// A coordinator that restarted while some member of the quorum in flight
// had not read its answer yet (that member still asks for the round the
// quorum answered): the same quorum again, with the sources its answers
// named (the ranks inside it report them; not knowing them, only when every
// member holds its step whole), so that the others, already in its
// collectives, are not left waiting for that member until the links time
// out. The replies bind the member's launch. A group split so around a
// quorum that was dropped since is answered that quorum too: the ranks that
// missed it join their mates inside it, and all read the drop together.
Formation reanswer(const CoordState& s);

// Keys no rank will read again, and decisions to publish again (a rank
// that waits for the outcome of a quorum whose key was deleted, or that
// the coordinator never published: it restarted since).
struct Cleanup {
  std::vector<std::string> erase;
  std::vector<std::pair<std::string, Decision>> publish;
};
Cleanup cleanup(const CoordState& s, const Keys& keys);
void apply(CoordState& s, const Cleanup& c);

// The group's requests: every rank of its current launch asks for the same
// round (the step each asks for, lo and hi); nullopt when not all asked yet.
struct Request {
  int64_t round = -1, lo = 0, hi = 0;
  bool whole = true;  // every rank's state will be whole once it read what it asked after
};
std::optional<Request> request_of(const CoordState& s, const GroupState& g);

}  // namespace fsdp::replicas
