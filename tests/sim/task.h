// fsdp-cpp simulator: coroutines for processes that run in one thread under
// a deterministic scheduler (tests/sim/replica_sim.cpp).
// defines: sim::Task, sim::Scheduler
//
// A simulated process is a C++20 coroutine: it reads like the real code
// (a loop that waits for a key, a collective that waits for its peers), and
// every wait is a suspension the scheduler resumes at a simulated time.
// Killing a process destroys its coroutine frames; an event for a frame
// that is gone is skipped (each process counts its lives).
#pragma once

#include <coroutine>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

namespace sim {

namespace detail {
struct PromiseBase {
  std::coroutine_handle<> continuation;
  std::exception_ptr error;
  std::suspend_always initial_suspend() noexcept { return {}; }
  struct Final {
    bool await_ready() noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      auto c = h.promise().continuation;
      return c ? c : std::noop_coroutine();
    }
    void await_resume() noexcept {}
  };
  Final final_suspend() noexcept { return {}; }
  void unhandled_exception() { error = std::current_exception(); }
};
}  // namespace detail

// A coroutine that runs when awaited (or started) and resumes its awaiter
// when it finishes; an exception inside comes out of the co_await.
template <class T = void>
class Task {
 public:
  struct promise_type : detail::PromiseBase {
    std::optional<T> value;
    Task get_return_object() { return Task(std::coroutine_handle<promise_type>::from_promise(*this)); }
    void return_value(T v) { value = std::move(v); }
  };
  explicit Task(std::coroutine_handle<promise_type> h) : h_(h) {}
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~Task() {
    if (h_) h_.destroy();
  }
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> c) noexcept {
    h_.promise().continuation = c;
    return h_;
  }
  T await_resume() {
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
    return std::move(*h_.promise().value);
  }

 private:
  std::coroutine_handle<promise_type> h_;
};

template <>
class Task<void> {
 public:
  struct promise_type : detail::PromiseBase {
    Task get_return_object() { return Task(std::coroutine_handle<promise_type>::from_promise(*this)); }
    void return_void() {}
  };
  explicit Task(std::coroutine_handle<promise_type> h) : h_(h) {}
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~Task() {
    if (h_) h_.destroy();
  }
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> c) noexcept {
    h_.promise().continuation = c;
    return h_;
  }
  void await_resume() {
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
  }
  // A root task: started by the scheduler, never awaited.
  void start() { h_.resume(); }
  bool done() const { return h_ && h_.done(); }
  std::exception_ptr error() const { return h_ ? h_.promise().error : nullptr; }

 private:
  std::coroutine_handle<promise_type> h_;
};

// Simulated time in microseconds; events run in (time, order of scheduling).
class Scheduler {
 public:
  int64_t now() const { return now_; }
  void at(int64_t t, std::function<void()> fn) { q_.push(Ev{std::max(t, now_), seq_++, std::move(fn)}); }
  // Runs the next event; false when none is left.
  bool step() {
    if (q_.empty()) return false;
    Ev e = q_.top();
    q_.pop();
    now_ = e.at;
    e.fn();
    return true;
  }
  size_t pending() const { return q_.size(); }

 private:
  struct Ev {
    int64_t at;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Ev& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  std::priority_queue<Ev, std::vector<Ev>, std::greater<Ev>> q_;
  int64_t now_ = 0;
  uint64_t seq_ = 0;
};

}  // namespace sim
