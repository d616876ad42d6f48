// fsdp-cpp: the `fsdp run` launcher (see launcher.h).
//
// One single-threaded event loop per attempt: poll() over every rank's stdout
// and stderr pipes plus a self-pipe woken by SIGCHLD/SIGINT/SIGTERM. Each rank
// runs in its own process group, so stopping a rank also stops whatever it
// started, and PR_SET_PDEATHSIG kills the ranks if the launcher itself dies.
#include "launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "fsdp/config.h"
#include "fsdp/errors.h"
#include "comm/store_host.h"
#include "config/cluster_env.h"
#include "common/proc_state.h"
#include "fsdp/watchdog.h"
#include "elastic.h"
#include "launch_diagnosis.h"

extern char** environ;

namespace fsdp::tools {
namespace {

using diagnosis::rank_list;
using diagnosis::signal_name;

using Clock = std::chrono::steady_clock;
constexpr int kMaxLocalRanks = 1024;  // also checked by fsdp run's -n

// Written only by the signal handler; read by the loop.
volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_dump_requests = 0;  // SIGUSR1s received
int g_wake[2] = {-1, -1};

void on_signal(int sig) {
  if (sig == SIGINT || sig == SIGTERM) g_stop_signal = sig;
  if (sig == SIGUSR1) g_dump_requests = g_dump_requests + 1;
  int saved = errno;
  if (write(g_wake[1], "x", 1) < 0) {
  }  // a full pipe already wakes the loop
  errno = saved;
}

void install_handlers() {
  if (g_wake[0] < 0 && pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(detail::cat("fsdp run: pipe: ", std::strerror(errno)));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

// The program as execv() needs it: a path, searched in PATH like a shell.
std::string resolve_program(const std::string& prog) {
  auto runnable = [](const std::string& p) {
    struct stat st {};
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (prog.find('/') != std::string::npos) {
    if (runnable(prog)) return prog;
  } else if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    size_t at = 0;
    while (at <= dirs.size()) {
      size_t end = dirs.find(':', at);
      if (end == std::string::npos) end = dirs.size();
      std::string dir = dirs.substr(at, end - at);
      std::string cand = (dir.empty() ? "." : dir) + "/" + prog;
      if (runnable(cand)) return cand;
      at = end + 1;
    }
  }
  throw UsageError(detail::cat("program '", prog, "' was not found or is not executable; give a path "
                               "to an executable file (or a command in PATH) after --"));
}

int pick_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    throw Error(detail::cat("fsdp run: could not find a free port: ", std::strerror(errno),
                            "; pass --master-port"));
  }
  close(fd);  // the store binds it moments later; a race is possible but rare
  return ntohs(a.sin_port);
}

// 128 random bits as hex, for FSDP_JOB_TOKEN.
std::string random_token() {
  unsigned char b[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  bool ok = fd >= 0 && read(fd, b, sizeof b) == static_cast<ssize_t>(sizeof b);
  if (fd >= 0) close(fd);
  if (!ok) throw Error(detail::cat("fsdp run: cannot read /dev/urandom for the job token: ", std::strerror(errno),
                                   "; set FSDP_JOB_TOKEN yourself"));
  std::string out;
  char hex[3];
  for (unsigned char c : b) {
    std::snprintf(hex, sizeof hex, "%02x", c);
    out += hex;
  }
  return out;
}

int cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

struct Rank {
  int local = 0, global = 0;
  pid_t pid = -1;
  int fd[2] = {-1, -1};       // stdout, stderr pipes (read ends)
  std::string partial[2];     // an unfinished line per stream
  std::deque<std::string> tail;
  bool running = false;
  int status = 0;
  int stop_signal = 0;        // stopped by this signal (waitpid WUNTRACED), 0: not stopped
  double stopped_at = 0;      // wall seconds
  bool signaled_by_us = false;
  double exited_at = 0;       // wall seconds
};

struct Outcome {
  int failed = -1;     // index of the first rank that failed, -1: none
  int status = 0;      // its wait status
  int interrupted = 0; // SIGINT/SIGTERM received by the launcher
  std::string cause;   // the cause, when more is known than the first failure's exit ("" otherwise)
  bool cause_printed = false;  // already on stderr (the culprit is another rank than the first failed)
  int culprit = -1;    // global rank named as the cause (-1: the first failed)
  std::string external;  // elastic: why the round was stopped from outside this node's ranks
};

// Elastic: polled by the event loop; a non-empty answer stops every rank.
using Watch = std::function<std::string()>;

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class Attempt {
 public:
  Attempt(const LaunchOptions& o, const std::string& program, int port, int restart, std::string token,
          watchdog::StoreHost* store, Watch watch = {})
      : o_(o), program_(program), port_(port), restart_(restart), token_(std::move(token)),
        base_(watchdog::key_base(token_)), store_(store), watch_(std::move(watch)), ranks_(o.nproc) {}

  Outcome run() {
    try {
      for (int i = 0; i < o_.nproc; ++i) spawn(i);
    } catch (...) {  // e.g. out of processes: stop the ranks already started
      signal_all(SIGKILL);
      for (auto& r : ranks_) {
        if (r.running) waitpid(r.pid, &r.status, 0);
        r.running = false;
        for (int& fd : r.fd)
          if (fd >= 0) close(fd), fd = -1;
      }
      throw;
    }
    Clock::time_point kill_at{}, all_exited_at{}, settle_until{}, dump_until{};
    enum { RUNNING, SETTLING, DUMPING, STOPPING } state = RUNNING;
    int dumps_seen = g_dump_requests;
    for (;;) {
      poll_once();
      if (g_stop_signal && !out_.interrupted) {
        out_.interrupted = g_stop_signal;
        std::fprintf(stderr, "fsdp run: received %s, forwarding it to every rank\n",
                     signal_name(out_.interrupted).c_str());
        signal_all(out_.interrupted);
        state = STOPPING;
        kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int>(o_.grace_s * 1000));
      }
      if (g_dump_requests != dumps_seen) {
        dumps_seen = g_dump_requests;
        forward_dump_request();
      }
      reap();
      if (state == RUNNING && out_.failed < 0 && watch_) {
        std::string why = watch_();
        if (!why.empty()) {  // the round ends elsewhere (elastic.h): stop ours
          out_.external = std::move(why);
          state = STOPPING;
          begin_stop(&kill_at);
        }
      }
      if (state == RUNNING && out_.failed >= 0) {
        // Before stopping anyone: who caused it? A death by signal is its
        // own answer; otherwise the others' verdicts need a moment to land.
        const Rank& f = ranks_[out_.failed];
        const bool by_signal = WIFSIGNALED(f.status);
        settle_until = Clock::now() + std::chrono::milliseconds(by_signal ? 100 : 1000);
        state = SETTLING;
      }
      if (state == SETTLING) {
        bool others_done = true;
        for (auto& r : ranks_)
          if (r.running && !r.stop_signal && proc::read_state(r.pid) != proc::State::Stopped) others_done = false;
        if (others_done || Clock::now() > settle_until) {
          reap();
          bool asked = investigate();
          state = asked ? DUMPING : STOPPING;
          dump_until = Clock::now() + std::chrono::milliseconds(1000);
          if (!asked) begin_stop(&kill_at);
        }
      }
      if (state == DUMPING && Clock::now() > dump_until) {
        state = STOPPING;
        begin_stop(&kill_at);
      }
      if (state == STOPPING && Clock::now() > kill_at) signal_all(SIGKILL);
      bool any_running = false, any_open = false;
      for (auto& r : ranks_) {
        any_running |= r.running;
        any_open |= r.fd[0] >= 0 || r.fd[1] >= 0;
      }
      if (!any_running) {
        if (all_exited_at == Clock::time_point{}) all_exited_at = Clock::now();
        // A grandchild may hold a pipe open; do not wait for it long.
        if (!any_open || Clock::now() - all_exited_at > std::chrono::milliseconds(500)) break;
      }
    }
    for (auto& r : ranks_)
      for (int s = 0; s < 2; ++s) {
        if (!r.partial[s].empty()) emit(r, s, r.partial[s]);
        if (r.fd[s] >= 0) close(r.fd[s]);
      }
    std::fflush(stdout);
    std::fflush(stderr);
    return out_;
  }

  const Rank& rank(int i) const { return ranks_[i]; }

 private:
  std::vector<std::string> env_for(const Rank& r) const {
    std::vector<std::pair<std::string, std::string>> set = {
        {"RANK", std::to_string(r.global)},
        {"LOCAL_RANK", std::to_string(r.local)},
        {"WORLD_SIZE", std::to_string(o_.nproc * o_.nnodes)},
        {"LOCAL_WORLD_SIZE", std::to_string(o_.nproc)},
        {"GROUP_RANK", std::to_string(o_.node_rank)},
        {"MASTER_ADDR", o_.master_addr},
        {"MASTER_PORT", std::to_string(port_)},
        {"FSDP_RESTART_COUNT", std::to_string(restart_)},
    };
    if (!token_.empty()) set.push_back({"FSDP_JOB_TOKEN", token_});
    if (store_) set.push_back({"FSDP_STORE_HOSTED", "1"});
    if (!o_.flight_dir.empty()) set.push_back({"FSDP_FLIGHT_DIR", o_.flight_dir});
    // Compute threads per rank: the cores this launcher may use / local
    // ranks, at least 1. Nothing is held back for a rank's communication
    // threads (its queue thread and Gloo's socket thread): they sleep in
    // waits most of the time and their socket copies are a few percent of a
    // step (docs/COMM.md, "Threads"). --threads T or the user's own
    // OMP_NUM_THREADS override it.
    const int threads = o_.threads > 0 ? o_.threads : std::max(1, cores() / o_.nproc);
    for (const char* k : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"})
      if (o_.threads > 0 || !std::getenv(k)) set.push_back({k, std::to_string(threads)});
    // More compute threads than cores (--threads above the default, or more
    // ranks than cores): OpenMP's idle threads must sleep, not spin, or they
    // take the cores the other ranks' threads wait for (measured: 2 ranks x
    // 2 threads on 2 cores ran 5-9x slower spinning, as fast as 1 thread
    // passive). Kept when the user set OMP_WAIT_POLICY.
    const int env_threads = std::getenv("OMP_NUM_THREADS") && o_.threads <= 0
                                ? std::max(1, std::atoi(std::getenv("OMP_NUM_THREADS")))
                                : threads;
    if (int64_t(env_threads) * o_.nproc > cores() && !std::getenv("OMP_WAIT_POLICY"))
      set.push_back({"OMP_WAIT_POLICY", "PASSIVE"});
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      std::string key = kv.substr(0, kv.find('='));
      bool overridden = false;
      for (auto& s : set) overridden |= s.first == key;
      if (!overridden) env.push_back(kv);
    }
    for (auto& s : set) env.push_back(s.first + "=" + s.second);
    return env;
  }

  void spawn(int i) {
    Rank& r = ranks_[i];
    r.local = i;
    r.global = o_.node_rank * o_.nproc + i;
    int p[2][2];
    for (auto& pp : p)
      if (pipe2(pp, O_CLOEXEC) != 0) throw Error(detail::cat("fsdp run: pipe: ", std::strerror(errno)));
    // Everything the child needs is built before fork(): no allocation after.
    std::vector<std::string> env = env_for(r);
    std::vector<char*> envp, argv;
    for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    argv.push_back(const_cast<char*>(program_.c_str()));
    for (size_t a = 1; a < o_.argv.size(); ++a) argv.push_back(const_cast<char*>(o_.argv[a].c_str()));
    argv.push_back(nullptr);
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid < 0) throw Error(detail::cat("fsdp run: fork: ", std::strerror(errno)));
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(127);  // the launcher died before prctl
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGPIPE}) sigaction(sig, &dfl, nullptr);
      dup2(p[0][1], 1);
      dup2(p[1][1], 2);
      // The store's sockets (this launcher serves it) are not the rank's.
#ifdef SYS_close_range
      syscall(SYS_close_range, 3U, ~0U, 0U);
#endif
      execve(argv[0], argv.data(), envp.data());
      const char* msg = "fsdp run: exec failed\n";
      if (write(2, msg, std::strlen(msg)) < 0) {
      }
      _exit(127);
    }
    setpgid(pid, pid);  // also here: no race with an early signal_all()
    r.pid = pid;
    r.running = true;
    for (int s = 0; s < 2; ++s) {
      close(p[s][1]);
      r.fd[s] = p[s][0];
    }
  }

  void poll_once() {
    std::vector<pollfd> fds{{g_wake[0], POLLIN, 0}};
    std::vector<std::pair<int, int>> who{{-1, -1}};
    for (int i = 0; i < o_.nproc; ++i)
      for (int s = 0; s < 2; ++s)
        if (ranks_[i].fd[s] >= 0) {
          fds.push_back({ranks_[i].fd[s], POLLIN, 0});
          who.push_back({i, s});
        }
    if (poll(fds.data(), fds.size(), 100) <= 0) return;
    char buf[65536];
    if (fds[0].revents) while (read(g_wake[0], buf, sizeof buf) > 0) {}
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      Rank& r = ranks_[who[k].first];
      int s = who[k].second;
      ssize_t n = read(r.fd[s], buf, sizeof buf);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        close(r.fd[s]);
        r.fd[s] = -1;
        continue;
      }
      r.partial[s].append(buf, n);
      size_t nl;
      while ((nl = r.partial[s].find('\n')) != std::string::npos) {
        emit(r, s, r.partial[s].substr(0, nl));
        r.partial[s].erase(0, nl + 1);
      }
    }
  }

  void emit(Rank& r, int stream, const std::string& line) {
    std::FILE* f = stream == 0 ? stdout : stderr;
    std::fprintf(f, "[rank %d] %s\n", r.global, line.c_str());
    std::fflush(f);
    r.tail.push_back(line);
    if (static_cast<int>(r.tail.size()) > o_.tail_lines) r.tail.pop_front();
  }

  void reap() {
    for (int i = 0; i < o_.nproc; ++i) {
      Rank& r = ranks_[i];
      if (!r.running) continue;
      for (;;) {
        int status = 0;
        pid_t got = waitpid(r.pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
        if (got != r.pid) break;
        if (WIFSTOPPED(status)) {
          r.stop_signal = WSTOPSIG(status);
          r.stopped_at = wall_now();
          continue;
        }
        if (WIFCONTINUED(status)) {
          r.stop_signal = 0;
          continue;
        }
        r.running = false;
        r.status = status;
        r.exited_at = wall_now();
        break;
      }
    }
    if (out_.failed >= 0 || out_.interrupted) return;
    // The first failure is the one to explain; of several seen at once, a
    // death by a signal comes first (the others failed because of it).
    int first = -1;
    for (int i = 0; i < o_.nproc; ++i) {
      const Rank& r = ranks_[i];
      if (r.running || (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)) continue;
      if (first < 0 || (WIFSIGNALED(r.status) && !WIFSIGNALED(ranks_[first].status))) first = i;
    }
    if (first >= 0) {
      out_.failed = first;
      out_.status = ranks_[first].status;
    }
  }

  // SIGUSR1 to the launcher: each rank that installed the flight
  // recorder's handler (its heartbeat says so) dumps.
  void forward_dump_request() {
    std::vector<int> asked, skipped;
    for (auto& r : ranks_) {
      if (!r.running) continue;
      auto h = store_ ? store_->heartbeat(base_, r.global) : std::nullopt;
      if (h && h->dumps_on_signal) {
        kill(r.pid, SIGUSR1);
        asked.push_back(r.global);
      } else {
        skipped.push_back(r.global);
      }
    }
    std::string where = o_.flight_dir.empty() ? std::string("their flight directory (FSDP_FLIGHT_DIR)") : o_.flight_dir;
    std::fprintf(stderr, "fsdp run: SIGUSR1: asked %s to dump its flight recorder into %s%s\n",
                 asked.empty() ? "no rank" : rank_list(asked).c_str(), where.c_str(),
                 skipped.empty() ? ""
                                 : (" (" + rank_list(skipped) + " not yet: no flight recorder handler, " +
                                    "SIGUSR1 would end it)").c_str());
    std::fflush(stderr);
  }

  // Who caused the failure, and how we know (launch_diagnosis.h): prints
  // the cause line (or keeps it for the final message) and returns whether
  // the culprit was asked to dump its flight recorder first.
  bool investigate() {
    diagnosis::Evidence ev;
    ev.now = wall_now();
    ev.world = o_.nproc * o_.nnodes;
    ev.first = out_.failed;
    for (const Rank& r : ranks_) {
      diagnosis::RankFacts f;
      f.local = r.local;
      f.global = r.global;
      f.pid = r.pid;
      f.running = r.running;
      f.status = r.status;
      f.stop_signal = r.stop_signal;
      f.stopped_at = r.stopped_at;
      f.exited_at = r.exited_at;
      f.signaled_by_us = r.signaled_by_us;
      if (r.running) f.state = proc::read_state(r.pid);
      ev.local.push_back(f);
    }
    // The verdicts of the ranks that failed in a collective (any node), and
    // the heartbeats and entered collectives of the ranks they concern.
    if (store_) {
      for (int q = 0; q < ev.world; ++q)
        if (auto v = store_->verdict(base_, q)) ev.verdicts[q] = *v;
      for (int q : diagnosis::ranks_to_read(ev))
        ev.records[q] = {store_->heartbeat(base_, q), store_->entered(base_, q)};
    }
    const diagnosis::Finding f = diagnosis::decide(ev);
    if (!o_.flight_dir.empty()) write_finding(diagnosis::finding_json(ev, f));
    if (f.kind == diagnosis::Finding::Kind::None) return false;
    out_.culprit = f.culprit;
    out_.cause = diagnosis::cause_text(ev, f);
    if (f.print_now) {
      std::fprintf(stderr, "fsdp run: %s\n", out_.cause.c_str());
      std::fflush(stderr);
      out_.cause_printed = true;
    }
    if (!f.ask_dump) return false;
    const pid_t pid = ranks_[f.local].pid;
    kill(pid, SIGUSR1);
    if (f.continue_first) kill(pid, SIGCONT);
    return true;
  }

  // The finding as data, beside the ranks' flight dumps:
  // <flight dir>/launcher-node<k>.json, written whole or not at all (a
  // temporary file renamed); a later failure of the same node (a restart)
  // replaces it, as the ranks' dumps are replaced. Diagnostics only: a
  // folder that cannot be written is said, and the job goes on stopping.
  void write_finding(nlohmann::json j) {
    j["node"] = o_.node_rank;
    j["restart"] = restart_;
    const std::string path = detail::cat(o_.flight_dir, "/launcher-node", o_.node_rank, ".json");
    const std::string tmp = path + ".tmp";
    std::error_code ec;
    std::filesystem::create_directories(o_.flight_dir, ec);
    const std::string text = j.dump(1) + "\n";
    std::FILE* out = std::fopen(tmp.c_str(), "w");
    const bool ok = out && std::fwrite(text.data(), 1, text.size(), out) == text.size();
    const bool closed = out && std::fclose(out) == 0;
    if (!ok || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::fprintf(stderr, "fsdp run: could not write %s (%s); the finding is only in this log\n", path.c_str(),
                   std::strerror(errno));
      std::remove(tmp.c_str());
    }
  }

  // SIGTERM to every rank; a stopped one cannot act on it, so it gets SIGKILL.
  void begin_stop(Clock::time_point* kill_at) {
    for (auto& r : ranks_)
      if (r.running) r.signaled_by_us = true;
    signal_all(SIGTERM);
    for (auto& r : ranks_)
      if (r.running && (r.stop_signal || proc::read_state(r.pid) == proc::State::Stopped)) kill(-r.pid, SIGKILL);
    *kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int>(o_.grace_s * 1000));
  }

  void signal_all(int sig) {
    for (auto& r : ranks_)
      if (r.running) kill(-r.pid, sig);
  }

  const LaunchOptions& o_;
  const std::string program_;
  const int port_, restart_;
  const std::string token_;
  const std::string base_;          // the job's store keys
  watchdog::StoreHost* store_;      // null when this node does not host the store
  const Watch watch_;               // elastic: the round's membership
  std::vector<Rank> ranks_;
  Outcome out_;
};

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return detail::cat("was killed by signal ", signal_name(sig),
                       sig == SIGKILL ? " (the kernel's out-of-memory killer sends SIGKILL too)" : "");
  }
  return detail::cat("exited with code ", WEXITSTATUS(status));
}

