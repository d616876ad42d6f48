// fsdp-cpp: how the communicators record into the flight recorder
// (include/fsdp/flight.h); the library's own hooks, not installed.
// defines: flight::Progress, flight::to_string(Progress::Waiting),
//          flight::enqueue, flight::start, flight::finish
//
// The observe layer offers this header to the layers above it
// (cmake/layers.cmake, EXPORTS): the communicators (src/comm) record every
// collective through it, the flight benchmark drives it directly. A program
// reads the recorder through fsdp/flight.h (snapshot, in_flight, dumps).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/flight.h"

namespace fsdp::flight {

// How far a running collective has got, and whom it waits on: live
// counters written by the thread that moves its bytes and read by the
// heartbeat and the dumps (relaxed atomics).
struct Progress {
  // What the transfer is blocked on, as dumps and heartbeats spell it.
  enum Waiting : int { NONE = 0, RECEIVE = 1, SEND = 2, READ = 3 };
  // Bytes received and sent so far, of the totals the collective moves.
  std::atomic<int64_t> recv_done{0}, recv_total{0}, sent_done{0}, send_total{0};
  std::atomic<int> peer{-1};        // the rank waited on now (-1: none)
  std::atomic<int> waiting{NONE};   // what for
  std::atomic<int64_t> moved_ns{0}; // steady_clock ns of the last bytes moved (0: none yet)

  // Now blocked on rank `p`, for `w`.
  void wait_on(int p, Waiting w) {
    peer.store(p, std::memory_order_relaxed);
    waiting.store(w, std::memory_order_relaxed);
  }
  // No longer blocked.
  void idle() { waiting.store(NONE, std::memory_order_relaxed); }
  // `n` more bytes received; bytes moved now.
  void arrived(int64_t n);
  // `n` more bytes sent; bytes moved now.
  void sent(int64_t n);
};
const char* to_string(Progress::Waiting w);  // "", "receive", "send", "read"

// Recording, by the communicators. enqueue() returns a ticket (0 when
// recording is off); start() and finish() on a ticket that the ring has
// since overwritten do nothing. start() returns the counters the transfer
// updates (never null: a private one when the ticket is gone). Lifetimes:
// the transfer and the ring's slot share the counters; the slot drops them
// at finish().
uint64_t enqueue(int comm, const char* kind, const std::string& unit, const char* dtype, int64_t numel,
                 int64_t bytes);
// The ticket's collective runs now, as sequence number `seq`.
std::shared_ptr<Progress> start(uint64_t ticket, uint64_t seq);
// The ticket's collective ended; a non-empty `error` marks it failed.
void finish(uint64_t ticket, const std::string& error = "");

}  // namespace fsdp::flight
