// fsdp-cpp: reading a failed collective (see diagnosis.h): the evidence,
// the decision, its wording and the message, each apart.
#include "comm/diagnosis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "comm/algorithms.h"
#include "comm/cma.h"
#include "comm/heartbeat.h"
#include "comm/rendezvous.h"
#include "fsdp/errors.h"
#include "observe/flight_hooks.h"
#include "fsdp/memory.h"

namespace fsdp::comm {

using watchdog::Entered;
using watchdog::Heartbeat;
using Is = RankReading::Is;
using Place = RankReading::Place;

std::vector<std::optional<proc::State>> local_process_states(const std::vector<std::optional<Watchdog::Where>>& where,
                                                             const std::string& my_identity) {
  std::vector<std::optional<proc::State>> out(where.size());
  for (size_t q = 0; q < where.size(); ++q)
    if (where[q] && where[q]->identity == my_identity) out[q] = proc::read_state(where[q]->pid);
  return out;
}

void FailedCall::record(const flight::Progress& p) {
  peer = p.peer.load(std::memory_order_relaxed);
  waiting = p.waiting.load(std::memory_order_relaxed);
  recv_done = p.recv_done.load(std::memory_order_relaxed);
  recv_total = p.recv_total.load(std::memory_order_relaxed);
  sent_done = p.sent_done.load(std::memory_order_relaxed);
  send_total = p.send_total.load(std::memory_order_relaxed);
}

std::string Naming::name_of(int q) const {
  return group.empty() ? detail::cat("rank ", q) : detail::cat("rank ", global[q], " (group rank ", q, ")");
}

std::string Naming::ranks_text() const {
  std::string s;
  for (int g : global) s += (s.empty() ? "" : ", ") + std::to_string(g);
  return s;
}

// ---------------------------------------------------------------------------
// The evidence.

namespace {

// The reading must not eat the slack between the timeout and the promised
// "timeout + 2 s". 1.5 s: on a loaded machine the launcher's store has been
// seen to take over 1 s to answer.
constexpr std::chrono::milliseconds kDiagnosisBudget{1500};
// A store that has not answered the heartbeat thread for longer than a rank
// takes to be silent (cut off, frozen) gets one short try.
constexpr std::chrono::milliseconds kSilentStoreBudget{200};

// Every rank's last entered collective and heartbeat; nullopt: the store
// did not answer within the budget.
struct Readings {
  std::vector<std::optional<watchdog::Entered>> entered;
  std::vector<std::optional<watchdog::Heartbeat>> beats;
};
std::optional<Readings> read_ranks(const EvidenceSource& src, const std::vector<int>& global,
                                   std::chrono::milliseconds budget) {
  const int n = static_cast<int>(global.size());
  std::vector<std::string> keys;
  for (int q = 0; q < n; ++q) keys.push_back(src.prefix + "seq/" + std::to_string(q));
  // Heartbeats are the processes', keyed by global rank.
  for (int q = 0; q < n; ++q) keys.push_back(src.base + "hb/" + std::to_string(global[q]));
  auto v = src.read(keys, budget);
  if (!v) return std::nullopt;
  Readings r;
  r.entered.resize(n);
  r.beats.resize(n);
  for (int q = 0; q < n; ++q) {
    if ((*v)[q]) r.entered[q] = parse_entered(*(*v)[q], src.generation);
    if ((*v)[n + q]) r.beats[q] = watchdog::Heartbeat::parse(*(*v)[n + q]);
  }
  return r;
}

}  // namespace

EvidenceSource evidence_from(Watchdog& dog, const Rendezvous& rdv, const Algorithms& path) {
  EvidenceSource src;
  src.read = [&dog](const std::vector<std::string>& keys, std::chrono::milliseconds budget) {
    return dog.read(keys, budget);
  };
  src.prefix = rdv.prefix();
  src.base = rdv.key_base();
  src.generation = rdv.generation();
  src.store = rdv.describe_store();
  src.interval = dog.interval();
  src.silent_after = dog.silent_after();
  src.store_silent_for = dog.store_silent_for();
  src.where = dog.where();
  src.identity = dog.identity();
  src.pid_of = [&path](int q) { return path.pid_of(q); };
  src.gone_peers = [&path] { return path.gone_peers(); };
  src.gone = process_gone;
  src.clock = dog.clock();
  return src;
}

Evidence collect_evidence(const EvidenceSource& src, const std::vector<int>& global, int self,
                          const FailedCall& call) {
  const int n = static_cast<int>(global.size());
  const WatchClock& clock = src.clock;
  Evidence ev;
  ev.store = src.store;
  ev.store_quiet_s = src.store_silent_for;
  ev.store_silent = ev.store_quiet_s > src.silent_after;
  ev.store_budget = ev.store_silent ? kSilentStoreBudget : kDiagnosisBudget;
  const auto budget_end = clock.now() + ev.store_budget;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(budget_end - clock.now()));
  };
  auto readings = read_ranks(src, global, left());
  // A heartbeat neither fresh nor yet overdue: wait until it is one or the
  // other (within the budget), then read again.
  if (readings) {
    double wait_s = 0;
    const double now = clock.wall();
    for (int q = 0; q < n; ++q) {
      const auto& h = readings->beats[q];
      if (q == self || !h || h->left) continue;
      const double age = h->age(now);
      if (age > 2 * src.interval && age <= src.silent_after) wait_s = std::max(wait_s, src.silent_after - age + 0.05);
    }
    const auto until = clock.now() + std::chrono::milliseconds(int64_t(wait_s * 1000));
    if (wait_s > 0 && until + std::chrono::milliseconds(100) < budget_end) {
      clock.sleep_until(until);
      if (auto again = read_ranks(src, global, left())) readings = again;
    }
  }
  ev.gone_peers = src.gone_peers ? src.gone_peers() : std::string();
  // Dead ranks: of this host's ranks, those whose process is gone (or a
  // zombie: dead, not yet reaped by its launcher).
  ev.where = src.where;
  ev.my_identity = src.identity;
  ev.gone.assign(n, false);
  for (int q = 0; q < n; ++q) {
    if (q == self) continue;
    if (const pid_t pid = src.pid_of ? src.pid_of(q) : -1; pid >= 0)
      ev.gone[q] = src.gone(pid);
    else if (q < static_cast<int>(ev.where.size()) && ev.where[q] && ev.where[q]->identity == ev.my_identity)
      ev.gone[q] = src.gone(static_cast<pid_t>(ev.where[q]->pid));
  }
  ev.self = self;
  ev.world = n;
  ev.comm = src.generation;
  ev.seq = call.seq;
  ev.what = call.what;
  ev.kind = call.kind;
  ev.unit = call.unit;
  ev.step = current_step();
  ev.phase = to_string(current_phase());
  ev.now = clock.wall();
  ev.silent_after = src.silent_after;
  ev.store_reachable = readings.has_value();
  if (readings) {
    ev.beats = std::move(readings->beats);
    ev.entered = std::move(readings->entered);
  } else {
    ev.local_state = local_process_states(ev.where, ev.my_identity);
  }
  return ev;
}

