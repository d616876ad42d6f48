// fsdp-cpp: the keys and messages of replica groups (see protocol.h).
#include "replicas/protocol.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace fsdp::replicas {
namespace {

using json = nlohmann::json;

// Reads typed fields of one JSON object; the first problem is kept and every
// later read is a no-op, so a parser reads every field and checks once.
class Fields {
 public:
  Fields(std::string_view text, const char* what) : what_(what) {
    if (text.size() > 4 * kMaxText) {
      fail("longer than " + std::to_string(4 * kMaxText) + " bytes");
      return;
    }
    j_ = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j_.is_discarded()) fail("not JSON");
    else if (!j_.is_object()) fail("not a JSON object");
  }
  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  bool has(const char* k) const { return ok() && j_.contains(k) && !j_[k].is_null(); }

  int64_t integer(const char* k, int64_t lo, int64_t hi) {
    if (!ok()) return 0;
    if (!j_.contains(k) || !j_[k].is_number_integer()) return fail_key(k, "an integer"), 0;
    const int64_t v = j_[k].get<int64_t>();
    if (v < lo || v > hi) return fail_key(k, "within [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"), 0;
    return v;
  }
  bool boolean(const char* k) {
    if (!ok()) return false;
    if (!j_.contains(k) || !j_[k].is_boolean()) return fail_key(k, "true or false"), false;
    return j_[k].get<bool>();
  }
  std::string text(const char* k) {
    if (!ok()) return {};
    if (!j_.contains(k) || !j_[k].is_string()) return fail_key(k, "a string"), std::string();
    std::string s = j_[k].get<std::string>();
    if (s.size() > kMaxText) return fail_key(k, "at most " + std::to_string(kMaxText) + " bytes"), std::string();
    return s;
  }
  std::vector<int> groups(const char* k) {
    if (!ok()) return {};
    if (!j_.contains(k) || !j_[k].is_array() || j_[k].size() > static_cast<size_t>(kMaxGroupId))
      return fail_key(k, "an array of group ids"), std::vector<int>();
    std::vector<int> v;
    for (const auto& x : j_[k]) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > kMaxGroupId)
        return fail_key(k, "an array of group ids"), std::vector<int>();
      v.push_back(static_cast<int>(x.get<int64_t>()));
    }
    if (!std::is_sorted(v.begin(), v.end()) || std::adjacent_find(v.begin(), v.end()) != v.end())
      return fail_key(k, "ascending distinct group ids"), std::vector<int>();
    return v;
  }
  std::optional<QuorumRef> quorum(const char* k) {
    if (!has(k)) return std::nullopt;
    if (!j_[k].is_object()) return fail_key(k, "an object"), std::nullopt;
    Fields f(j_[k], what_);
    QuorumRef q;
    q.q = f.integer("q", 0, INT64_MAX);
    q.era = f.integer("era", 0, INT64_MAX);
    q.comm = f.integer("comm", 0, INT64_MAX);
    q.step = f.integer("step", 0, INT64_MAX);
    q.members = f.groups("members");
    if (!f.ok()) return fail(std::string("field '") + k + "': " + f.why()), std::nullopt;
    return q;
  }
  void fail(const std::string& why) {
    if (why_.empty()) why_ = std::string(what_) + " " + why;
  }

 private:
  Fields(const json& j, const char* what) : j_(j), what_(what) {}
  void fail_key(const char* k, const std::string& expected) {
    fail(std::string("field '") + k + "': expected " + expected +
         (j_.contains(k) ? ", found " + j_[k].dump().substr(0, 64) : ", found none"));
  }
  json j_;
  const char* what_;
  std::string why_;
};

json quorum_json(const QuorumRef& q) {
  return json{{"q", q.q}, {"era", q.era}, {"comm", q.comm}, {"step", q.step}, {"members", q.members}};
}

template <class T>
std::optional<T> done(Fields& f, T value, std::string* why) {
  if (f.ok()) return value;
  if (why) *why = f.why();
  return std::nullopt;
}

}  // namespace

