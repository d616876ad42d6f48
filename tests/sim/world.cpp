// fsdp-cpp simulator: the simulated world (see world.h).
#include "world.h"

#include <cstdio>

namespace sim {

void World::note(const std::string& line) {
  char t[32];
  std::snprintf(t, sizeof t, "%10.3f ms  ", now() / 1000.0);
  trace.push_back(t + line);
  if (verbose) std::printf("%s\n", trace.back().c_str());
  while (trace.size() > 400) trace.pop_front();
}

void World::at(Proc& p, int64_t t, std::function<void()> fn) {
  const uint64_t life = p.life;
  sched.at(t, [&p, life, fn = std::move(fn)] {
    if (!p.alive || p.life != life) return;
    if (p.frozen) {
      p.held.push_back(fn);
      return;
    }
    fn();
  });
}

void World::open(const std::shared_ptr<Gate>& g, bool ok, const std::string& why, int64_t t) {
  if (g->open) return;
  g->open = true;
  g->ok = ok;
  g->why = why;
  if (!g->h) return;
  Proc& p = *g->proc;
  const uint64_t life = g->life;
  const auto h = g->h;
  sched.at(t, [&p, life, h] {
    if (!p.alive || p.life != life) return;
    if (p.frozen) {
      p.held.push_back([h] { h.resume(); });
      return;
    }
    h.resume();
  });
}

void World::start(Proc& p, std::vector<Task<void>> tasks) {
  p.alive = true;
  p.frozen = false;
  p.held.clear();
  p.links.clear();
  p.tasks = std::move(tasks);
  for (size_t i = 0; i < p.tasks.size(); ++i) at(p, now(), [&p, i] { p.tasks[i].start(); });
}

void World::kill(Proc& p, const std::string& why) {
  if (!p.alive) return;
  note("kill " + p.name + ": " + why);
  p.alive = false;
  p.frozen = false;
  ++p.life;
  p.held.clear();
  p.tasks.clear();  // not running: every coroutine of it is suspended
  leave_meetings(p, p.name + " died");
  if (p.on_exit) sched.at(now(), [&p, why] { p.on_exit(false, why); });
}

void World::exit(Proc& p, bool ok, const std::string& why) {
  if (!p.alive) return;
  note(std::string(ok ? "exit " : "crash ") + p.name + (why.empty() ? "" : ": " + why));
  p.alive = false;
  p.frozen = false;
  ++p.life;
  p.held.clear();
  leave_meetings(p, p.name + " exited");
  // Its frames go once the running one suspended (not from inside it).
  sched.at(now(), [&p, ok, why] {
    if (!p.alive) p.tasks.clear();
    if (p.on_exit) p.on_exit(ok, why);
  });
}

void World::leave_meetings(Proc& p, const std::string& why) {
  for (auto& [key, m] : meetings_)
    if (!m.done && !m.broken)
      for (auto& [q, g] : m.arrived)
        if (q == &p) {
          fail_meeting(m, why, now());
          break;
        }
  for (const auto& prefix : p.links) break_meetings(prefix, why);
}

void World::freeze(Proc& p) {
  if (!p.alive || p.frozen) return;
  note("freeze " + p.name);
  p.frozen = true;
}

void World::thaw(Proc& p) {
  if (!p.alive || !p.frozen) return;
  note("thaw " + p.name);
  p.frozen = false;
  auto held = std::move(p.held);
  p.held.clear();
  for (auto& fn : held) at(p, now(), fn);
}

Task<std::optional<World::Result>> World::call(Proc& p, Conn& c, Op op, int64_t budget) {
  const int64_t start = now();
  if (c.gen != store.gen || !store.alive) {
    co_await sleep(p, range(100, 400) + (now() < slow_connect_until ? range(0, slow_connect_max) : 0));  // connecting
    if (!store.alive) {
      co_await sleep(p, 20 * kMs);  // refused; StoreClient tries again at the next call
      co_return std::nullopt;
    }
    c.gen = store.gen;
    c.last_arrival = now();
  }
  auto g = gate(p);
  const int64_t arrival = std::max(now() + delay(), c.last_arrival + 1);
  const bool dup = !op.sets.empty() && chance(dup_chance);
  c.last_arrival = arrival + (dup ? range(1, 300) : 0);
  const uint64_t gen = c.gen;
  const int64_t reply = delay();
  sched.at(arrival, [this, gen, op, g, deadline = start + budget, reply] { exec(gen, op, g, deadline, reply); });
  if (dup)
    sched.at(c.last_arrival, [this, gen, sets = op.sets] {
      if (!store.alive || store.gen != gen || store.frozen) return;
      for (const auto& [k, v] : sets) store.kv[k] = v;  // the same write, delivered twice
    });
  sched.at(start + budget, [this, g] { open(g, false, "no answer within the budget", now()); });
  Wait wait{g.get()};
  co_await wait;
  if (!g->ok) {
    c.gen = 0;
    co_return std::nullopt;
  }
  co_return Result{g->values, g->number};
}

void World::exec(uint64_t gen, Op op, std::shared_ptr<Gate> g, int64_t deadline, int64_t reply) {
  if (g->open) return;  // its caller gave up
  if (!store.alive || store.gen != gen) {
    open(g, false, "the store is gone", now() + reply);
    return;
  }
  if (store.frozen) {
    // Served once its process thaws, if the caller still waits.
    if (now() + 5 * kMs < deadline)
      sched.at(now() + 5 * kMs, [this, gen, op, g, deadline, reply] { exec(gen, op, g, deadline, reply); });
    return;
  }
  bool bell = false;
  for (const auto& [k, v] : op.sets) {
    store.kv[k] = v;
    bell |= k.size() >= 5 && k.compare(k.size() - 5, 5, "/bell") == 0;
  }
  if (op.add) {
    auto it = store.kv.find(op.add->first);
    int64_t v = 0;
    if (it != store.kv.end()) v = std::stoll(it->second);
    v += op.add->second;
    store.kv[op.add->first] = std::to_string(v);
    g->number = v;
  }
  g->values.clear();
  for (const auto& k : op.gets) {
    auto it = store.kv.find(k);
    g->values.push_back(it == store.kv.end() ? std::nullopt : std::optional<std::string>(it->second));
  }
  open(g, true, "", now() + reply);
  if (bell && on_bell) on_bell();
}

Task<std::pair<bool, int64_t>> World::meet(Proc& p, const std::string& key, int expected, int64_t value,
                                           int64_t timeout, int64_t duration, std::string* why) {
  for (const auto& prefix : broken_prefixes_)
    if (key.compare(0, prefix.size(), prefix) == 0) {
      co_await sleep(p, kMs);
      if (why) *why = "the link is broken";
      co_return std::make_pair(false, int64_t{0});
    }
  Meeting& m = meetings_[key];
  auto g = gate(p);
  if (m.broken) {
    co_await sleep(p, kMs);
    if (why) *why = m.why;
    co_return std::make_pair(false, int64_t{0});
  }
  if (m.expected == 0) {
    m.expected = expected;
    m.duration = duration;
  }
  m.arrived.emplace_back(&p, g);
  m.sum += value;
  sched.at(now() + timeout, [this, key, g] {
    if (g->open) return;
    auto it = meetings_.find(key);
    if (it != meetings_.end())
      fail_meeting(it->second, "timed out waiting for a peer", now());
    else
      open(g, false, "timed out", now());
  });
  if (static_cast<int>(m.arrived.size()) == m.expected) sched.at(now() + m.duration, [this, key] { try_complete(key); });
  Wait wait{g.get()};
  co_await wait;
  if (!g->ok) {
    if (why) *why = g->why;
    co_return std::make_pair(false, int64_t{0});
  }
  co_return std::make_pair(true, g->number);
}

void World::try_complete(const std::string& key) {
  auto it = meetings_.find(key);
  if (it == meetings_.end()) return;
  Meeting& m = it->second;
  if (m.done || m.broken) return;
  for (auto& [q, g] : m.arrived)
    if (!q->alive || q->life != g->life) {
      fail_meeting(m, q->name + " died", now());
      return;
    }
  for (auto& [q, g] : m.arrived)
    if (q->frozen) {
      // A frozen peer holds everyone (until a waiter's timeout breaks it).
      sched.at(now() + 5 * kMs, [this, key] { try_complete(key); });
      return;
    }
  m.done = true;
  for (auto& [q, g] : m.arrived) {
    g->number = m.sum;
    open(g, true, "", now());
  }
  meetings_.erase(it);
}

void World::fail_meeting(Meeting& m, const std::string& why, int64_t t) {
  if (m.broken || m.done) return;
  m.broken = true;
  m.why = why;
  for (auto& [q, g] : m.arrived) open(g, false, why, t + kMs);
}

void World::break_meetings(const std::string& prefix, const std::string& why) {
  broken_prefixes_.push_back(prefix);
  for (auto& [key, m] : meetings_)
    if (key.compare(0, prefix.size(), prefix) == 0) fail_meeting(m, why, now());
}

}  // namespace sim
