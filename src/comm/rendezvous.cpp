// fsdp-cpp: rendezvous through c10d::TCPStore (see rendezvous.h).
#include "comm/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "comm/mesh.h"
#include "comm/store_listen.h"
#include "comm/heartbeat.h"
#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

double seconds(std::chrono::milliseconds ms) { return ms.count() / 1000.0; }

// A store server on addr:port whose listening socket we bound (see
// store_listen.h); TCPStore takes the socket over.
c10d::TCPStoreOptions server_options(const std::string& addr, int port, std::chrono::milliseconds timeout,
                                     bool bind_all) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = timeout;
  o.masterListenFd = listen_for_store(addr, port, bind_all);
  return o;
}

// One store per master address for the life of the process (see header).
c10::intrusive_ptr<c10d::TCPStore> shared_store(const WorldEnv& w, const ResolvedOptions& opts) {
  const std::chrono::milliseconds timeout = opts.rendezvous_timeout;
  static std::mutex mu;
  // Immortal on purpose (never destroyed at exit), so the stores stay
  // reachable and LeakSanitizer does not report them as leaks.
  static auto& stores = *new std::map<std::string, c10::intrusive_ptr<c10d::TCPStore>>();
  std::lock_guard<std::mutex> lock(mu);
  std::string key = w.master_addr + ":" + std::to_string(w.master_port);
  auto it = stores.find(key);
  if (it != stores.end()) return it->second;
  // `fsdp run` hosts the store itself (FSDP_STORE_HOSTED=1): rank 0 is then
  // a client like the others, and the store outlives a frozen rank 0.
  const bool server = w.rank == 0 && !opts.store_hosted;
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    c10d::TCPStoreOptions o;
    if (server) {
      // Rank 0's listening socket binds to MASTER_ADDR, not every interface.
      o = server_options(w.master_addr, w.master_port, timeout, opts.store_bind_all);
    } else {
      o.port = static_cast<uint16_t>(w.master_port);
      o.isServer = false;
      o.timeout = timeout;
    }
    o.waitWorkers = false;  // fsdp's own join (below) names the ranks that are missing
    store = c10::make_intrusive<c10d::TCPStore>(w.master_addr, o);
  } catch (const std::exception& e) {
    if (server)
      throw Error(detail::cat("rank 0 could not start the rendezvous store on port ", w.master_port,
                              " (MASTER_ADDR=", w.master_addr, "): ", e.what(),
                              "\nPick a free port (MASTER_PORT, or let `fsdp run` choose one)."));
    throw Error(detail::cat("rank ", w.rank, " could not reach the rendezvous store at ", key,
                            " within ", seconds(timeout), " s: ", e.what(),
                            "\nIs rank 0 running, and do MASTER_ADDR/MASTER_PORT name its host from "
                            "here? (FSDP_RENDEZVOUS_TIMEOUT sets the wait)"));
  }
  stores[key] = store;  // never freed: rank 0's server must serve until exit
  return store;
}

// The address of this host on the route to the master: connect() on a UDP
// socket picks the route without sending anything.
std::string local_address_toward(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw Error(detail::cat("cannot resolve MASTER_ADDR '", host, "'; set it to a host name or IP of rank 0"));
  std::string out;
  int fd = socket(res->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      const void* a = ss.ss_family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr);
      if (inet_ntop(ss.ss_family, a, buf, sizeof buf)) out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (out.empty())
    throw Error(detail::cat("no route from this host to MASTER_ADDR '", host,
                            "'; set GLOO_SOCKET_IFNAME to the interface that reaches it"));
  return out;
}

