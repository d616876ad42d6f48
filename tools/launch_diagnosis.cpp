// fsdp-cpp: naming the rank that stopped a job (see launch_diagnosis.h).
#include "launch_diagnosis.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "fsdp/errors.h"

namespace fsdp::tools::diagnosis {

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? detail::cat("SIG", abbrev, " (", sig, ")") : detail::cat("signal ", sig);
}

std::string rank_list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return (v.size() == 1 ? "rank " : "ranks ") + s;
}

std::string clock_time(double wall) {
  std::time_t t = static_cast<std::time_t>(wall);
  std::tm tm{};
  localtime_r(&t, &tm);
  char b[16];
  std::strftime(b, sizeof b, "%H:%M:%S", &tm);
  return b;
}

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

std::vector<int> ranks_to_read(const Evidence& ev) {
  std::vector<int> out;
  for (const auto& r : ev.local) out.push_back(r.global);
  for (const auto& [q, v] : ev.verdicts)
    for (int c : v.culprits)
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  return out;
}

namespace {

bool exited_cleanly(const RankFacts& r) { return WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0; }

const Records& records_of(const Evidence& ev, int global) {
  static const Records none;
  auto it = ev.records.find(global);
  return it == ev.records.end() ? none : it->second;
}

int local_index(const Evidence& ev, int global) {
  for (size_t i = 0; i < ev.local.size(); ++i)
    if (ev.local[i].global == global) return static_cast<int>(i);
  return -1;
}

// The ranks whose verdicts name `culprit` (else this node's ranks that failed
// on their own), and whether any of them timed out.
void waiting_for(const Evidence& ev, Finding& f) {
  f.waiting.clear();
  f.waiting_timed_out = false;
  for (const auto& [q, v] : ev.verdicts)
    if (q != f.culprit && std::find(v.culprits.begin(), v.culprits.end(), f.culprit) != v.culprits.end()) {
      f.waiting.push_back(q);
      f.waiting_timed_out |= v.timed_out;
    }
  if (f.waiting.empty())
    for (const auto& r : ev.local)
      if (r.global != f.culprit && !r.running && !exited_cleanly(r) && !r.signaled_by_us) f.waiting.push_back(r.global);
}

}  // namespace

Finding decide(const Evidence& ev) {
  Finding f;
  if (ev.first < 0 || ev.first >= static_cast<int>(ev.local.size())) return f;
  const RankFacts& first = ev.local[ev.first];
  // 1. A local rank killed by a signal the launcher did not send.
  if (WIFSIGNALED(first.status)) {
    f.kind = Finding::Kind::Killed;
    f.culprit = first.global;
    f.local = ev.first;
    waiting_for(ev, f);
    return f;
  }
  // 2. A local rank that is stopped: continued once to dump its flight
  // recorder (when it can), then stopped with the others.
  for (size_t i = 0; i < ev.local.size(); ++i) {
    const RankFacts& r = ev.local[i];
    if (!r.running || (!proc::is_stopped(r.state) && !r.stop_signal)) continue;
    f.kind = Finding::Kind::Stopped;
    f.culprit = r.global;
    f.local = static_cast<int>(i);
    f.print_now = true;
    const auto& h = records_of(ev, r.global).beat;
    f.ask_dump = f.continue_first = h && h->dumps_on_signal;
    waiting_for(ev, f);
    return f;
  }
  // 3. The rank the verdicts name most often (any node).
  std::map<int, int> named;
  for (const auto& [q, v] : ev.verdicts)
    for (int c : v.culprits) named[c]++;
  int culprit = -1;
  for (auto& [c, n] : named)
    if (culprit < 0 || n > named[culprit]) culprit = c;
  if (culprit < 0) return f;
  f.kind = Finding::Kind::Named;
  f.culprit = culprit;
  f.local = local_index(ev, culprit);
  f.print_now = true;
  bool desync = false, dead = false;
  for (const auto& [q, v] : ev.verdicts) {
    if (std::find(v.culprits.begin(), v.culprits.end(), culprit) == v.culprits.end()) continue;
    f.judge = q;
    desync |= std::find(v.desync.begin(), v.desync.end(), culprit) != v.desync.end();
    dead |= std::find(v.dead.begin(), v.dead.end(), culprit) != v.dead.end();
  }
  const auto& h = records_of(ev, culprit).beat;
  const double silent_after = h ? 3 * h->interval : 3;
  f.named = desync ? Finding::Named::Desync
            : dead ? Finding::Named::Dead
            : h && ev.now - h->time <= silent_after && !h->left ? Finding::Named::AliveElsewhere
                                                                : Finding::Named::Unresponsive;
  waiting_for(ev, f);
  // A live local culprit (a busy loop) is stopped with the others; it dumps
  // first when it can.
  f.ask_dump = f.local >= 0 && ev.local[f.local].running && h && h->dumps_on_signal;
  return f;
}