// ---------------------------------------------------------------------------
// The decision.

namespace {

template <class T>
const std::optional<T>& at(const std::vector<std::optional<T>>& v, int q) {
  static const std::optional<T> none;
  return q >= 0 && q < static_cast<int>(v.size()) ? v[q] : none;
}

// Without the store: what this rank knows of the others. Ranks of this host
// by their /proc; ranks of other hosts are cut off from it, as the store is.
RankReading read_without_store(const Evidence& ev, int q) {
  RankReading r;
  r.rank = q;
  const auto& w = at(ev.where, q);
  if (!w) {
    r.is = Is::Unknown;
  } else if (w->identity == ev.my_identity) {
    const auto& st = at(ev.local_state, q);
    r.is = st && proc::is_gone(*st) ? Is::HereGone : st && proc::is_stopped(*st) ? Is::HereStopped : Is::HereAlive;
  } else {
    r.is = Is::Far;
  }
  return r;
}

RankReading read_with_store(const Evidence& ev, int q) {
  RankReading r;
  r.rank = q;
  const auto& h = at(ev.beats, q);
  const auto& e = at(ev.entered, q);
  if (q < static_cast<int>(ev.gone.size()) && ev.gone[q]) {
    r.is = Is::Dead;
  } else if (!h) {
    r.is = Is::NoBeat;
  } else if (h->left) {
    r.is = Is::Finished;
  } else if (h->age(ev.now) > ev.silent_after) {
    r.is = Is::Quiet;
    r.quiet_s = h->age(ev.now);
  } else if (h->phase == "failed") {
    r.is = Is::FailedToo;
  } else {
    const bool entered_here = e && e->seq == static_cast<int64_t>(ev.seq);
    // The collective entered after the last heartbeat is the newer news.
    r.entry_newer = e && e->seq > 0 && e->time >= h->time;
    r.beat_here = h->seq == ev.seq;
    const bool same = (h->seq == ev.seq && h->comm == ev.comm) ||
                      (entered_here && e->what == ev.what && (r.entry_newer || h->seq == 0));
    if (same) {
      r.quiet_s = r.beat_here ? (h->moved > 0 ? ev.now - h->moved : h->started > 0 ? ev.now - h->started : 1e9)
                              : ev.now - e->time;
      r.is = r.beat_here && r.quiet_s <= ev.silent_after && h->moved > 0 ? Is::Slow : Is::Stuck;
    } else {
      r.is = Is::Elsewhere;
      if (entered_here && e->what != ev.what) {
        r.place = Place::DifferentCollective;
      } else if (e && e->seq > static_cast<int64_t>(ev.seq)) {
        r.place = Place::Ahead;
      } else {
        r.place = h->seq == 0 ? Place::Outside : Place::OtherCollective;
        r.behind = e && e->seq >= 0 && e->seq < static_cast<int64_t>(ev.seq);
      }
    }
  }
  return r;
}

}  // namespace