int exit_code_of(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  int c = WEXITSTATUS(status);
  return c == 0 ? 1 : c;
}

void validate(LaunchOptions& o) {
  if (o.argv.empty())
    throw UsageError("no program given; usage: fsdp run -n N [options] -- PROGRAM [ARGS...]");
  if (o.nproc < 1) throw UsageError(detail::cat("-n must be at least 1, found ", o.nproc));
  if (o.nproc > kMaxLocalRanks)
    throw UsageError(detail::cat("-n must be at most ", kMaxLocalRanks, " ranks per node, found ", o.nproc));
  if (o.nnodes < 1) throw UsageError(detail::cat("--nnodes must be at least 1, found ", o.nnodes));
  if (o.nnodes > (1 << 20)) throw UsageError(detail::cat("--nnodes must be at most ", 1 << 20, ", found ", o.nnodes));
  if (o.min_nodes <= 0) o.min_nodes = o.nnodes;
  if (o.min_nodes > o.nnodes)
    throw UsageError(detail::cat("--nnodes ", o.min_nodes, ":", o.nnodes, ": MIN is above MAX; expected --nnodes N "
                                 "or MIN:MAX with 1 <= MIN <= MAX (e.g. 1:2)"));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw UsageError(detail::cat("--node-rank must be in [0, ", o.nnodes, "), found ", o.node_rank));
  if (o.master_port < 0 || o.master_port > 65535)
    throw UsageError(detail::cat("--master-port must be in [1, 65535], found ", o.master_port));
  if (o.nnodes > 1 && (o.master_addr.empty() || o.master_port == 0))
    throw UsageError(detail::cat("with --nnodes ", o.min_nodes < o.nnodes ? detail::cat(o.min_nodes, ":", o.nnodes)
                                                                          : std::to_string(o.nnodes),
                                 " every node needs the same --master-addr "
                                 "(the host of node 0) and --master-port"));
  if (o.threads < 0) throw UsageError(detail::cat("--threads must be positive, found ", o.threads));
  if (o.max_restarts < 0)
    throw UsageError(detail::cat("--max-restarts must be 0 or more, found ", o.max_restarts));
  if (!(o.rdzv_settle_s >= 0 && o.rdzv_settle_s <= 3600))
    throw UsageError(detail::cat("--rdzv-settle must be in [0, 3600] seconds, found ", o.rdzv_settle_s));
  if (!(o.rdzv_timeout_s > 0 && o.rdzv_timeout_s <= 86400))
    throw UsageError(detail::cat("--rdzv-timeout must be in (0, 86400] seconds, found ", o.rdzv_timeout_s));
  if (!(o.grace_s >= 0 && o.grace_s <= 3600))
    throw UsageError(detail::cat("--grace must be in [0, 3600] seconds, found ", o.grace_s));
  // The launcher holds two pipes per local rank (plus a few of its own).
  const rlim_t need = static_cast<rlim_t>(2 * o.nproc + 64);
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
    rlimit raised = rl;
    raised.rlim_cur = std::min(need, rl.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0 || raised.rlim_cur < need)
      throw UsageError(detail::cat("-n ", o.nproc, " needs about ", need, " open files in the launcher, but the "
                                   "limit is ", rl.rlim_cur, " (hard limit ", rl.rlim_max,
                                   "); raise it (ulimit -n) or start fewer ranks per node"));
  }
  if (o.master_addr.empty()) o.master_addr = "127.0.0.1";
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(o.master_addr.c_str(), nullptr, &hints, &res) != 0)
    throw UsageError(detail::cat("--master-addr '", o.master_addr, "' does not resolve to an address"));
  freeaddrinfo(res);
}

