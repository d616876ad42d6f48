// fsdp-cpp: `fsdp run --nnodes MIN:MAX`, the launchers' rendezvous rounds.
// defines: elastic::Settings, elastic::Round, elastic::Check, elastic::Ended,
//          elastic::Rendezvous
//
// The semantics of torchrun's elastic agent with its c10d rendezvous, kept
// small. Node 0 (--node-rank 0) hosts a store for the whole job at
// --master-addr:--master-port and decides each round; every launcher
// (node 0 too) writes a heartbeat there every 250 ms. Keys, under
// "<job key base>elastic/":
//   alive/<id>       the launcher's heartbeat (a counter; node 0 watches it change)
//   join/<id>        the round the launcher waits to join
//   next             the round node 0 forms next (a newcomer joins that one)
//   round/<n>        "PORT ID ID ...": round n's members (node ids, ascending)
//                    and the port of the ranks' store of that round
//   stop/<n>         why round n ends (any member's ranks failed, or node 0
//                    saw a member's heartbeat stop)
//   done/<n>/<id>    the member's ranks all exited 0
//   end              node 0's last word to the launchers still waiting
//                    (fewer than MIN nodes, the restart budget spent)
// Round n is closed when MAX launchers joined, or MIN joined and
// --rdzv-settle seconds passed with no new one (torchrun's last call); a
// launcher that joins later waits for the next round: node 0 sees it waiting
// and ends the running round so that the next one has it (torchrun's agent
// restarts its workers when nodes wait, too); such a restart resumes from
// the newest checkpoint like any other but spends none of --max-restarts. Each
// round gets a fresh store for its ranks on a new port, so no key of a dead
// round reaches the next. Node ids are the launchers' --node-rank; a round's
// node ranks are their order, so node 0 is always node rank 0 (it hosts).
// Losing node 0 ends the job: the store is gone with it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace fsdp::comm {
class StoreClient;
}
namespace fsdp::watchdog {
class StoreHost;
}

namespace fsdp::tools::elastic {

// Constant for the job: fsdp run's flags.
struct Settings {
  std::string addr;       // --master-addr
  int port = 0;           // --master-port: the launchers' store
  int id = 0;             // --node-rank: this launcher's node id
  int min_nodes = 1, max_nodes = 1;
  double settle_s = 2;    // --rdzv-settle
  double timeout_s = 60;  // --rdzv-timeout: how long a round waits for MIN nodes
  std::string base;       // the job's key base (watchdog::key_base of FSDP_JOB_TOKEN)
  bool bind_all = false;  // FSDP_STORE_BIND=all
};

// One round's membership.
struct Round {
  int number = 0;
  std::vector<int> members;  // node ids, ascending (members[0] is node 0)
  int port = 0;              // MASTER_PORT of the round's ranks
  // This node's rank in the round (its index in members).
  int node_rank(int id) const;
  // "0,2".
  std::string member_list() const;
};

// What a look at the store during a round found.
struct Check {
  std::string stop;     // why the round must stop ("": keep running)
  bool fatal = false;   // node 0 is gone: the job cannot go on
  bool grow = false;    // node 0: a launcher waits to join (not a failure: no restart spent)
};

// The job ends here, with this message (fewer than MIN nodes, node 0 lost,
// the restart budget spent).
struct Ended : std::runtime_error {
  explicit Ended(const std::string& why) : std::runtime_error(why) {}
};

class Rendezvous {
 public:
  // Node 0 starts the store (throws fsdp::Error when its port is taken);
  // every node starts its heartbeat.
  explicit Rendezvous(Settings s);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  bool hosts() const { return s_.id == 0; }
  // Node 0: waits until round n can close and returns its members; throws
  // Ended (after writing `end`) when fewer than MIN joined in time.
  std::vector<int> gather(int n);
  // Node 0: makes the round known.
  void publish(const Round& r);
  // Node 0: ends the job for the launchers still waiting.
  void end(const std::string& why);
  // Other nodes: waits for the first round from n on that has this node;
  // throws Ended on node 0's `end`, or when node 0 is gone.
  Round await(int n);
  // During a round, at most every 250 ms (else an empty Check).
  Check check(const Round& r);
  // This node's ranks failed (or it was interrupted): round n ends.
  void stop_round(int n, const std::string& why);
  // This node's ranks all exited 0.
  void done(int n);
  // Node 0: waits (at most timeout_s) until every other member is done or silent.
  void wait_done(const Round& r, double timeout_s);
  // "127.0.0.1:29500".
  std::string where() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::optional<std::vector<std::optional<std::string>>> read(const std::vector<std::string>& keys);
  void write(const std::string& key, const std::string& value);
  // Records node `id`'s heartbeat value; seconds since it last changed.
  double silent(int id, const std::optional<std::string>& beat);
  std::string node0_gone() const;

  const Settings s_;
  const std::string k_;  // s_.base + "elastic/"
  std::unique_ptr<watchdog::StoreHost> host_;  // node 0 only; outlives client_
  std::unique_ptr<comm::StoreClient> client_;
  std::map<int, std::pair<std::string, Clock::time_point>> beats_;  // id -> last value, when it changed
  Clock::time_point last_check_{};
  Clock::time_point last_answer_;  // the store last answered a read
  bool answered_ = false;
};

}  // namespace fsdp::tools::elastic
