// fsdp-cpp: what /proc says of a process — one reader, one answer per state.
// defines: proc::State, proc::read_state, proc::is_stopped, proc::is_gone,
//          proc::describe
//
// Used by the rank that judges a failed collective (are this host's peers
// alive, stopped or gone?), by the CMA transport (is a peer's memory still
// there?) and by `fsdp run` (what state is a rank in?). Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::proc {

// The state of a process, from /proc/<pid>/stat's state letter.
enum class State {
  Gone,         // no such process: /proc/<pid> does not exist
  Unreadable,   // /proc/<pid>/stat exists but could not be read or parsed
  Running,      // R
  Sleeping,     // S (also I, an idle kernel thread)
  DiskSleep,    // D: uninterruptible (disk or driver)
  Stopped,      // T: SIGSTOP, SIGTSTP, ...
  TracingStop,  // t: stopped by a debugger
  Zombie,       // Z: exited, not yet reaped by its parent
  Dead,         // X
  Other,        // any other letter (W, P, K, ...)
};

// The state of process `pid` now.
State read_state(int64_t pid);
// The state a /proc/<pid>/stat line says ("pid (comm) S ..."); Unreadable
// when it is not one.
State parse_stat_line(const std::string& line);
// Stopped or TracingStop.
bool is_stopped(State s);
// Gone, Zombie or Dead: the process no longer runs.
bool is_gone(State s);
// "running", "stopped (SIGSTOP)", "exited (zombie)", ...: `stop_signal`
// names the signal that stopped it, when known (0: not known).
std::string describe(State s, int stop_signal = 0);

}  // namespace fsdp::proc