// "rank 3 (local rank 1, pid 123) exited with code 1", or the cause the
// launcher found (launch_diagnosis.h).
std::string failure_text(const Rank& r, const Outcome& out) {
  const std::string first = detail::cat("rank ", r.global, " (local rank ", r.local, ", pid ", r.pid, ") ",
                                        describe_status(out.status));
  std::string why = first;
  if (!out.cause.empty() && !out.cause_printed) why = out.cause;
  if (out.cause_printed)
    why = detail::cat("stopped the job because of rank ", out.culprit, " (named above); the first rank to exit was ",
                      first);
  return why;
}

// --nnodes MIN:MAX: rounds of membership (elastic.h) until the ranks of a
// round all exit 0, node 0 is lost, fewer than MIN nodes are left, or the
// restarts are spent.
int launch_elastic(const LaunchOptions& o, const std::string& program, const config::EnvConfig& env) {
  elastic::Settings es;
  es.addr = o.master_addr;
  es.port = o.master_port;
  es.id = o.node_rank;
  es.min_nodes = o.min_nodes;
  es.max_nodes = o.nnodes;
  es.settle_s = o.rdzv_settle_s;
  es.timeout_s = o.rdzv_timeout_s;
  es.base = watchdog::key_base(o.job_token);
  es.bind_all = env.store_bind_all;
  std::unique_ptr<elastic::Rendezvous> rdzv;
  try {
    rdzv = std::make_unique<elastic::Rendezvous>(es);
  } catch (const std::exception& e) {
    throw Error(detail::cat("fsdp run: ", e.what()));
  }
  auto say = [](const std::string& line) {
    std::fprintf(stderr, "fsdp run: %s\n", line.c_str());
    std::fflush(stderr);
  };
  elastic::Round last;  // the previous round (no members before the first)
  int n = 0;
  int failures = 0;     // node 0: rounds that ended by a failure (a node that joins is none)
  for (;;) {
    elastic::Round round;
    std::unique_ptr<watchdog::StoreHost> store;  // node 0: the ranks' store of this round
    try {
      if (rdzv->hosts()) {
        round.number = n;
        round.members = rdzv->gather(n);
        for (int tries = 0;; ++tries) {
          round.port = pick_free_port();
          try {
            store = std::make_unique<watchdog::StoreHost>(o.master_addr, round.port, std::chrono::seconds(60),
                                                          env.store_bind_all);
            break;
          } catch (const std::exception& e) {
            if (tries >= 5) throw Error(detail::cat("fsdp run: ", e.what()));
          }
        }
        rdzv->publish(round);
      } else {
        round = rdzv->await(n);
      }
    } catch (const elastic::Ended& e) {
      say(e.what());
      return 1;
    }
    n = round.number;
    const int world = static_cast<int>(round.members.size()) * o.nproc;
    const int node_rank = round.node_rank(o.node_rank);
    if (last.members.empty())
      say(detail::cat("elastic round ", n, ": world size ", world, ", nodes ", round.member_list(), " (",
                      round.members.size(), " of --nnodes ", o.min_nodes, ":", o.nnodes, "); this is node ",
                      o.node_rank, ", node rank ", node_rank));
    else
      say(detail::cat("elastic restart ", n, ": world size ", static_cast<int>(last.members.size()) * o.nproc, " -> ",
                      world, ", nodes ", last.member_list(), " -> ", round.member_list(), " (--nnodes ", o.min_nodes,
                      ":", o.nnodes, "); this is node ", o.node_rank, ", node rank ", node_rank,
                      "; the ranks resume from their newest checkpoint"));
    LaunchOptions ro = o;
    ro.nnodes = static_cast<int>(round.members.size());
    ro.node_rank = node_rank;
    ro.master_port = round.port;
    bool fatal = false, grow = false;
    Attempt attempt(ro, program, round.port, n, o.job_token, store.get(), [&]() -> std::string {
      const elastic::Check c = rdzv->check(round);
      fatal = c.fatal;
      grow = c.grow;
      return c.stop;
    });
    Outcome out = attempt.run();
    store.reset();
    if (out.interrupted) {
      rdzv->stop_round(n, detail::cat("node ", o.node_rank, "'s launcher received ", signal_name(out.interrupted)));
      return 128 + out.interrupted;
    }
    if (out.external.empty() && out.failed < 0) {  // every rank of this node exited 0
      rdzv->done(n);
      if (rdzv->hosts()) rdzv->wait_done(round, 30);
      return 0;
    }
    if (fatal) {
      say(out.external);
      return 1;
    }
    std::string why = out.external;
    if (why.empty()) {
      why = detail::cat("node ", o.node_rank, ": ", failure_text(attempt.rank(out.failed), out));
      rdzv->stop_round(n, why);
    }
    say(detail::cat("elastic round ", n, " ended: ", why));
    if (rdzv->hosts() && !grow && failures++ >= o.max_restarts) {
      const std::string end = detail::cat("gave up after ", o.max_restarts, " restart", o.max_restarts == 1 ? "" : "s",
                                          " (--max-restarts on node 0): round ", n, " ended: ", why);
      say(end);
      rdzv->end(end);
      return out.failed >= 0 ? exit_code_of(out.status) : 1;
    }
    last = round;
    ++n;
  }
}

}  // namespace