// ---------------------------------------------------------------------------
// The words.

namespace {

// "in all_gather 'blocks.1' #86 (step 3, backward)": the collective entered
// after the last heartbeat is the newer news (entries are written as they
// happen; a frozen rank's last beat may be up to an interval older).
std::string place(const Evidence& ev, int q) {
  const auto& [h, e] = records_of(ev, q);
  if (e && e->seq > 0 && (!h || e->time >= h->time)) return "in " + watchdog::describe_place(*e);
  if (h && h->seq > 0) return "in " + watchdog::describe_place(*h);
  if (h)
    return "in " + watchdog::describe_place(*h) +
           (e && e->seq > 0 ? ", last entered " + watchdog::describe_place(*e) : "");
  return "";
}

std::string who_text(const Finding& f, const char* verb_timed, const char* verb_failed) {
  if (f.waiting.empty()) return std::string();
  return "; " + rank_list(f.waiting) + (f.waiting_timed_out ? verb_timed : verb_failed);
}

std::string dash(const std::string& s) { return s.empty() ? "" : " — " + s; }

}  // namespace

std::string cause_text(const Evidence& ev, const Finding& f) {
  const std::string pl = place(ev, f.culprit);
  const auto& h = records_of(ev, f.culprit).beat;
  switch (f.kind) {
    case Finding::Kind::None: return "";
    case Finding::Kind::Killed: {
      const RankFacts& r = ev.local[f.local];
      const int sig = WTERMSIG(r.status);
      return detail::cat("rank ", r.global, " (local rank ", r.local, ", pid ", r.pid, ") was killed by signal ",
                         signal_name(sig), sig == SIGKILL ? " (the kernel's out-of-memory killer sends SIGKILL too)" : "",
                         " at ", clock_time(r.exited_at), dash(pl),
                         who_text(f, " timed out waiting for it", " failed after it"));
    }
    case Finding::Kind::Stopped: {
      const RankFacts& r = ev.local[f.local];
      const double since = h ? h->time : r.stopped_at;
      // /proc unreadable or gone, yet waitpid saw it stop: stopped.
      const proc::State st =
          r.state == proc::State::Unreadable || r.state == proc::State::Gone ? proc::State::Stopped : r.state;
      return detail::cat("rank ", r.global, " (pid ", r.pid, ") stopped responding at ",
                         clock_time(since > 0 ? since : ev.now), " — ",
                         h ? "no heartbeat for " + seconds_text(ev.now - h->time) + ", " : std::string(),
                         "process state: ", proc::describe(st, r.stop_signal), dash(pl),
                         who_text(f, " timed out waiting for it", " failed after it"), ".");
    }
    case Finding::Kind::Named: break;
  }
  const RankFacts* local = f.local >= 0 ? &ev.local[f.local] : nullptr;
  const std::string who = local ? detail::cat("rank ", f.culprit, " (pid ", local->pid, ")")
                          : h   ? detail::cat("rank ", f.culprit, " (pid ", h->pid, " on ", h->host, ")")
                                : detail::cat("rank ", f.culprit);
  std::string state;
  if (local) {
    if (!local->running)
      state = detail::cat(", process ",
                          WIFSIGNALED(local->status) ? "killed by " + signal_name(WTERMSIG(local->status))
                                                     : detail::cat("exited with code ", WEXITSTATUS(local->status)));
    else
      state = ", process state: " + proc::describe(local->state, local->stop_signal);
  }
  switch (f.named) {
    case Finding::Named::Desync: {
      const watchdog::Verdict& theirs = ev.verdicts.at(f.judge);
      return detail::cat(who, " issued a different collective", dash(pl), " — while ", rank_list(f.waiting),
                         " waited in ", theirs.kind, theirs.unit.empty() ? "" : " '" + theirs.unit + "'", " #",
                         theirs.seq, " (a desync: every rank must issue the same collectives in the same order)",
                         state, ".");
    }
    case Finding::Named::Dead:
      return detail::cat(who, " is dead (its process is gone)", state, dash(pl),
                         who_text(f, " timed out waiting for it", " failed after it"), ".");
    case Finding::Named::AliveElsewhere:
      return detail::cat(who, " is alive but elsewhere — heartbeat ", seconds_text(ev.now - h->time), " ago", state,
                         dash(pl), who_text(f, " timed out waiting for it", " failed waiting for it"), ".");
    case Finding::Named::Unresponsive: break;
  }
  return detail::cat(who, " stopped responding", h ? " at " + clock_time(h->time) : std::string(), " — ",
                     h ? "no heartbeat for " + seconds_text(ev.now - h->time) : std::string("no heartbeat"), state,
                     dash(pl), who_text(f, " timed out waiting for it", " failed waiting for it"), ".");
}

