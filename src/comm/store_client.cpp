// fsdp-cpp: the bounded store client (see store_client.h).
#include "comm/store_client.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>

namespace fsdp::comm {
namespace {

// Named apart from rendezvous.cpp's bytes(): a unity batch may hold both files.
std::vector<uint8_t> value_bytes(const std::string& s) { return {s.begin(), s.end()}; }

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void StoreSession::set(const std::string& key, const std::string& value) { store_.set(key, value_bytes(value)); }

int64_t StoreSession::add(const std::string& key, int64_t delta) {
  const int64_t v = store_.add(key, delta);
  answered_();
  return v;
}

bool StoreSession::check(const std::string& key) {
  const bool there = store_.check({key});
  answered_();
  return there;
}

std::optional<std::string> StoreSession::get(const std::string& key) {
  if (!check(key)) return std::nullopt;
  auto b = store_.get(key);
  answered_();
  return std::string(b.begin(), b.end());
}

struct StoreClient::State {
  Connect connect;
  Periodic periodic;

  struct Request {
    std::vector<std::string> keys;
    std::vector<std::pair<std::string, std::string>> writes;
    std::optional<std::pair<std::string, int64_t>> add;
    int64_t added = 0;
    bool done = false, ok = false;
    std::vector<std::optional<std::string>> values;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Request>> requests;  // guarded by mu
  bool stop = false;                              // guarded by mu
  bool finished = false;                          // guarded by mu: the thread returned
  bool busy = false;                              // guarded by mu: inside a store call
  bool stuck = false;                             // guarded by mu: a caller gave up while busy

  std::atomic<int64_t> answered_ns{0};  // steady clock; 0 before the first answer
  std::function<void()> answered = [this] { answered_ns = steady_ns(); };

  // The thread's own; freed with the State, or dropped when a call threw (a
  // client's destructor only closes its socket; it waits for nobody).
  c10::intrusive_ptr<c10d::TCPStore> store;

  bool connected() {
    if (store) return true;
    try {
      store = connect();
      answered();
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  // Runs `work` on the connection; false (and the connection dropped) when
  // it could not connect or a call threw.
  bool on_store(const std::function<void(StoreSession&)>& work) {
    {
      std::lock_guard<std::mutex> lock(mu);
      busy = true;
    }
    bool ok = false;
    if (connected()) {
      try {
        StoreSession session(*store, answered);
        work(session);
        ok = true;
      } catch (const std::exception&) {
        store.reset();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    busy = false;
    stuck = false;
    return ok;
  }

  void serve(Request& q) {
    q.values.assign(q.keys.size(), std::nullopt);
    q.ok = on_store([&](StoreSession& s) {
      for (auto& [k, v] : q.writes) s.set(k, v);
      if (q.add) q.added = s.add(q.add->first, q.add->second);
      for (size_t i = 0; i < q.keys.size(); ++i) q.values[i] = s.get(q.keys[i]);
    });
  }

  void loop() {
    const bool periodic_on = periodic.every.count() > 0 && periodic.tick;
    auto next = std::chrono::steady_clock::now();
    for (;;) {
      std::deque<std::shared_ptr<Request>> todo;
      bool stopping;
      {
        std::unique_lock<std::mutex> lock(mu);
        auto ready = [&] { return stop || !requests.empty(); };
        if (periodic_on)
          cv.wait_until(lock, next, ready);
        else
          cv.wait(lock, ready);
        todo.swap(requests);
        stopping = stop;
      }
      for (auto& q : todo) {
        serve(*q);
        {
          std::lock_guard<std::mutex> lock(mu);
          q->done = true;
        }
        cv.notify_all();
      }
      if (stopping) {
        if (periodic.last) on_store(periodic.last);
        break;
      }
      if (periodic_on && std::chrono::steady_clock::now() >= next) {
        on_store(periodic.tick);
        next += periodic.every;
        const auto now = std::chrono::steady_clock::now();
        if (next < now) next = now;  // the thread was held up: no burst
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
    cv.notify_all();
  }

  // Queues `q` and waits for it at most `budget`.
  bool submit(const std::shared_ptr<Request>& q, std::chrono::milliseconds budget) {
    std::unique_lock<std::mutex> lock(mu);
    if (finished || stuck) return false;
    requests.push_back(q);
    cv.notify_all();
    if (cv.wait_for(lock, budget, [&] { return q->done; })) return q->ok;
    if (busy) stuck = true;  // the thread is inside a call that outlasted a caller
    return false;
  }
};

StoreClient::StoreClient(Connect connect, std::chrono::milliseconds stop_budget, Periodic periodic)
    : s_(std::make_shared<State>()) {
  s_->connect = std::move(connect);
  s_->periodic = std::move(periodic);
  stop_budget_ = stop_budget;
  auto s = s_;
  thread_ = std::thread([s] { s->loop(); });  // joined (bounded) by the destructor
}

StoreClient::StoreClient(Connect connect, std::chrono::milliseconds stop_budget)
    : StoreClient(std::move(connect), stop_budget, Periodic{}) {}

StoreClient::~StoreClient() {
  bool finished;
  {
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->stop = true;
    s_->cv.notify_all();
    // A thread stuck in a store call does not come back for a last tick.
    const auto wait = s_->stuck ? std::chrono::milliseconds(0) : stop_budget_;
    finished = s_->cv.wait_for(lock, wait, [&] { return s_->finished; });
  }
  if (!thread_.joinable()) return;
  if (finished)
    thread_.join();  // frees the connection with the State, on this thread
  else
    thread_.detach();  // still inside a store call past its budget: left behind, owning its State
}

std::optional<std::vector<std::optional<std::string>>> StoreClient::read(const std::vector<std::string>& keys,
                                                                         std::chrono::milliseconds budget) {
  auto q = std::make_shared<State::Request>();
  q->keys = keys;
  if (!s_->submit(q, budget)) return std::nullopt;
  return q->values;
}

std::optional<int64_t> StoreClient::add(const std::string& key, int64_t delta, std::chrono::milliseconds budget) {
  auto q = std::make_shared<State::Request>();
  q->add = std::make_pair(key, delta);
  if (!s_->submit(q, budget)) return std::nullopt;
  return q->added;
}

bool StoreClient::write(const std::string& key, const std::string& value, std::chrono::milliseconds budget) {
  auto q = std::make_shared<State::Request>();
  q->writes.push_back({key, value});
  return s_->submit(q, budget);
}

bool StoreClient::stuck() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->stuck;
}

double StoreClient::silent_for() const {
  const int64_t at = s_->answered_ns;
  if (at == 0) return 0;
  return std::max(0.0, (steady_ns() - at) / 1e9);
}

}  // namespace fsdp::comm