Decision decide(const Evidence& ev) {
  Decision d;
  watchdog::Verdict& v = d.verdict;
  v.rank = ev.self;
  v.comm = ev.comm;
  v.seq = ev.seq;
  v.what = ev.what;
  v.kind = ev.kind;
  v.unit = ev.unit;
  v.step = ev.step;
  v.phase = ev.phase;
  for (int q = 0; q < ev.world; ++q) {
    if (q == ev.self) continue;
    RankReading r = ev.store_reachable ? read_with_store(ev, q) : read_without_store(ev, q);
    switch (r.is) {
      case Is::Dead:
        v.silent.push_back(q);
        v.dead.push_back(q);
        break;
      case Is::NoBeat:
      case Is::Quiet:
      case Is::HereGone:
      case Is::HereStopped:
      case Is::Far: v.silent.push_back(q); break;
      case Is::Finished: v.elsewhere.push_back(q); break;
      case Is::Slow: v.slow.push_back(q); break;
      case Is::Stuck: v.stuck.push_back(q); break;
      case Is::Elsewhere: {
        v.elsewhere.push_back(q);
        const auto& h = at(ev.beats, q);
        if (r.place == Place::DifferentCollective ||
            (r.place == Place::OtherCollective && h && h->comm == ev.comm))
          v.desync.push_back(q);
        break;
      }
      case Is::FailedToo:
      case Is::Unknown:
      case Is::HereAlive: break;
    }
    d.ranks.push_back(r);
  }
  // The cause: the silent ranks, else the ones elsewhere, else the slow ones.
  v.culprits = !v.silent.empty() ? v.silent : !v.elsewhere.empty() ? v.elsewhere : v.slow;
  return d;
}

// ---------------------------------------------------------------------------
// The words.

namespace {

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += detail::cat(i ? (i + 1 == v.size() ? " and " : ", ") : "", v[i]);
  return s;
}

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

std::string bytes_of(int64_t done, int64_t total) {
  return detail::cat(memory::format_bytes(done), " of ", memory::format_bytes(total));
}

