// fsdp-cpp: what replica groups and their coordinator say to each other —
// every key of the coordinator's store, and every message, with the checks
// that keep a malformed one from reaching the rules.
// defines: kProtocol, Keys, QuorumRef, Standing, Kind, RankMessage, Report,
//          Answer, Decision, Registration, Settings, to_json, parse_message,
//          parse_report, parse_answer, parse_decision, parse_registration,
//          parse_settings
//
// The store (a TCPStore the coordinator hosts) holds, under
// "fsdp-ft/[<FSDP_JOB_TOKEN>/]" (the token is the capability: a process that
// does not know it cannot name a key the coordinator reads or a rank trusts):
//
//   cfg                  Settings: protocol version, heartbeat timeout, epoch
//                        (a new value per coordinator process)
//   launches             a counter: each launch of a group takes the next value
//                        (its incarnation: later launches are larger, whatever
//                        the hosts' clocks say)
//   nreg/<era>,          the i-th registration (Registration) with the
//   reg/<era>/<i>        coordinator process `era` (era_of its settings'
//                        epoch): a rank of a launch, who it is and what its
//                        group trains; a rank registers again with every new
//                        coordinator, and a write that counted with an
//                        earlier one (its rank was stopped through a
//                        restart) lands where the new one never reads
//   hb/<g>/<inc>/<r>     its heartbeat (Report): a counter and where it
//                        stands (what a coordinator that restarted learns
//                        the job's state from), written every tenth of the
//                        heartbeat timeout on a connection of its own
//   mb/<g>/<inc>/<r>     its mailbox: its latest request or vote (RankMessage)
//   bell                 set after every mailbox write
//   ans/<g>/<inc>/<n>    the answer to request round n of group g's launch inc
//   dec/<era>/<q>        quorum q's outcome (Decision); era: the coordinator
//                        process that formed it
//   q<era>.<c>/r<r>/...  the Gloo links of communicator c, shard r; written/<i>:
//                        the keys member i wrote there (deleted, with them,
//                        once the coordinator retired the links)
//
// and, outside the token's path, "fsdp-ft/job": the token's fingerprint
// ("none" without one), so that a rank with another token is told so.
//
// Parsing never throws: what is malformed, of another protocol version, out
// of range or of the wrong JSON type comes back as nullopt and a reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::replicas {

// Raised when a message's meaning changes; the coordinator publishes its
// own in Settings and a rank of another version refuses to start.
constexpr int kProtocol = 2;

class Keys {
 public:
  explicit Keys(const std::string& job_token);
  // Outside the token's path: the token's fingerprint.
  static std::string job();
  std::string cfg() const { return base_ + "cfg"; }
  std::string launches() const { return base_ + "launches"; }  // made once the ranks had a moment to register
  std::string nreg(int64_t era) const { return base_ + "nreg/" + std::to_string(era); }
  std::string reg(int64_t era, int64_t i) const {
    return base_ + "reg/" + std::to_string(era) + "/" + std::to_string(i);
  }
  // A launch's own keys: a write of an earlier launch that arrives late (a
  // store that was stopped reads a dead client's last request when it
  // resumes) can never overwrite a later launch's.
  std::string heartbeat(int g, int64_t inc, int r) const { return gr("hb/", g, inc, r); }
  std::string mailbox(int g, int64_t inc, int r) const { return gr("mb/", g, inc, r); }
  std::string bell() const { return base_ + "bell"; }
  std::string answer(int g, int64_t inc, int64_t round) const;
  std::string decision(int64_t era, int64_t q) const {
    return base_ + "dec/" + std::to_string(era) + "/" + std::to_string(q);
  }
  // The prefix of the links of communicator `comm` (of coordinator era
  // `era`) for shard r.
  std::string link(int64_t era, int64_t comm, int shard) const;
  // Under a link's prefix: the keys member `index` wrote there (a JSON list),
  // for the coordinator to delete once the links are retired.
  static std::string link_written(const std::string& prefix, int index) {
    return prefix + "written/" + std::to_string(index);
  }
  const std::string& base() const { return base_; }

 private:
  std::string gr(const char* what, int g, int64_t inc, int r) const;
  std::string base_;
};

// A quorum as its members know it. Two refs name one quorum only when every
// field agrees: a coordinator that restarted knowing nothing numbers its
// quorums from 0 again, in an era of its own.
struct QuorumRef {
  int64_t q = -1;            // its id (one per step attempt)
  int64_t era = 0;           // the coordinator process that formed it (a random number per process)
  int64_t comm = -1;         // its links' id (changes when the members do, or after a failure)
  int64_t step = 0;          // the step its members take
  std::vector<int> members;  // group ids, ascending
  bool operator==(const QuorumRef&) const = default;
};

