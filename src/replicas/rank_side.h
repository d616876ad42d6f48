// fsdp-cpp: a rank's side of the replica-group protocol, without I/O — what
// it sends, which key it waits for, what an answer or a decision means for
// its state, and who copies what in a heal. The process drives it over the
// coordinator's store (client.h); the simulator (tests/sim/) drives the same
// object over a simulated one.
// defines: GroupIdentity, QuorumView, HealPlan, heal_plan, Outcome, RankSide
//
// A rank's life in one launch of its group:
//   hello -> ask (REQ, round n) -> answer n: a quorum -> [heal] -> train ->
//   vote (asks for round n+1) -> decision: commit (applied) or drop -> answer n+1 ...
// Every message carries where the rank stands (Standing), so the latest
// message and heartbeat of each rank are all a coordinator needs to resume.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "replicas/protocol.h"

namespace fsdp::replicas {

// Who a rank is, for the coordinator.
struct GroupIdentity {
  int group = 0;            // the replica group's id (>= 0)
  int rank = 0;             // this rank in its group
  int group_size = 1;       // ranks in the group
  int64_t incarnation = 0;  // this launch of the group (from the coordinator's counter)
  std::string model;        // e.g. "12 tensors, 2410 elements, names and shapes 5d41..."
  std::string sharding;     // e.g. "FULL_SHARD, params fp32"
  std::string host;
  int64_t pid = 0;
  bool first_launch = false;  // its launcher's first round (FSDP_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT 0)
};

// A quorum as one group sees it.
struct QuorumView {
  int64_t id = -1;           // quorum id (one per step attempt)
  int64_t era = 0;           // the coordinator process that formed it
  int64_t comm = -1;         // its links' id
  int64_t step = 0;          // the step the members take
  std::vector<int> members;  // group ids, ascending
  std::vector<int> sources;  // members that hold step `step` whole (heal sources)
  bool heal = false;         // this group copies its state from a source first
  int index = -1;            // this group's position in `members`
  QuorumRef ref() const { return {id, era, comm, step, members}; }
};

// Who copies what in a quorum's heal, for rank r (shard r) of a group: shard
// r of every healing member comes from rank r of source r mod #sources.
struct HealPlan {
  bool any = false;          // some member heals: every rank of every member agrees on the heal's outcome
  int source = -1;           // the group shard r heals from
  std::vector<int> send_to;  // positions in `members` this rank lends its shard to
  int receive_from = -1;     // the position this rank takes its shard from; -1: none
};
HealPlan heal_plan(const QuorumView& v, int group, int rank);

struct Outcome {
  bool commit = false;   // apply the step
  bool expired = false;  // the coordinator no longer knows the outcome: nothing applied, this state counts as stale
  std::string why;       // a drop's reason
};

class RankSide {
 public:
  RankSide(GroupIdentity id, int64_t start_step);

  const GroupIdentity& identity() const { return id_; }
  Registration registration() const;
  // Where it stands, and a heartbeat (`n` moves every beat).
  const Standing& standing() const { return at_; }
  Report report(int64_t n) const { return Report{id_.incarnation, n, at_}; }
  int64_t committed() const { return at_.committed; }

  // The first message of the launch.
  RankMessage hello();
  // Asks for the quorum of the step after committed(); nullopt when the
  // last vote asked already (the next quorum forms as the vote is decided).
  std::optional<RankMessage> ask();
  // The key the answer to the latest request appears at.
  std::string answer_key(const Keys& keys) const { return keys.answer(id_.group, id_.incarnation, round_); }
  // An answer read there: the quorum, or why the group is refused.
  struct Joined {
    std::optional<QuorumView> view;
    std::string refused;   // the coordinator refused the group: its reason
    bool leaving = false;  // the group's other ranks said bye: this rank ends too
    std::string internal;  // the answer contradicts this rank's state (a bug)
  };
  Joined on_answer(const Answer& a);
  // The group installed the source's state (every rank agreed the copy was whole).
  void healed();
  // Its process did not run for longer than the heartbeat timeout (a sleep
  // that long: stopped, or its host paused); a coordinator may have counted
  // it lost meanwhile.
  void held_up() { stalled_ = true; }
  // A beat or a wait reached a coordinator: the one it knew (which watched
  // the stall, if any, and judges it) or a new one. Held up while its
  // coordinator changed, the rank is suspect (Standing::suspect). `after`:
  // the call was made after the stall (a reply that waited through it says
  // nothing of the coordinator since).
  void reached(bool new_coordinator, bool after) {
    if (new_coordinator && stalled_) at_.suspect = true;
    if (new_coordinator || after) stalled_ = false;
  }
  // Its vote on the quorum it is in; asks for the next round too.
  RankMessage vote(bool ok, const std::string& why);
  std::string decision_key(const Keys& keys) const;
  // The decision read there.
  Outcome on_decision(const Decision& d);
  // The latest message again, for a coordinator that restarted: where the
  // rank stands now, and what it waits for (a request, or its vote).
  RankMessage resync();
  // Its goodbye: asks for a farewell (answer_key), which comes once every
  // rank of its last quorum read the outcome.
  RankMessage bye();
  // The quorum it is in (answered, outcome not read).
  const std::optional<QuorumView>& view() const { return view_; }

 private:
  RankMessage message(Kind k);
  GroupIdentity id_;
  int64_t seq_ = 0;
  int64_t round_ = 0;
  bool asked_ = false;  // the last vote asked for round_ already
  bool stalled_ = false;  // held up since it last reached a coordinator
  Standing at_;
  std::optional<QuorumView> view_;
  RankMessage last_;
};

}  // namespace fsdp::replicas