Explained explain_without_store(const Evidence& ev, const Decision& d) {
  Explained x;
  x.lines = "\nHeartbeats: unreadable: the rendezvous store did not answer (its host is frozen, gone or cut off "
            "from this one).";
  std::string ranks, other_hosts;
  std::vector<int> far;
  for (const RankReading& r : d.ranks) {
    const int q = r.rank;
    const auto& w = at(ev.where, q);
    std::string line;
    switch (r.is) {
      case Is::HereGone: line = detail::cat("rank ", q, ": SILENT, its process (pid ", w->pid, ") is gone"); break;
      case Is::HereStopped:
        line = detail::cat("rank ", q, ": SILENT, its process (pid ", w->pid, ") is stopped");
        break;
      case Is::HereAlive: line = detail::cat("rank ", q, ": alive on this host (pid ", w->pid, ")"); break;
      case Is::Far:
        far.push_back(q);
        if (other_hosts.find("'" + w->host + "'") == std::string::npos)
          other_hosts += detail::cat(other_hosts.empty() ? "" : ", ", "'", w->host, "'");
        line = detail::cat("rank ", q, ": SILENT, on another host ('", w->host,
                           "'), unreachable like the store: no bytes and no heartbeat arrive from there");
        break;
      default: line = detail::cat("rank ", q, ": unknown (where it runs was never read)"); break;
    }
    ranks += (ranks.empty() ? "\nRanks: " : "\n       ") + line;
  }
  x.lines += ranks;
  const auto& silent = d.verdict.silent;
  if (silent.empty()) {
    x.summary = "the store did not answer";
    return x;
  }
  x.summary = far.empty() ? detail::cat("rank", silent.size() == 1 ? " " : "s ", join(silent),
                                        silent.size() == 1 ? " is" : " are", " silent (stopped or gone, on this host)")
                          : detail::cat("rank", far.size() == 1 ? " " : "s ", join(far), " on ", other_hosts,
                                        far.size() == 1 ? " is" : " are",
                                        " silent: cut off from this host (the network between the hosts is down "
                                        "or those hosts are gone)");
  if (!far.empty() && far.size() < silent.size()) x.summary += detail::cat("; also silent on this host: ", join(silent));
  x.lines += "\nCause: " + x.summary + ".";
  return x;
}

}  // namespace