nlohmann::json finding_json(const Evidence& ev, const Finding& f) {
  static const char* const kKinds[] = {"none", "killed", "stopped", "named"};
  static const char* const kNamed[] = {"desync", "dead", "elsewhere", "unresponsive"};
  nlohmann::json j;
  j["kind"] = kKinds[static_cast<int>(f.kind)];
  j["culprit"] = f.culprit;
  j["first_failed"] = -1;
  if (ev.first >= 0 && ev.first < static_cast<int>(ev.local.size())) {
    // The first local rank that failed, and how it ended.
    const RankFacts& r = ev.local[ev.first];
    j["first_failed"] = r.global;
    if (!r.running && WIFEXITED(r.status)) j["first_failed_exit_code"] = WEXITSTATUS(r.status);
    if (!r.running && WIFSIGNALED(r.status)) j["first_failed_signal"] = WTERMSIG(r.status);
  }
  j["waiting"] = f.waiting;
  j["waiting_timed_out"] = f.waiting_timed_out;
  j["cause"] = cause_text(ev, f);
  if (f.kind == Finding::Kind::None) return j;
  if (f.kind == Finding::Kind::Named) j["named"] = kNamed[static_cast<int>(f.named)];
  if (f.kind == Finding::Kind::Named && f.named == Finding::Named::Desync) j["judge"] = f.judge;
  const auto& [h, e] = records_of(ev, f.culprit);
  j["on_this_node"] = f.local >= 0;
  if (f.local >= 0) {
    const RankFacts& r = ev.local[f.local];
    j["pid"] = r.pid;
    if (!r.running && WIFSIGNALED(r.status)) j["signal"] = WTERMSIG(r.status);
    if (!r.running && WIFEXITED(r.status)) j["exit_code"] = WEXITSTATUS(r.status);
    if (r.running) {
      // As the words read it: a stopped rank whose /proc is unreadable is stopped.
      const bool stopped = f.kind == Finding::Kind::Stopped;
      const proc::State st =
          stopped && (r.state == proc::State::Unreadable || r.state == proc::State::Gone) ? proc::State::Stopped
                                                                                         : r.state;
      j["process_state"] = proc::describe(st, r.stop_signal);
      if (r.stop_signal) j["signal"] = r.stop_signal;
    }
  } else if (h) {
    j["pid"] = h->pid;
  }
  if (h) {
    j["host"] = h->host;
    j["heartbeat"] = {{"age_s", ev.now - h->time}, {"step", h->step}, {"phase", h->phase}};
  }
  // The collective it was in: the newer of its entry and its heartbeat (place()).
  if (e && e->seq > 0 && (!h || e->time >= h->time)) {
    j["collective"] = {{"seq", e->seq}, {"what", e->what}, {"step", e->step}, {"phase", e->phase}};
  } else if (h && h->seq > 0) {
    j["collective"] = {{"seq", h->seq}, {"kind", h->kind}, {"unit", h->unit}};
  } else if (e && e->seq > 0) {
    // In no collective now: the one it entered last.
    j["last_entered"] = {{"seq", e->seq}, {"what", e->what}, {"step", e->step}, {"phase", e->phase}};
  }
  return j;
}

}  // namespace fsdp::tools::diagnosis
