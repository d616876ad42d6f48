// fsdp-cpp: the launchers' rendezvous rounds (see elastic.h).
#include "elastic.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <thread>

#include "comm/rendezvous.h"
#include "comm/store_client.h"
#include "comm/store_host.h"
#include "fsdp/errors.h"

namespace fsdp::tools::elastic {
namespace {

constexpr auto kBeatEvery = std::chrono::milliseconds(250);
constexpr auto kReadBudget = std::chrono::milliseconds(1500);
constexpr auto kConnectTimeout = std::chrono::milliseconds(1000);
// A launcher whose heartbeat did not change for this long is gone (its
// process group was killed, its host froze, or its link was cut).
constexpr double kSilentS = 3.0;

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", s);
  return b;
}

std::string id_list(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s.empty() ? "none" : s;
}

}  // namespace

int Round::node_rank(int id) const {
  auto it = std::find(members.begin(), members.end(), id);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

std::string Round::member_list() const { return id_list(members); }

Rendezvous::Rendezvous(Settings s) : s_(std::move(s)), k_(s_.base + "elastic/"), last_answer_(Clock::now()) {
  if (hosts())
    host_ = std::make_unique<watchdog::StoreHost>(s_.addr, s_.port, std::chrono::seconds(60), s_.bind_all);
  const std::string addr = s_.addr;
  const int port = s_.port;
  auto counter = std::make_shared<long long>(0);
  comm::StoreClient::Periodic beat;
  beat.every = kBeatEvery;
  beat.tick = [key = k_ + "alive/" + std::to_string(s_.id), counter](comm::StoreSession& session) {
    session.set(key, std::to_string(++*counter));
  };
  client_ = std::make_unique<comm::StoreClient>(
      [addr, port] { return comm::connect_store_client(addr, port, kConnectTimeout); },
      std::chrono::milliseconds(1000), std::move(beat));
}

Rendezvous::~Rendezvous() {
  client_.reset();  // before the store it talks to
  host_.reset();
}

std::string Rendezvous::where() const { return s_.addr + ":" + std::to_string(s_.port); }

std::optional<std::vector<std::optional<std::string>>> Rendezvous::read(const std::vector<std::string>& keys) {
  auto v = client_->read(keys, kReadBudget);
  if (v) {
    answered_ = true;
    last_answer_ = Clock::now();
  }
  return v;
}

void Rendezvous::write(const std::string& key, const std::string& value) { client_->write(key, value, kReadBudget); }

double Rendezvous::silent(int id, const std::optional<std::string>& beat) {
  const auto now = Clock::now();
  auto it = beats_.find(id);
  const std::string value = beat.value_or("");
  if (it == beats_.end()) {
    // First sight counts as fresh (a launcher's first beat may not have
    // landed yet); it must change within kSilentS from now on.
    beats_[id] = {value, now};
    return 0;
  }
  if (it->second.first != value) it->second = {value, now};
  return std::chrono::duration<double>(now - it->second.second).count();
}

std::string Rendezvous::node0_gone() const {
  const double quiet = std::chrono::duration<double>(Clock::now() - last_answer_).count();
  return detail::cat("node 0 is gone: the launcher that hosts the rendezvous store at ", where(),
                     " has not answered for ", seconds_text(quiet),
                     " s, and the job cannot continue without it (as with torchrun's c10d rendezvous, the store "
                     "lives on node 0). Start the job again on every node; with --resume the program continues "
                     "from its last checkpoint.");
}

std::vector<int> Rendezvous::gather(int n) {
  write(k_ + "next", std::to_string(n));
  const auto start = Clock::now();
  std::optional<Clock::time_point> min_since;
  std::vector<int> joined;
  for (;;) {
    std::vector<std::string> keys;
    for (int id = 1; id < s_.max_nodes; ++id) {
      keys.push_back(k_ + "join/" + std::to_string(id));
      keys.push_back(k_ + "alive/" + std::to_string(id));
    }
    joined = {0};
    if (auto v = read(keys)) {
      for (int id = 1; id < s_.max_nodes; ++id) {
        const auto& join = (*v)[2 * (id - 1)];
        const double quiet = silent(id, (*v)[2 * (id - 1) + 1]);
        if (join && *join == std::to_string(n) && quiet < kSilentS) joined.push_back(id);
      }
    }
    const int k = static_cast<int>(joined.size());
    if (k >= s_.max_nodes) return joined;
    const auto now = Clock::now();
    if (k >= s_.min_nodes) {
      if (!min_since) min_since = now;
      if (std::chrono::duration<double>(now - *min_since).count() >= s_.settle_s) return joined;
    } else {
      min_since.reset();
      const double waited = std::chrono::duration<double>(now - start).count();
      if (waited > s_.timeout_s) {
        const std::string why = detail::cat(
            "the job needs at least ", s_.min_nodes, " nodes (--nnodes ", s_.min_nodes, ":", s_.max_nodes,
            ") but only ", k, " joined round ", n, " within ", seconds_text(s_.timeout_s), " s (node",
            k == 1 ? " " : "s ", id_list(joined), "); ending the job. Start it again on at least ", s_.min_nodes,
            " nodes (with --resume the program continues from its last checkpoint), or run with a smaller MIN; "
            "--rdzv-timeout sets how long a round waits for MIN nodes.");
        end(why);
        throw Ended(why);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void Rendezvous::publish(const Round& r) {
  std::string v = std::to_string(r.port);
  for (int id : r.members) v += " " + std::to_string(id);
  write(k_ + "round/" + std::to_string(r.number), v);
  write(k_ + "next", std::to_string(r.number + 1));
  read({k_ + "next"});  // a round trip: both writes reached the store
}

void Rendezvous::end(const std::string& why) {
  write(k_ + "end", why);
  read({k_ + "end"});
  // The others poll every 100 ms: give them a moment before the store closes.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
}

Round Rendezvous::await(int n) {
  const auto start = Clock::now();
  int asked = -1;
  for (;;) {
    auto v = read({k_ + "end", k_ + "next", k_ + "round/" + std::to_string(n), k_ + "alive/0"});
    const auto now = Clock::now();
    if (!v) {
      const double waited = std::chrono::duration<double>(now - (answered_ ? last_answer_ : start)).count();
      if (answered_ && waited > kSilentS) throw Ended(node0_gone());
      if (!answered_ && waited > s_.timeout_s)
        throw Ended(detail::cat("no rendezvous store answered at ", where(), " within ",
                                seconds_text(s_.timeout_s), " s: is node 0 (--node-rank 0) started with the same "
                                "--master-addr and --master-port? (--rdzv-timeout sets the wait)"));
    } else {
      if ((*v)[0]) throw Ended(*(*v)[0]);
      if (silent(0, (*v)[3]) > kSilentS) throw Ended(node0_gone());
      const int next = (*v)[1] ? std::atoi((*v)[1]->c_str()) : 0;
      if ((*v)[2]) {
        std::istringstream in(*(*v)[2]);
        Round r;
        r.number = n;
        in >> r.port;
        for (int id; in >> id;) r.members.push_back(id);
        if (r.node_rank(s_.id) >= 0) return r;
        ++n;  // closed without this node (it came late): the next one
        std::fprintf(stderr, "fsdp run: round %d runs without node %d (nodes %s); node %d joins round %d, which "
                             "starts once node 0 ends the running one\n",
                     r.number, s_.id, r.member_list().c_str(), s_.id, n);
        std::fflush(stderr);
      } else if (next - 1 > n) {
        n = next - 1;  // a newcomer: the round last published (or the one being formed)
      }
    }
    if (asked != n) {
      write(k_ + "join/" + std::to_string(s_.id), std::to_string(n));
      asked = n;
      continue;  // read round/<n> of the new n at once
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Check Rendezvous::check(const Round& r) {
  const auto now = Clock::now();
  if (now - last_check_ < kBeatEvery) return {};
  last_check_ = now;
  const std::string stop_key = k_ + "stop/" + std::to_string(r.number);
  std::vector<std::string> keys{stop_key};
  std::vector<int> watched;
  if (hosts()) {
    for (int id : r.members)
      if (id != 0) watched.push_back(id);
  } else {
    watched.push_back(0);
  }
  for (int id : watched) keys.push_back(k_ + "alive/" + std::to_string(id));
  std::vector<int> outside;  // node 0: launchers that are no members, and may wait for the next round
  if (hosts())
    for (int id = 1; id < s_.max_nodes; ++id)
      if (r.node_rank(id) < 0) {
        outside.push_back(id);
        keys.push_back(k_ + "join/" + std::to_string(id));
        keys.push_back(k_ + "alive/" + std::to_string(id));
      }
  auto v = read(keys);
  if (!v) {
    if (!hosts() && std::chrono::duration<double>(now - last_answer_).count() > kSilentS)
      return {node0_gone(), true};
    return {};
  }
  if ((*v)[0]) return {*(*v)[0], false};
  for (size_t i = 0; i < watched.size(); ++i) {
    const double quiet = silent(watched[i], (*v)[1 + i]);
    if (quiet <= kSilentS) continue;
    if (!hosts()) return {node0_gone(), true};
    const std::string why = detail::cat("node ", watched[i], "'s launcher stopped answering (no heartbeat for ",
                                        seconds_text(quiet), " s)");
    write(stop_key, why);
    return {why, false};
  }
  const size_t at = 1 + watched.size();
  for (size_t i = 0; i < outside.size(); ++i) {
    const auto& join = (*v)[at + 2 * i];
    const double quiet = silent(outside[i], (*v)[at + 2 * i + 1]);
    if (!join || *join != std::to_string(r.number + 1) || quiet > kSilentS) continue;
    const std::string why = detail::cat("node ", outside[i], " is waiting to join: the next round grows to ",
                                        r.members.size() + 1, " nodes");
    write(stop_key, why);
    return {why, false, true};
  }
  return {};
}

void Rendezvous::stop_round(int n, const std::string& why) {
  write(k_ + "stop/" + std::to_string(n), why);
}

void Rendezvous::done(int n) {
  write(k_ + "done/" + std::to_string(n) + "/" + std::to_string(s_.id), "1");
  read({k_ + "next"});  // a round trip: the write reached the store
}

void Rendezvous::wait_done(const Round& r, double timeout_s) {
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < timeout_s) {
    std::vector<std::string> keys;
    std::vector<int> others;
    for (int id : r.members)
      if (id != 0) {
        others.push_back(id);
        keys.push_back(k_ + "done/" + std::to_string(r.number) + "/" + std::to_string(id));
        keys.push_back(k_ + "alive/" + std::to_string(id));
      }
    auto v = read(keys);
    if (!v) return;
    bool all = true;
    for (size_t i = 0; i < others.size(); ++i)
      if (!(*v)[2 * i] && silent(others[i], (*v)[2 * i + 1]) <= kSilentS) all = false;
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace fsdp::tools::elastic