Keys::Keys(const std::string& job_token) : base_("fsdp-ft/" + (job_token.empty() ? "" : job_token + "/")) {}
std::string Keys::job() { return "fsdp-ft/job"; }
std::string Keys::gr(const char* what, int g, int64_t inc, int r) const {
  return base_ + what + std::to_string(g) + "/" + std::to_string(inc) + "/" + std::to_string(r);
}
std::string Keys::answer(int g, int64_t inc, int64_t round) const {
  return base_ + "ans/" + std::to_string(g) + "/" + std::to_string(inc) + "/" + std::to_string(round);
}
std::string Keys::link(int64_t era, int64_t comm, int shard) const {
  return base_ + "q" + std::to_string(era) + "." + std::to_string(comm) + "/r" + std::to_string(shard) + "/";
}

const char* name_of(Kind k) {
  switch (k) {
    case Kind::HELLO: return "hello";
    case Kind::REQ: return "req";
    case Kind::VOTE: return "vote";
    case Kind::BYE: return "bye";
  }
  return "?";
}

namespace {

json standing_json(const Standing& at) {
  return json{{"committed", at.committed},
              {"whole", at.whole},
              {"cur", at.cur ? quorum_json(*at.cur) : json(nullptr)},
              {"cur_sources", at.cur_sources},
              {"last", at.last ? quorum_json(*at.last) : json(nullptr)},
              {"last_commit", at.last_commit},
              {"suspect", at.suspect}};
}

Standing read_standing(Fields& f) {
  Standing at;
  at.committed = f.integer("committed", 0, INT64_MAX);
  at.whole = f.boolean("whole");
  at.cur = f.quorum("cur");
  if (f.has("cur_sources")) at.cur_sources = f.groups("cur_sources");
  at.last = f.quorum("last");
  at.last_commit = f.boolean("last_commit");
  if (f.has("suspect")) at.suspect = f.boolean("suspect");
  return at;
}

}  // namespace

std::string to_json(const RankMessage& m) {
  json j = standing_json(m.at);
  j["v"] = kProtocol;
  j["seq"] = m.seq;
  j["kind"] = name_of(m.kind);
  j["inc"] = m.inc;
  j["round"] = m.round;
  if (m.kind == Kind::VOTE) {
    j["ok"] = m.ok;
    j["why"] = m.why;
  }
  return j.dump();
}

std::optional<RankMessage> parse_message(std::string_view text, std::string* why) {
  Fields f(text, "message:");
  RankMessage m;
  const int64_t v = f.integer("v", 0, INT32_MAX);
  if (f.ok() && v != kProtocol) f.fail("of protocol " + std::to_string(v) + ", expected " + std::to_string(kProtocol));
  m.seq = f.integer("seq", 1, INT64_MAX);
  const std::string kind = f.text("kind");
  if (kind == "hello") m.kind = Kind::HELLO;
  else if (kind == "req") m.kind = Kind::REQ;
  else if (kind == "vote") m.kind = Kind::VOTE;
  else if (kind == "bye") m.kind = Kind::BYE;
  else f.fail("field 'kind': expected hello, req, vote or bye, found '" + kind.substr(0, 32) + "'");
  m.inc = f.integer("inc", 1, INT64_MAX);
  m.at = read_standing(f);
  m.round = f.integer("round", -1, INT64_MAX);
  if (m.kind == Kind::VOTE && f.ok()) {
    m.ok = f.boolean("ok");
    m.why = f.text("why");
    if (f.ok() && !m.at.cur) f.fail("a vote on no quorum");
    if (f.ok() && m.round < 1) f.fail("a vote that asks for round " + std::to_string(m.round));
  }
  if (m.kind == Kind::REQ && f.ok() && m.round < 1) f.fail("a request for round " + std::to_string(m.round));
  return done(f, m, why);
}

std::string to_json(const Report& r) {
  json j = standing_json(r.at);
  j["inc"] = r.inc;
  j["n"] = r.n;
  return j.dump();
}

std::optional<Report> parse_report(std::string_view text, std::string* why) {
  Fields f(text, "heartbeat:");
  Report r;
  r.inc = f.integer("inc", 1, INT64_MAX);
  r.n = f.integer("n", 0, INT64_MAX);
  r.at = read_standing(f);
  return done(f, r, why);
}

