// fsdp-cpp: the records a rank publishes through the store — its heartbeat,
// the collective it last entered, its verdict on a failed collective — and
// how they are written and read back (see include/fsdp/watchdog.h).
#include "comm/heartbeat.h"

#include <chrono>
#include <cstdio>

#include "fsdp/errors.h"
#include "fsdp/flight.h"

namespace fsdp {
namespace watchdog {

nlohmann::json Heartbeat::to_json() const {
  nlohmann::json j = {{"rank", rank},       {"pid", pid},       {"host", host},   {"time", time},
                      {"beat", beat},       {"interval", interval}, {"left", left}, {"usr1", dumps_on_signal},
                      {"step", step},       {"phase", phase}};
  if (seq > 0)
    j["coll"] = {{"comm", comm},       {"seq", seq},           {"kind", kind},       {"unit", unit},
                 {"peer", peer},       {"waiting", waiting},   {"recv_done", recv_done},
                 {"recv_total", recv_total}, {"started", started}, {"moved", moved}};
  return j;
}

std::optional<Heartbeat> Heartbeat::parse(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    Heartbeat h;
    h.rank = j.value("rank", -1);
    h.pid = j.value("pid", int64_t(0));
    h.host = j.value("host", "");
    h.time = j.value("time", 0.0);
    h.beat = j.value("beat", int64_t(0));
    h.interval = j.value("interval", 1.0);
    h.left = j.value("left", false);
    h.dumps_on_signal = j.value("usr1", false);
    h.step = j.value("step", int64_t(-1));
    h.phase = j.value("phase", "");
    if (j.contains("coll") && j["coll"].is_object()) {
      const auto& c = j["coll"];
      h.comm = c.value("comm", 0);
      h.seq = c.value("seq", uint64_t(0));
      h.kind = c.value("kind", "");
      h.unit = c.value("unit", "");
      h.peer = c.value("peer", -1);
      h.waiting = c.value("waiting", "");
      h.recv_done = c.value("recv_done", int64_t(0));
      h.recv_total = c.value("recv_total", int64_t(0));
      h.started = c.value("started", 0.0);
      h.moved = c.value("moved", 0.0);
    }
    return h;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

nlohmann::json Verdict::to_json() const {
  return {{"rank", rank},       {"comm", comm},     {"seq", seq},         {"what", what},
          {"kind", kind},       {"unit", unit},     {"step", step},       {"phase", phase},
          {"timed_out", timed_out}, {"silent", silent}, {"elsewhere", elsewhere}, {"slow", slow},
          {"stuck", stuck},     {"dead", dead},     {"desync", desync},   {"waited_on", waited_on},
          {"culprits", culprits}, {"summary", summary}};
}

std::optional<Verdict> Verdict::parse(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    Verdict v;
    v.rank = j.value("rank", -1);
    v.comm = j.value("comm", 0);
    v.seq = j.value("seq", uint64_t(0));
    v.what = j.value("what", "");
    v.kind = j.value("kind", "");
    v.unit = j.value("unit", "");
    v.step = j.value("step", int64_t(-1));
    v.phase = j.value("phase", "");
    v.timed_out = j.value("timed_out", false);
    auto ints = [&](const char* k) {
      std::vector<int> out;
      if (j.contains(k) && j[k].is_array())
        for (auto& x : j[k])
          if (x.is_number_integer()) out.push_back(x.get<int>());
      return out;
    };
    v.silent = ints("silent");
    v.elsewhere = ints("elsewhere");
    v.slow = ints("slow");
    v.stuck = ints("stuck");
    v.dead = ints("dead");
    v.desync = ints("desync");
    v.waited_on = ints("waited_on");
    v.culprits = ints("culprits");
    v.summary = j.value("summary", "");
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {
std::string step_phase(int64_t step, const std::string& phase, bool in_collective) {
  std::string s;
  if (step >= 0) s = detail::cat("step ", step);
  if (!phase.empty() && phase != "none") s += detail::cat(s.empty() ? "" : ", ", in_collective ? "" : "phase ", phase);
  return s;
}
}  // namespace

std::string describe_place(const Heartbeat& h) {
  if (h.seq == 0) {
    const std::string sp = step_phase(h.step, h.phase, false);
    return "no collective" + (sp.empty() ? std::string() : " (" + sp + ")");
  }
  const std::string sp = step_phase(h.step, h.phase, true);
  return detail::cat(h.kind, h.unit.empty() ? "" : " '" + h.unit + "'", " #", h.seq, sp.empty() ? "" : " (" + sp + ")");
}

std::string describe_place(const Entered& e) {
  // what: "all_gather 'blocks.1' (fp32, ...)": kind and label, then the seq.
  std::string head = e.what.substr(0, e.what.find(" ("));
  const std::string sp = step_phase(e.step, e.phase, true);
  return detail::cat(head, " #", e.seq, sp.empty() ? "" : " (" + sp + ")");
}

std::string key_base(const std::string& job_token) {
  return "fsdp/" + (job_token.empty() ? std::string() : job_token + "/");
}

}  // namespace watchdog

namespace comm {
namespace {
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

std::string format_entered(uint64_t seq, const std::string& what) {
  char t[32];
  std::snprintf(t, sizeof t, "%.3f", wall_now());
  return detail::cat(seq, "|", t, "|", current_step(), "|", to_string(current_phase()), "|", what);
}

std::optional<watchdog::Entered> parse_entered(const std::string& v, int comm) {
  watchdog::Entered e;
  e.comm = comm;
  try {
    size_t a = v.find('|');
    if (a == std::string::npos) {  // "0": nothing entered yet
      e.seq = std::stoll(v);
      return e;
    }
    size_t b = v.find('|', a + 1), c = v.find('|', b + 1), d = v.find('|', c + 1);
    if (b == std::string::npos || c == std::string::npos || d == std::string::npos) return std::nullopt;
    e.seq = std::stoll(v.substr(0, a));
    e.time = std::stod(v.substr(a + 1, b - a - 1));
    e.step = std::stoll(v.substr(b + 1, c - b - 1));
    e.phase = v.substr(c + 1, d - c - 1);
    e.what = v.substr(d + 1);
    return e;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace comm
}  // namespace fsdp
