// fsdp-cpp: the communication thread (see work_queue.h).
#include "comm/work_queue.h"

#include "fsdp/memory.h"

namespace fsdp::comm {

void CompletionWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool CompletionWork::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void CompletionWork::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

WorkQueue::WorkQueue() : thread_([this] { loop(); }) {}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

WorkPtr WorkQueue::submit(std::function<void()> task) {
  auto work = std::make_shared<CompletionWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_) {
      items_.push_back({std::move(task), work});
      cv_.notify_one();
      return work;
    }
  }
  work->complete(failure());
  return work;
}

void WorkQueue::fail(std::exception_ptr error) {
  std::deque<Item> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_) failure_ = error;
    dropped.swap(items_);
  }
  for (auto& it : dropped) it.work->complete(failure());
}

std::exception_ptr WorkQueue::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void WorkQueue::loop() {
  // What the collectives allocate here (staging) is communication buffers
  // in the process's memory breakdown (fsdp/memory.h).
  memory::CommBuffers comm_buffers;
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
      if (items_.empty()) return;  // stopping and drained
      item = std::move(items_.front());
      items_.pop_front();
      if (failure_) {
        lock.unlock();
        item.work->complete(failure());
        continue;
      }
    }
    // The task's captures (the call's tensors) are released before the
    // waiter wakes: otherwise its buffers outlive wait() by a race and the
    // caller's next allocation finds them still counted (the peak).
    try {
      item.task();
      item.task = nullptr;
      item.work->complete(nullptr);
    } catch (...) {
      auto error = std::current_exception();
      item.task = nullptr;
      fail(error);
      item.work->complete(failure());
    }
  }
}

}  // namespace fsdp::comm