// Where a rank stands: its model state and the quorum it is in. Every
// heartbeat and every message carries it.
struct Standing {
  int64_t committed = 0;         // steps its model state holds
  bool whole = false;            // its state is what a committed quorum (or a heal) left; false for a fresh launch
  std::optional<QuorumRef> cur;   // the quorum it takes part in, whose outcome it has not read
  std::vector<int> cur_sources;   // that quorum's sources as its answer named them (a
                                  // coordinator that restarts answers it again with them)
  std::optional<QuorumRef> last;  // the last quorum whose outcome it read ...
  bool last_commit = false;       // ... and that outcome
  // Its process was held up (stopped, its host paused) past the heartbeat
  // timeout while its coordinator changed: a new coordinator takes nothing
  // it holds or read for the job's (the old one may have counted it lost
  // and decided without it). Cleared by a heal.
  bool suspect = false;
};

enum class Kind { HELLO, REQ, VOTE, BYE };
const char* name_of(Kind k);

// A rank's message (its mailbox holds the latest).
struct RankMessage {
  int64_t seq = 0;   // per launch of the rank, from 1; a coordinator takes only a larger one
  Kind kind = Kind::HELLO;
  int64_t inc = 0;   // the launch (incarnation) of its group
  Standing at;       // where it stands as it sends this
  // REQ: the round it asks for; VOTE: the round it asks for next (the step
  // after the outcome), so the next quorum forms as the vote is decided.
  int64_t round = -1;
  bool ok = false;   // VOTE (on at.cur): its gradients were averaged
  std::string why;   // VOTE: why not
};
std::string to_json(const RankMessage& m);
std::optional<RankMessage> parse_message(std::string_view text, std::string* why);

// A heartbeat: the launch, a counter that moves while the rank lives, and
// where it stands.
struct Report {
  int64_t inc = 0;
  int64_t n = 0;
  Standing at;
};
std::string to_json(const Report& r);
std::optional<Report> parse_report(std::string_view text, std::string* why);

// The coordinator's answer to a group's request (or to its bye).
struct Answer {
  std::string refused;        // non-empty: the group is refused, and why
  bool farewell = false;      // to a bye: every rank that took part in its last quorum read the outcome
  QuorumRef quorum;
  std::vector<int> sources;   // members that hold quorum.step whole (heal sources)
  bool heal = false;          // this group copies the state from a source first
};
std::string to_json(const Answer& a);
std::optional<Answer> parse_answer(std::string_view text, std::string* why);

// A quorum's outcome. `expired`: the coordinator no longer knows it (a rank
// that reads it applies nothing and counts its state as stale).
struct Decision {
  int64_t q = -1, era = 0, comm = -1, step = 0;
  bool commit = false;
  bool expired = false;
  std::string why;  // a drop's reason
};
std::string to_json(const Decision& d);
std::optional<Decision> parse_decision(std::string_view text, std::string* why);

// A rank of a launch: who it is and what its group trains (the coordinator
// refuses a group whose size, model or sharding differ from the job's).
struct Registration {
  int group = 0, rank = 0;
  int64_t inc = 0;   // its group's launch
  int size = 1;      // ranks in its group
  std::string host;  // where it runs (for the messages that name it)
  int64_t pid = 0;
  std::string model, sharding;
  bool first = false;  // its launcher's first round of it (no restart before): a job's start, not a relaunch
};
std::string to_json(const Registration& r);
std::optional<Registration> parse_registration(std::string_view text, std::string* why);

struct Settings {
  int protocol = kProtocol;
  int64_t heartbeat_ms = 10000;
  std::string epoch;  // one per coordinator process
};
std::string to_json(const Settings& s);
std::optional<Settings> parse_settings(std::string_view text, std::string* why);
// The coordinator process an epoch names, as a JSON-safe number (FNV-1a,
// 53 bits): what its decisions, links and registrations are keyed by.
int64_t era_of(const std::string& epoch);

// Bounds on what a message may hold (a larger one is malformed).
constexpr int kMaxGroupId = 1 << 20;
constexpr int kMaxGroupSize = 1 << 20;
constexpr size_t kMaxText = 1 << 16;  // host, model, sharding, why

}  // namespace fsdp::replicas
