// fsdp-cpp: a connection to the rendezvous store that never holds its
// caller past a budget.
// defines: StoreClient, StoreSession
//
// libtorch's TCPStore client blocks in its socket calls: a store whose host
// froze, or whose link was cut, leaves a get() hanging (the client's timeout
// applies to wait() only), and the store's daemon reads each request whole
// with blocking reads, so one client cut off halfway through a request
// blocks it for good. So every call goes through a thread of the client's
// own: the caller queues a request and waits at most its budget. Once a
// caller gave up on a request the thread is still inside, later calls fail
// at once (stuck()) until the thread comes back. The thread can also run
// periodic work on the same connection (the watchdog's heartbeat).
//
// Used by the rank's watchdog (comm/watchdog.h) and by the store a launcher
// hosts (comm/store_host.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace fsdp::comm {

// What the client's thread offers periodic work: the store calls, each of
// which throws when the connection failed (the client then drops it and
// reconnects on the next call).
class StoreSession {
 public:
  explicit StoreSession(c10d::TCPStore& store, const std::function<void()>& answered)
      : store_(store), answered_(answered) {}
  // Sets `key` (one way: no reply is awaited).
  void set(const std::string& key, const std::string& value);
  // Whether `key` exists (a round trip).
  bool check(const std::string& key);
  // Adds `delta` to the counter `key` (0 when absent); its new value.
  int64_t add(const std::string& key, int64_t delta);
  // `key`'s value; nullopt when it is absent (check first: a get of an
  // absent key would wait for it).
  std::optional<std::string> get(const std::string& key);

 private:
  c10d::TCPStore& store_;
  const std::function<void()>& answered_;
};

class StoreClient {
 public:
  // Opens the connection (called on the client's thread, again after a
  // failed call); throws when it cannot.
  using Connect = std::function<c10::intrusive_ptr<c10d::TCPStore>()>;
  // Work the thread runs on its connection every `every` (none when zero),
  // and once when the client stops.
  struct Periodic {
    // The period.
    std::chrono::microseconds every{0};
    // The periodic work.
    std::function<void(StoreSession&)> tick;
    // The last work, when the client stops (unless stuck).
    std::function<void(StoreSession&)> last;
  };

  // Starts the thread. `stop_budget`: how long the destructor waits for it
  // (a last tick and its store round trip) before leaving it behind.
  StoreClient(Connect connect, std::chrono::milliseconds stop_budget, Periodic periodic);
  // A client with no periodic work (reads and writes only).
  StoreClient(Connect connect, std::chrono::milliseconds stop_budget);
  // Stops the thread: joined when it returns within the stop budget (at
  // once when stuck), else left behind owning its connection.
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // The values of `keys` (nullopt for an absent key), or nullopt when the
  // store did not answer within `budget` (or the client is stuck).
  std::optional<std::vector<std::optional<std::string>>> read(const std::vector<std::string>& keys,
                                                              std::chrono::milliseconds budget);
  // Adds `delta` to the counter `key`; its new value, or nullopt when the
  // store did not answer within `budget`.
  std::optional<int64_t> add(const std::string& key, int64_t delta, std::chrono::milliseconds budget);
  // Sets `key`; true once sent within `budget`.
  bool write(const std::string& key, const std::string& value, std::chrono::milliseconds budget);
  // A caller gave up on a request the thread is still inside: calls fail
  // at once until it returns.
  bool stuck() const;
  // Seconds since the store last answered a round trip (0 before the first).
  double silent_for() const;

  struct State;  // shared with the thread (outlives *this when it is stuck)

 private:
  std::shared_ptr<State> s_;
  std::chrono::milliseconds stop_budget_;
  std::thread thread_;
};

}  // namespace fsdp::comm
