// fsdp-cpp: the heartbeat thread of a process (see comm/watchdog.h).
#include "comm/watchdog.h"

#include <unistd.h>

#include <atomic>
#include <mutex>

#include "comm/cma.h"
#include "comm/rendezvous.h"
#include "comm/store_client.h"
#include "fsdp/errors.h"
#include "fsdp/flight.h"

namespace fsdp::comm {
namespace {

using watchdog::Heartbeat;

std::string host_name() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

// The store's client waits this long for a connection or a reply; the
// watchdog's stop waits for one last heartbeat within it (+1 s).
constexpr std::chrono::milliseconds kConnectTimeout{2000};

}  // namespace

// What the heartbeats say, and where every rank runs: written by the
// client's thread, read by the communicators.
struct Watchdog::Beats {
  WorldEnv world;
  std::string base;
  WatchClock clock;
  double interval = 1;
  std::string identity;  // host_identity()
  std::atomic<bool> failed{false};
  int64_t beats = 0;  // the thread's own

  mutable std::mutex mu;
  std::vector<std::optional<Watchdog::Where>> where;  // guarded by mu
  bool where_done = false;                            // the thread's own
  int where_tries = 0;                                // the thread's own

  Heartbeat beat(bool left) {
    Heartbeat h;
    h.rank = world.rank;
    h.pid = getpid();
    h.host = host_name();
    h.time = clock.wall();
    h.beat = ++beats;
    h.interval = interval;
    h.left = left;
    h.dumps_on_signal = flight::dumps_on_signal();
    h.step = current_step();
    h.phase = failed ? std::string("failed") : std::string(to_string(current_phase()));
    flight::Record r;
    if (!left && flight::in_flight(&r)) {
      h.comm = r.comm;
      h.seq = r.seq;
      h.kind = r.kind;
      h.unit = r.unit;
      h.peer = r.peer;
      h.waiting = r.waiting;
      h.recv_done = r.recv_done;
      h.recv_total = r.recv_total;
      h.started = r.started;
      h.moved = r.moved;
    }
    return h;
  }

  std::string key() const { return base + "hb/" + std::to_string(world.rank); }

  // Every interval: the heartbeat (a set, then a check: a round trip, so
  // the store is known to answer as of now), then, until every rank's is
  // known, where the ranks run.
  void tick(StoreSession& s) {
    s.set(key(), beat(false).to_json().dump());
    s.check(key());
    learn_where(s);
  }

  // Once, when the process's last communicator closed cleanly.
  void last(StoreSession& s) {
    if (!failed) s.set(key(), beat(true).to_json().dump());
  }

  // Every rank's host and pid ("where/<q>"), written once and read until
  // all are there (or for a minute of ticks).
  void learn_where(StoreSession& s) {
    if (where_done) return;
    if (where_tries++ == 0)
      s.set(base + "where/" + std::to_string(world.rank),
            nlohmann::json{{"host", host_name()}, {"identity", identity}, {"pid", int64_t(getpid())}}.dump());
    std::vector<std::optional<Watchdog::Where>> got(world.world_size);
    bool all = true;
    for (int q = 0; q < world.world_size; ++q) {
      auto v = s.get(base + "where/" + std::to_string(q));
      if (!v) {
        all = false;
        continue;
      }
      auto j = nlohmann::json::parse(*v, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;
      got[q] = Watchdog::Where{j.value("host", ""), j.value("identity", ""), j.value("pid", int64_t(0))};
    }
    std::lock_guard<std::mutex> lock(mu);
    where = got;
    where_done = all || where_tries > 60;
  }
};

namespace {
std::mutex g_mu;
std::weak_ptr<Watchdog> g_dog;  // guarded by g_mu: the process's running watchdog
}  // namespace

std::shared_ptr<Watchdog> Watchdog::acquire(const WorldEnv& world, const std::string& base,
                                            const ResolvedOptions& opts, WatchClock clock) {
  std::lock_guard<std::mutex> g(g_mu);
  if (auto d = g_dog.lock()) return d;
  auto b = std::make_shared<Beats>();
  b->world = world;
  b->base = base;
  b->clock = std::move(clock);
  b->identity = host_identity(opts.host_id);
  b->interval = opts.heartbeat_interval.count() / 1000.0;
  flight::set_identity(world.rank, world.world_size);
  StoreClient::Periodic beats;
  beats.every = std::chrono::microseconds(int64_t(b->interval * 1e6));
  beats.tick = [b](StoreSession& s) { b->tick(s); };
  beats.last = [b](StoreSession& s) { b->last(s); };
  auto client = std::make_unique<StoreClient>([world] { return connect_store_client(world, kConnectTimeout); },
                                              kConnectTimeout + std::chrono::seconds(1), std::move(beats));
  auto d = std::shared_ptr<Watchdog>(new Watchdog(b, std::move(client)));
  g_dog = d;
  return d;
}

Watchdog::Watchdog(std::shared_ptr<Beats> b, std::unique_ptr<StoreClient> client)
    : b_(std::move(b)), client_(std::move(client)) {}

Watchdog::~Watchdog() = default;  // the client's destructor sends the last heartbeat and stops its thread

double Watchdog::interval() const { return b_->interval; }
double Watchdog::silent_after() const { return 3 * b_->interval; }
double Watchdog::store_silent_for() const { return client_->silent_for(); }
const std::string& Watchdog::base() const { return b_->base; }
void Watchdog::mark_failed() { b_->failed = true; }

std::vector<std::optional<Watchdog::Where>> Watchdog::where() const {
  std::lock_guard<std::mutex> lock(b_->mu);
  return b_->where;
}
const std::string& Watchdog::identity() const { return b_->identity; }
const WatchClock& Watchdog::clock() const { return b_->clock; }

std::optional<std::vector<std::optional<std::string>>> Watchdog::read(const std::vector<std::string>& keys,
                                                                     std::chrono::milliseconds budget) {
  return client_->read(keys, budget);
}

bool Watchdog::write(const std::string& key, const std::string& value, std::chrono::milliseconds budget) {
  return client_->write(key, value, budget);
}

}  // namespace fsdp::comm