std::string to_json(const Answer& a) {
  if (!a.refused.empty()) return json{{"refused", a.refused}}.dump();
  if (a.farewell) return json{{"farewell", true}}.dump();
  json j = quorum_json(a.quorum);
  j["sources"] = a.sources;
  j["heal"] = a.heal;
  return j.dump();
}

std::optional<Answer> parse_answer(std::string_view text, std::string* why) {
  Fields f(text, "answer:");
  Answer a;
  if (f.has("refused")) {
    a.refused = f.text("refused");
    return done(f, a, why);
  }
  if (f.has("farewell")) {
    a.farewell = f.boolean("farewell");
    return done(f, a, why);
  }
  a.quorum.q = f.integer("q", 0, INT64_MAX);
  a.quorum.era = f.integer("era", 0, INT64_MAX);
  a.quorum.comm = f.integer("comm", 0, INT64_MAX);
  a.quorum.step = f.integer("step", 0, INT64_MAX);
  a.quorum.members = f.groups("members");
  a.sources = f.groups("sources");
  a.heal = f.boolean("heal");
  if (f.ok() && (a.quorum.members.empty() || a.sources.empty())) f.fail("with no members or no sources");
  return done(f, a, why);
}

std::string to_json(const Decision& d) {
  json j{{"q", d.q},           {"era", d.era},         {"comm", d.comm},
         {"step", d.step},     {"commit", d.commit},   {"expired", d.expired}};
  if (!d.why.empty()) j["why"] = d.why;
  return j.dump();
}

std::optional<Decision> parse_decision(std::string_view text, std::string* why) {
  Fields f(text, "decision:");
  Decision d;
  d.q = f.integer("q", 0, INT64_MAX);
  d.era = f.integer("era", 0, INT64_MAX);
  d.comm = f.integer("comm", -1, INT64_MAX);
  d.step = f.integer("step", 0, INT64_MAX);
  d.commit = f.boolean("commit");
  d.expired = f.boolean("expired");
  if (f.has("why")) d.why = f.text("why");
  return done(f, d, why);
}

std::string to_json(const Registration& r) {
  return json{{"group", r.group}, {"rank", r.rank},   {"inc", r.inc},     {"size", r.size},
              {"host", r.host},   {"pid", r.pid},     {"model", r.model}, {"sharding", r.sharding},
              {"first", r.first}}
      .dump();
}

std::optional<Registration> parse_registration(std::string_view text, std::string* why) {
  Fields f(text, "registration:");
  Registration r;
  r.group = static_cast<int>(f.integer("group", 0, kMaxGroupId));
  r.rank = static_cast<int>(f.integer("rank", 0, kMaxGroupSize - 1));
  r.inc = f.integer("inc", 1, INT64_MAX);
  r.size = static_cast<int>(f.integer("size", 1, kMaxGroupSize));
  r.host = f.text("host");
  r.pid = f.integer("pid", 0, INT64_MAX);
  r.model = f.text("model");
  r.sharding = f.text("sharding");
  if (f.has("first")) r.first = f.boolean("first");
  if (f.ok() && r.rank >= r.size) f.fail("of rank " + std::to_string(r.rank) + " in a group of " + std::to_string(r.size));
  return done(f, r, why);
}

std::string to_json(const Settings& s) {
  return json{{"v", s.protocol}, {"heartbeat_ms", s.heartbeat_ms}, {"epoch", s.epoch}}.dump();
}

int64_t era_of(const std::string& epoch) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : epoch) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h & ((uint64_t{1} << 53) - 1));
}

std::optional<Settings> parse_settings(std::string_view text, std::string* why) {
  Fields f(text, "the coordinator's settings:");
  Settings s;
  s.protocol = static_cast<int>(f.integer("v", 0, INT32_MAX));
  s.heartbeat_ms = f.integer("heartbeat_ms", 1, 24 * 3600 * 1000);
  s.epoch = f.text("epoch");
  return done(f, s, why);
}

}  // namespace fsdp::replicas