Explained explain(const Evidence& ev, const Decision& d) {
  if (!ev.store_reachable) return explain_without_store(ev, d);
  Explained x;
  const std::string here = detail::cat(ev.kind, ev.unit.empty() ? "" : " '" + ev.unit + "'", " #", ev.seq);
  std::string ranks, cause_silent, cause_elsewhere, cause_slow;
  for (const RankReading& r : d.ranks) {
    const int q = r.rank;
    const auto& h = at(ev.beats, q);
    const auto& e = at(ev.entered, q);
    const std::string last = e && e->seq > 0 ? "last entered " + watchdog::describe_place(*e)
                                             : std::string("entered no collective yet");
    std::string line;
    switch (r.is) {
      case Is::Dead:
        line = detail::cat("rank ", q, ": DEAD, its process is gone; ", last);
        cause_silent += detail::cat("\nCause: rank ", q, " is dead: its process is gone (killed, or crashed); it ",
                                    last, ".");
        break;
      case Is::NoBeat:
        line = detail::cat("rank ", q, ": SILENT, no heartbeat at all; ", last);
        cause_silent += detail::cat("\nCause: rank ", q, " is silent: it never published a heartbeat; ", last, ".");
        break;
      case Is::Finished:
        line = detail::cat("rank ", q, ": finished (closed its communicators cleanly)");
        cause_elsewhere += detail::cat("\nCause: rank ", q, " is elsewhere: it finished and closed its communicators ",
                                       "while this rank waits in ", here, ".");
        break;
      case Is::Quiet:
        line = detail::cat("rank ", q, ": SILENT, no heartbeat for ", secs(r.quiet_s), "; ", last);
        cause_silent += detail::cat("\nCause: rank ", q, " is silent: no heartbeat for ", secs(r.quiet_s),
                                    " (frozen, dead or cut off); it ", last, ".");
        break;
      case Is::FailedToo: line = detail::cat("rank ", q, ": failed too (its own collective error), ", last); break;
      case Is::Slow:
      case Is::Stuck: {
        const std::string peer =
            r.beat_here && h->peer >= 0 ? detail::cat(", waiting on rank ", h->peer) : std::string();
        if (r.is == Is::Slow) {
          line = detail::cat("rank ", q, ": slow, alive in this collective and still moving bytes (",
                             bytes_of(h->recv_done, h->recv_total), " arrived", peer, ")");
          cause_slow += detail::cat("\nCause: rank ", q, " is slow: alive in ", here, " and still moving bytes (",
                                    bytes_of(h->recv_done, h->recv_total),
                                    " arrived); the network or that host is slower than FSDP_TIMEOUT allows.");
        } else {
          line = detail::cat("rank ", q, ": stuck, alive in this collective, no bytes moved for ",
                             r.quiet_s > 1e8 ? std::string("all of it") : secs(r.quiet_s), peer,
                             r.beat_here ? detail::cat(" (", bytes_of(h->recv_done, h->recv_total), " arrived)")
                                         : std::string());
        }
        break;
      }
      case Is::Elsewhere: {
        // Where it is: the collective it entered when that is newer than
        // its heartbeat, else what the heartbeat says.
        std::string there, why, kind_of;
        switch (r.place) {
          case Place::DifferentCollective:
            there = r.entry_newer ? std::string() : "in " + watchdog::describe_place(*h);
            why = detail::cat(there.empty() ? "" : "; ", "it entered #", ev.seq, " as ", e->what,
                              ", a different collective");
            kind_of = " (a desync: the ranks issue different collectives)";
            break;
          case Place::Ahead:
            there = "in " + watchdog::describe_place(*h);
            why = detail::cat("; it is ahead of this rank (", last, ")");
            kind_of = " (this rank fell behind: it missed bytes or a collective)";
            break;
          default:
            there = "in " + watchdog::describe_place(*h);
            if (r.behind) why = detail::cat("; it has not entered #", ev.seq, " (", last, ")");
            kind_of = r.place == Place::Outside
                          ? " (a rank stuck outside collectives: data loading, a checkpoint write, a loop of "
                            "the program's own)"
                          : " (a rank in another collective: a desync, or another communicator)";
            break;
        }
        const std::string alive = there.empty() ? "alive; " : "alive ";
        line = detail::cat("rank ", q, ": ELSEWHERE, ", alive, there, why);
        cause_elsewhere += detail::cat("\nCause: rank ", q, " is elsewhere: ", alive, there, why,
                                       ", while this rank waits in ", here, kind_of, ".");
        break;
      }
      default: break;
    }
    ranks += (ranks.empty() ? "\nRanks: " : "\n       ") + line;
  }
  x.lines = ranks;
  const auto& v = d.verdict;
  const std::string& cause = !v.silent.empty() ? cause_silent : !v.elsewhere.empty() ? cause_elsewhere
                             : !v.slow.empty() ? cause_slow : std::string();
  x.lines += cause;
  if (!cause.empty()) {
    // The first cause line, without "\nCause: ".
    const size_t end = cause.find('\n', 1);
    x.summary = cause.substr(8, end == std::string::npos ? std::string::npos : end - 8);
  }
  return x;
}

Classified classify(const Evidence& ev) {
  Decision d = decide(ev);
  Explained x = explain(ev, d);
  Classified c;
  c.lines = std::move(x.lines);
  c.verdict = std::move(d.verdict);
  c.verdict.summary = std::move(x.summary);
  return c;
}

// ---------------------------------------------------------------------------
// The message, and the verdict.

namespace {

// What this rank was waiting for when the collective failed, from its
// transfer's counters: the peer, and how far the bytes got.
std::string waiting_line(const FailedCall& c) {
  const auto w = static_cast<flight::Progress::Waiting>(c.waiting);
  if (c.peer < 0 || w == flight::Progress::NONE) return "";
  const char* how = w == flight::Progress::RECEIVE ? "waiting to receive from it"
                    : w == flight::Progress::SEND  ? "waiting for it to take what this rank sent"
                                                   : "reading its memory";
  return detail::cat("\nWaiting on: rank ", c.peer, " (this rank was ", how, "); ", memory::format_bytes(c.recv_done),
                     " of ", memory::format_bytes(c.recv_total), " had arrived",
                     c.send_total > 0 ? detail::cat(", ", memory::format_bytes(c.sent_done), " of ",
                                                    memory::format_bytes(c.send_total), " had been sent")
                                      : std::string(),
                     ".");
}

}  // namespace

