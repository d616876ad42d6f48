// fsdp-cpp: the communication thread of one communicator.
// defines: WorkQueue, CompletionWork
//
// Collectives must run in issue order on every rank, so each communicator owns
// exactly one thread that pops tasks FIFO. The first task that throws poisons
// the queue: it and every task still queued or submitted later complete with
// that same exception (a mesh is unusable after a timeout: Gloo fails all of
// it; and a rank that skipped a collective is out of step with the others
// for good).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "fsdp/comm.h"

namespace fsdp::comm {

// A Work that some thread completes once, with or without an error.
class CompletionWork final : public Work {
 public:
  void wait() override;
  bool is_completed() const override;
  void complete(std::exception_ptr error);  // idempotent: the first call wins

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;            // guarded by mu_
  std::exception_ptr error_;     // guarded by mu_
};

class WorkQueue {
 public:
  WorkQueue();
  // Runs what is queued (each task is bounded by its own timeout), then joins.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task`; once failed, returns a Work that already holds the error.
  WorkPtr submit(std::function<void()> task);
  // Marks the queue failed from outside a task (misuse found at issue time).
  void fail(std::exception_ptr error);
  // The error that poisoned the queue, or null.
  std::exception_ptr failure() const;

 private:
  struct Item {
    std::function<void()> task;
    std::shared_ptr<CompletionWork> work;
  };
  void loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;       // guarded by mu_
  std::exception_ptr failure_;   // guarded by mu_; set once
  bool stopping_ = false;        // guarded by mu_
  std::thread thread_;           // started last in the constructor
};

}  // namespace fsdp::comm