int launch(LaunchOptions o) {
  validate(o);
  const std::string program = resolve_program(o.argv[0]);
  // The environment, read once (docs/CONFIG.md): the job token and how the
  // store binds.
  // Without the cluster launchers' variables: they place this node (fsdp
  // run's place_node), not a rank.
  const config::EnvConfig env = config::parse_env(config::without_cluster_variables(
      [](const char* name) -> const char* { return std::getenv(name); }));
  install_handlers();
  if (o.job_token.empty()) o.job_token = env.job_token;
  if (o.job_token.empty() && o.nnodes > 1)
    std::fprintf(stderr, "fsdp run: note: FSDP_JOB_TOKEN is not set, so this job's rendezvous keys are not "
                         "private; export the same random value on every node (see docs/RELIABILITY.md)\n");
  if (o.min_nodes < o.nnodes) return launch_elastic(o, program, env);
  for (int restart = 0;; ++restart) {
    // Node 0 hosts the rendezvous store for the attempt (a fresh one each
    // time: no key of the last attempt survives), so it outlives any rank.
    std::unique_ptr<watchdog::StoreHost> store;
    int port = o.master_port;
    for (int tries = 0; o.node_rank == 0; ++tries) {
      if (o.master_port == 0) port = pick_free_port();
      try {
        store = std::make_unique<watchdog::StoreHost>(o.master_addr, port, std::chrono::seconds(60),
                                                      env.store_bind_all);
        break;
      } catch (const std::exception& e) {
        if (o.master_port > 0 || tries >= 5)
          throw Error(detail::cat("fsdp run: ", e.what()));
      }
    }
    if (port == 0) port = pick_free_port();
    // A fresh token per attempt on one node: a rank left over from the
    // previous attempt can never join the next one.
    std::string token = !o.job_token.empty() ? o.job_token : o.nnodes == 1 ? random_token() : "";
    Attempt attempt(o, program, port, restart, token, store.get());
    Outcome out = attempt.run();
    store.reset();
    if (out.interrupted) return 128 + out.interrupted;
    if (out.failed < 0) return 0;
    const Rank& r = attempt.rank(out.failed);
    const std::string why = failure_text(r, out);
    if (restart < o.max_restarts) {
      std::fprintf(stderr, "fsdp run: %s; restarting all %d ranks (restart %d of %d)\n", why.c_str(),
                   o.nproc, restart + 1, o.max_restarts);
      continue;
    }
    std::string msg = detail::cat("fsdp run: ", why, "; stopped the other ", o.nproc - 1, " local rank",
                                  o.nproc == 2 ? "" : "s", ".");
    if (o.max_restarts > 0) msg += detail::cat(" Gave up after ", o.max_restarts, " restarts.");
    if (!o.flight_dir.empty())
      msg += detail::cat("\nfsdp run: flight recorder dumps: ", o.flight_dir, " (fsdp report ", o.flight_dir,
                         " -o flight.html)");
    msg += detail::cat("\nfsdp run: last ", r.tail.size(), " lines of rank ", r.global, ":");
    for (auto& line : r.tail) msg += "\n  | " + line;
    std::fprintf(stderr, "%s\n", msg.c_str());
    return exit_code_of(out.status);
  }
}

}  // namespace fsdp::tools
