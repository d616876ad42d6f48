// fsdp-cpp: the /proc/<pid>/stat reader (see proc_state.h).
#include "common/proc_state.h"

#include "common/env.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <sys/stat.h>

namespace fsdp::proc {

State parse_stat_line(const std::string& line) {
  // "pid (comm) S ...": comm may hold spaces and parentheses; the state is
  // the letter after the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return State::Unreadable;
  switch (line[close + 2]) {
    case 'R': return State::Running;
    case 'S':
    case 'I': return State::Sleeping;
    case 'D': return State::DiskSleep;
    case 'T': return State::Stopped;
    case 't': return State::TracingStop;
    case 'Z': return State::Zombie;
    case 'X':
    case 'x': return State::Dead;
    default: return State::Other;
  }
}

State read_state(int64_t pid) {
  if (pid <= 0) return State::Unreadable;
  const std::string dir = "/proc/" + std::to_string(pid);
  std::string line = ::fsdp::detail::read_proc_text(dir + "/stat", 4096);
  if (const auto nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
  if (line.empty())
    return ::fsdp::detail::env().kind(dir) == ::fsdp::detail::FileKind::kNone ? State::Gone : State::Unreadable;
  return parse_stat_line(line);
}

bool is_stopped(State s) { return s == State::Stopped || s == State::TracingStop; }

bool is_gone(State s) { return s == State::Gone || s == State::Zombie || s == State::Dead; }

std::string describe(State s, int stop_signal) {
  switch (s) {
    case State::Running: return "running";
    case State::Sleeping: return "sleeping";
    case State::DiskSleep: return "in uninterruptible sleep (disk or driver)";
    case State::Stopped: {
      const char* abbrev = stop_signal ? sigabbrev_np(stop_signal) : nullptr;
      return abbrev ? std::string("stopped (SIG") + abbrev + ")" : "stopped";
    }
    case State::TracingStop: return "stopped by a debugger (tracing stop)";
    case State::Zombie: return "exited (zombie)";
    case State::Dead: return "dead";
    case State::Gone: return "gone";
    case State::Unreadable:
    case State::Other: break;
  }
  return "unknown";
}

}  // namespace fsdp::proc
