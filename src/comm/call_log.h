// fsdp-cpp: the books every communicator keeps of each collective, kept in
// one place for both backends.
// defines: Counters, CallLog, CallLog::Entered
//
// Per collective, in this order:
//   issued   the flight recorder's entry (queued), on the issuing thread;
//   entered  the next sequence number, the store's progress key (before
//            the flight recorder, and so the heartbeat, shows it started: a
//            rank that freezes inside has always told the others where),
//            the flight recorder's start, and a span on the trace's "comm"
//            track (the report's AG/RS lanes); on the thread that puts it on
//            the wire, in issue order (Gloo: the communication thread; NCCL:
//            the issuing thread);
//   finished the flight recorder's end, with the error when it failed;
//   counted  calls, bytes (the inter-host part apart) and seconds, added to
//            the communicator's counters and to every ancestor's, so a
//            world's counters() cover the groups split from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/checks.h"
#include "fsdp/comm.h"
#include "observe/flight_hooks.h"
#include "fsdp/trace.h"

namespace fsdp::comm {

class Rendezvous;

// One communicator's counters, and the ancestors' it also adds to. Shared:
// a group's Counters hold its parent's (which outlive neither).
class Counters {
 public:
  Counters();
  // A group split from `parent`: what it counts also counts in `parent`
  // and every ancestor of `parent`.
  static Counters child_of(const Counters& parent);

  CommCounters snapshot() const;  // thread-safe
  void reset();                   // this communicator's only
  // Applies `f` to kind's entry here and in every ancestor.
  void add(CollectiveKind kind, const std::function<void(CommCounters::Entry&)>& f);

 private:
  struct Box {
    mutable std::mutex mu;
    CommCounters c;  // guarded by mu
  };
  std::shared_ptr<Box> own_;
  std::vector<std::shared_ptr<Box>> ancestors_;  // nearest last
};

class CallLog {
 public:
  using Clock = std::chrono::steady_clock;

  // `comm`: the communicator's generation (the flight recorder and the
  // heartbeats name it). `rdv`: where the progress keys go; null when
  // there is no store (a world of one). It outlives the log.
  CallLog(int comm, Rendezvous* rdv, Counters counters);

  // On the issuing thread: the flight recorder's entry; returns its ticket.
  uint64_t issued(const CallShape& shape);

  // A collective from the moment it goes on the wire (see the top of this
  // file). Made on the one thread that starts this communicator's
  // collectives, in issue order.
  class Entered {
   public:
    Entered(CallLog& log, const CallShape& shape, uint64_t ticket);
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;
    double seconds() const { return std::chrono::duration<double>(Clock::now() - start).count(); }

    const std::string what;  // describe_call(shape)
    const uint64_t seq;
    // The transfer's live counters (never null).
    const std::shared_ptr<flight::Progress> progress;
    trace::Span span;  // args "unit" and "seq" set; the caller adds the bytes
    const Clock::time_point start;
  };

  // The flight recorder's end of `ticket`; a non-empty `error` marks it failed.
  void finished(uint64_t ticket, const std::string& error = "");
  // One collective's calls, bytes and seconds, here and in the ancestors.
  // `inter_host_logical`: what the inter-host bytes would have been
  // uncompressed; -1: inter_host_bytes (nothing crossed quantized).
  void count(CollectiveKind kind, int64_t bytes, int64_t inter_host_bytes, double seconds,
             int64_t inter_host_logical = -1);
  // Seconds known only later (NCCL: the GPU's time, once it completed).
  void add_seconds(CollectiveKind kind, double seconds);

  Counters& counters() { return counters_; }
  const Counters& counters() const { return counters_; }
  int comm() const { return comm_; }

 private:
  // The next sequence number, told to the store.
  uint64_t enter(const std::string& what);

  // Constant after construction.
  const int comm_;
  Rendezvous* const rdv_;

  Counters counters_;
  uint64_t seq_ = 0;  // touched only by the thread that makes Entered
};

}  // namespace fsdp::comm