std::string render_failure(const FailedCall& call, const Evidence& ev, const Classified& c, const Naming& names,
                           const char* error_source) {
  const bool timed_out = call.timed_out();
  char took[64];
  std::snprintf(took, sizeof took, "%s after %.2f s (timeout %g s, FSDP_TIMEOUT).", timed_out ? "timed out" : "failed",
                call.seconds, call.timeout_s);
  std::string msg = detail::cat(call.what, ", collective #", call.seq, " of ", names.name_of(ev.self), " in a ",
                                names.group.empty() ? "world" : "group", " of ", ev.world, " (", names.describe, "), ",
                                took);
  msg += waiting_line(call);
  // Who had not arrived, who entered something else, and whose progress
  // the store did not say.
  std::string missing, mismatched, unknown;
  for (int q = 0; q < ev.world; ++q) {
    const auto& e = at(ev.entered, q);
    if (!ev.store_reachable || !e) {
      unknown += detail::cat(unknown.empty() ? "" : ", ", names.global[q]);
    } else if (e->seq < static_cast<int64_t>(call.seq)) {
      missing += detail::cat(missing.empty() ? "" : ", ", names.name_of(q), " (last entered #", e->seq,
                             e->seq > 0 ? " " + e->what : std::string(" none"), ")");
    } else if (e->seq == static_cast<int64_t>(call.seq) && e->what != call.what) {
      mismatched += detail::cat("\n  ", names.name_of(q), " entered #", call.seq, " as ", e->what);
    }
  }
  if (!missing.empty()) msg += detail::cat("\nRanks that never arrived at #", call.seq, ": ", missing, ".");
  if (!mismatched.empty())
    msg += detail::cat("\nRanks issued different collectives at #", call.seq, ":", mismatched,
                       "\nEvery rank must issue the same collectives in the same order.");
  if (!unknown.empty())
    msg += detail::cat("\nProgress of ranks ", unknown, " is unknown: the store at ", ev.store, " did not answer within ",
                       ev.store_budget.count(), " ms",
                       ev.store_silent
                           ? detail::cat(" (nor this rank's heartbeats for ", std::lround(ev.store_quiet_s * 10) / 10.0, " s)")
                           : std::string(),
                       ".");
  if (!ev.gone_peers.empty()) msg += detail::cat("\nRanks whose process is gone: ", ev.gone_peers, ".");
  msg += c.lines;
  if (missing.empty() && mismatched.empty() && unknown.empty() && ev.gone_peers.empty() && c.verdict.culprits.empty())
    msg += "\nEvery rank entered this collective, so the transfer itself failed: a peer died "
           "mid-transfer or the network stalled.";
  if (!c.verdict.silent.empty())
    msg += "\nWhat to do: look at the silent rank's host: a stopped process (SIGSTOP, a debugger: kill -CONT), "
           "a dead one (the launcher names its signal), swapping, or a cut network link.";
  else if (!c.verdict.elsewhere.empty())
    msg += "\nWhat to do: find what that rank does there (its phase); if it is legitimately slow (a long "
           "checkpoint, a slow data loader) raise FSDP_TIMEOUT, if it issues other collectives make every rank "
           "issue the same ones in the same order.";
  else
    msg += timed_out ? "\nWhat to do: make every rank issue the same collectives in the same order; "
                       "a rank that is legitimately slower (data loading, checkpointing) needs a "
                       "larger FSDP_TIMEOUT."
                     : "\nWhat to do: look at the first rank that failed in the launcher's output.";
  msg += detail::cat("\n(", error_source, ": ", call.error, ")");
  if (!names.group.empty())
    msg += detail::cat("\n(ranks inside the engine's message are group ranks; group '", names.group,
                       "' is global ranks ", names.ranks_text(), " in that order)");
  return msg;
}

void publish_verdict(Watchdog& dog, const std::string& key_base, int global_rank, const watchdog::Verdict& v,
                     const Evidence& ev) {
  flight::note("verdict", v.to_json());
  if (ev.store_reachable) {
    nlohmann::json hb = nlohmann::json::array();
    for (auto& h : ev.beats) hb.push_back(h ? h->to_json() : nlohmann::json(nullptr));
    flight::note("heartbeats", hb);
  }
  dog.write(key_base + "verdict/" + std::to_string(global_rank), v.to_json().dump(),
            std::chrono::milliseconds(300));
}

}  // namespace fsdp::comm
