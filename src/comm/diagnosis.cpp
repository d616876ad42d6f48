// fsdp-cpp: reading a failed collective (see diagnosis.h): the evidence,
// the decision, and its wording, each apart.
#include "comm/diagnosis.h"

#include <cstdio>

#include "fsdp/errors.h"
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

Classified diagnose(const Evidence& ev) {
  Decision d = decide(ev);
  Explained x = explain(ev, d);
  Classified c;
  c.lines = std::move(x.lines);
  c.verdict = std::move(d.verdict);
  c.verdict.summary = std::move(x.summary);
  return c;
}

}  // namespace fsdp::comm