// The store as Gloo's address exchange sees it: a wait polls check()
// instead of TCPStore::wait, which leaves its connection out of step when
// it times out (see rendezvous.h); everything else goes straight through.
class PollingStore final : public c10d::Store {
 public:
  explicit PollingStore(c10::intrusive_ptr<c10d::Store> s) : s_(std::move(s)) { timeout_ = s_->getTimeout(); }
  c10::intrusive_ptr<c10d::Store> clone() override { return c10::make_intrusive<PollingStore>(s_->clone()); }
  void set(const std::string& key, const std::vector<uint8_t>& value) override { s_->set(key, value); }
  std::vector<uint8_t> get(const std::string& key) override {
    wait({key});
    return s_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override { return s_->add(key, value); }
  bool deleteKey(const std::string& key) override { return s_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return s_->check(keys); }
  int64_t getNumKeys() override { return s_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    auto deadline = Clock::now() + timeout;
    for (auto& k : keys) {
      for (int i = 0; !s_->check({k}); ++i) {
        if (Clock::now() > deadline)
          throw Error(detail::cat("Gloo rendezvous: key '", k, "' did not appear within ",
                                  seconds(timeout), " s; a rank stopped while connecting"));
        std::this_thread::sleep_for(std::chrono::milliseconds(i < 50 ? 1 : 10));
      }
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> s_;
};

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

c10::intrusive_ptr<c10d::TCPStore> connect_store_client(const std::string& addr, int port,
                                                        std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(addr, o);
}

c10::intrusive_ptr<c10d::TCPStore> connect_store_client(const WorldEnv& w, std::chrono::milliseconds timeout) {
  return connect_store_client(w.master_addr, w.master_port, timeout);
}

c10d::TCPStore* host_store(const std::string& addr, int port, std::chrono::milliseconds timeout, bool bind_all) {
  try {
    return new c10d::TCPStore(addr, server_options(addr, port, timeout, bind_all));
  } catch (const std::exception& e) {
    throw Error(detail::cat("could not start the rendezvous store on ", addr, ":", port, ": ", e.what(),
                            "\nPick a free port (--master-port, or let `fsdp run` choose one)."));
  }
}

void close_hosted_store(c10d::TCPStore* store) { delete store; }

std::shared_ptr<Mesh> connect_mesh_through(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                           int rank, int size, const std::string& addr, int port,
                                           std::chrono::milliseconds timeout) {
  const std::string hostname = local_address_toward(addr, port);
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, c10::make_intrusive<PollingStore>(store));
    return connect_gloo_mesh(prefixed, rank, size, "", hostname, timeout);
  } catch (const std::exception& e) {
    throw Error(detail::cat("connecting the Gloo TCP links of ", size, " ranks (this one at ", hostname,
                            ", keys under ", prefix, ") failed: ", e.what()));
  }
}

Rendezvous::Rendezvous(const WorldEnv& world, const ResolvedOptions& opts)
    : world_(world), timeout_(opts.rendezvous_timeout) {
  const std::string& job_token = opts.job_token;
  const std::chrono::milliseconds timeout = timeout_;
  // Every rank creates its communicators in the same order, so the n-th
  // communicator of each process shares the prefix of generation n.
  static std::atomic<int> generation{0};
  generation_ = generation++;
  const std::string gen = "c" + std::to_string(generation_) + "/";
  base_ = "fsdp/" + (job_token.empty() ? std::string() : job_token + "/");
  prefix_ = base_ + gen;
  const std::string job_key = "fsdp/" + gen + "job";
  const std::string job_id = job_token.empty() ? "none" : token_fingerprint(job_token);
  where_ = world.master_addr + ":" + std::to_string(world.master_port);
  auto deadline = Clock::now() + timeout;
  store_ = shared_store(world, opts);

  const int n = world.world_size, r = world.rank;
  try {
    // The job check comes first: a rank of another job (or one started by
    // hand without the token) fails here with a clear message.
    if (r == 0) store_->set(job_key, bytes(job_id));
    if (!wait_keys({job_key}, deadline).empty())
      throw Error(detail::cat("rank 0 did not register its job at ", where_, " within ", seconds(timeout), " s"));
    std::string theirs_job = get(job_key);
    if (theirs_job != job_id)
      throw Error(detail::cat(
          "rank ", r, ": the rendezvous store at ", where_, " belongs to another job: its FSDP_JOB_TOKEN ",
          theirs_job == "none" ? "is unset" : "fingerprint is " + theirs_job, ", this rank's ",
          job_id == "none" ? "is unset" : "fingerprint is " + job_id,
          ". Start every rank of a job with the same FSDP_JOB_TOKEN (`fsdp run` sets one per single-node "
          "job; export the same value on every node of a multi-node job), and give each job its own "
          "MASTER_PORT."));
    if (r == 0) store_->set(prefix_ + "world_size", bytes(std::to_string(n)));
    if (!wait_keys({prefix_ + "world_size"}, deadline).empty())
      throw Error(detail::cat("rank 0 did not publish its world size at ", where_, " within ",
                              seconds(timeout), " s"));
    int theirs = std::stoi(get(prefix_ + "world_size"));
    if (theirs != n) {
      std::string why = detail::cat("ranks disagree on the world size: rank ", r, " has WORLD_SIZE=", n,
                                    " but rank 0 has WORLD_SIZE=", theirs,
                                    ". Start every rank with the same WORLD_SIZE (`fsdp run` "
                                    "does), and the same --nnodes/-n on every node.");
      store_->set(prefix_ + "abort", bytes(why));
      throw Error(why);
    }
    const std::vector<int> ranks = join(deadline);
    if (!ranks.empty()) {
      throw Error(detail::cat("rank ", r, ": ranks ", join_ranks(ranks), " of a world of ", n,
                              " did not join within ", seconds(timeout), " s (store ", where_,
                              "). Did they start, with the same MASTER_ADDR/MASTER_PORT? "
                              "(FSDP_RENDEZVOUS_TIMEOUT sets the wait)"));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(detail::cat("rank ", r, ": rendezvous through the store at ", where_, " failed: ", e.what()));
  }
}

Rendezvous::Rendezvous(const Rendezvous& parent, const std::string& tag, const WorldEnv& group,
                       const std::vector<int>& global)
    : world_(group), timeout_(parent.timeout_), base_(parent.base_), prefix_(parent.prefix_ + tag),
      generation_(parent.generation_), where_(parent.where_), global_(global), store_(parent.store_) {
  auto deadline = Clock::now() + timeout_;
  const int r = group.rank;
  auto names = [&](const std::vector<int>& ranks) {
    std::string s;
    for (int q : ranks) s += (s.empty() ? "" : ", ") + std::to_string(global_.at(q));
    return s;
  };
  try {
    const std::vector<int> ranks = join(deadline);
    if (!ranks.empty()) {
      throw Error(detail::cat("rank ", global_.at(r), ": ranks ", names(ranks), " of its group (ranks ",
                              join_ranks(global_), ") did not join the group within ", seconds(timeout_),
                              " s (store ", where_, "). Every rank of the parent communicator must call "
                              "split() (FSDP_RENDEZVOUS_TIMEOUT sets the wait)"));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(detail::cat("rank ", global_.at(r), ": joining its group (ranks ", join_ranks(global_),
                            ") through the store at ", where_, " failed: ", e.what()));
  }
}

std::vector<int> Rendezvous::join(Clock::time_point deadline) {
  const int n = world_.world_size, r = world_.rank;
  // In no collective yet: what a diagnosis reads of this rank until its first.
  store_->set(prefix_ + "seq/" + std::to_string(r), bytes("0"));
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  store_->set(prefix_ + "joined/" + std::to_string(r), bytes(detail::cat(host, " pid ", getpid())));
  std::vector<std::string> keys;
  for (int q = 0; q < n; ++q) keys.push_back(prefix_ + "joined/" + std::to_string(q));
  std::vector<int> missing;
  for (auto& k : wait_keys(keys, deadline)) missing.push_back(std::stoi(k.substr(k.rfind('/') + 1)));
  return missing;
}

bool Rendezvous::has(const std::string& key) { return store_->check({key}); }
std::string Rendezvous::get(const std::string& key) { return text(store_->get(key)); }

std::vector<std::string> Rendezvous::wait_keys(const std::vector<std::string>& keys,
                                               Clock::time_point deadline) {
  std::vector<std::string> pending = keys;
  for (int i = 0;; ++i) {
    std::vector<std::string> still;
    for (auto& k : pending)
      if (!has(k)) still.push_back(k);
    pending.swap(still);
    if (pending.empty()) return {};
    if (has(prefix_ + "abort")) throw Error(get(prefix_ + "abort"));
    if (Clock::now() > deadline) return pending;
    std::this_thread::sleep_for(std::chrono::milliseconds(i < 50 ? 1 : 10));
  }
}

std::shared_ptr<Mesh> Rendezvous::connect_gloo(const std::string& ifname) {
  std::string hostname;
  if (ifname.empty()) hostname = local_address_toward(world_.master_addr, world_.master_port);
  try {
    // Gloo's address exchange, through our store under this communicator's
    // prefix. Every rank has joined (the constructor waited), so its waits
    // for the others' addresses end at once.
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix_ + "gloo",
                                                           c10::make_intrusive<PollingStore>(store_));
    return connect_gloo_mesh(prefixed, world_.rank, world_.world_size, ifname, hostname, timeout_);
  } catch (const std::exception& e) {
    throw Error(detail::cat("rank ", global_.empty() ? world_.rank : global_.at(world_.rank),
                            ": connecting the Gloo TCP mesh (",
                            ifname.empty() ? "address " + hostname : "interface " + ifname,
                            ") failed: ", e.what(),
                            "\nIf this host has several networks, set GLOO_SOCKET_IFNAME."));
  }
}

void Rendezvous::record_entered(uint64_t seq, const std::string& what) {
  try {
    store_->set(prefix_ + "seq/" + std::to_string(world_.rank), bytes(format_entered(seq, what)));
  } catch (const std::exception&) {
    // The store is gone (rank 0 ended); the collective itself will report it.
  }
}

std::vector<Rendezvous::Progress> Rendezvous::read_progress(std::chrono::milliseconds budget) {
  std::vector<Progress> seqs(world_.world_size);
  auto deadline = Clock::now() + budget;
  for (int q = 0; q < world_.world_size && Clock::now() < deadline; ++q) {
    try {
      std::string k = prefix_ + "seq/" + std::to_string(q);
      if (!has(k)) continue;
      auto e = parse_entered(get(k), generation_);
      if (!e) continue;
      seqs[q].seq = e->seq;
      seqs[q].what = e->what;
    } catch (const std::exception&) {
      break;  // store unreachable: the remaining entries stay unknown
    }
  }
  return seqs;
}

void Rendezvous::leave(std::chrono::milliseconds budget) {
  try {
    std::string k = prefix_ + "left";
    store_->add(k, 1);
    if (world_.rank != 0) return;
    auto deadline = Clock::now() + budget;
    while (store_->add(k, 0) < world_.world_size && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  } catch (const std::exception&) {
    // Shutting down anyway; a peer that died is reported by the launcher.
  }
}

}  // namespace fsdp::comm
