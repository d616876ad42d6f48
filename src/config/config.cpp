// fsdp-cpp: the environment, parsed in one place (see include/fsdp/config.h).
#include "fsdp/config.h"

#include <algorithm>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <initializer_list>

#include "config/cluster_env.h"
#include "fsdp/errors.h"

namespace fsdp::config {

const std::vector<Variable>& variables() {
  static const std::vector<Variable> table = {
      {"RANK", "an integer in [0, WORLD_SIZE)", "0", "this process's rank in the world (torchrun's convention)"},
      {"WORLD_SIZE", "an integer >= 1", "1", "ranks in the world; unset or 1: a world of one, no rendezvous"},
      {"LOCAL_RANK", "an integer in [0, LOCAL_WORLD_SIZE)", "RANK mod LOCAL_WORLD_SIZE", "this rank's index on its host"},
      {"LOCAL_WORLD_SIZE", "an integer in [1, WORLD_SIZE]", "WORLD_SIZE", "ranks on this host"},
      {"MASTER_ADDR", "a host name or address", "127.0.0.1", "where rank 0 (or the launcher) hosts the rendezvous store"},
      {"MASTER_PORT", "an integer in [1, 65535]", "29500", "the rendezvous store's port"},
      {"GROUP_RANK", "an integer in [0, nodes)", "RANK / LOCAL_WORLD_SIZE", "this rank's node (torchrun's convention)"},
      // Slurm's (inside an srun step), Open MPI's, PMI's and Kubeflow's, when
      // torchrun's RANK and WORLD_SIZE are not set: the innermost launcher's
      // (config/cluster_env.h).
      {"SLURM_STEP_ID", "any (only whether it is set counts)", "not inside an srun step",
       "set inside an srun step: Slurm's variables place the rank"},
      {"SLURM_STEPID", "any (only whether it is set counts)", "SLURM_STEP_ID", "the same, as older Slurm names it"},
      {"SLURM_PROCID", "an integer in [0, SLURM_NTASKS)", "none", "Slurm: this task's rank"},
      {"SLURM_NTASKS", "an integer >= 1", "none", "Slurm: the tasks of the step (the world size)"},
      {"SLURM_LOCALID", "an integer", "0", "Slurm: this task's index on its node"},
      {"SLURM_NODEID", "an integer in [0, SLURM_NNODES)", "0", "Slurm: this node's index in the step"},
      {"SLURM_NNODES", "an integer >= 1", "1", "Slurm: the nodes of the step"},
      {"SLURM_TASKS_PER_NODE", "e.g. 4(x2),3", "one task per node (all on one node when SLURM_NNODES=1)",
       "Slurm: tasks on each node (this node's count is LOCAL_WORLD_SIZE)"},
      {"SLURM_STEP_NODELIST", "a Slurm host list, e.g. node[01-04,07]", "SLURM_JOB_NODELIST",
       "Slurm: the step's hosts; the first hosts the store"},
      {"SLURM_JOB_NODELIST", "a Slurm host list", "127.0.0.1", "Slurm: the job's hosts; the first hosts the store"},
      {"SLURM_JOB_ID", "the job's id", "29500", "Slurm: the store's port is 20000 + id mod 20000"},
      {"SLURM_TASK_PID", "a process id", "not compared",
       "Slurm: the task srun started; when it is this process, Slurm's variables place it beside MPI's"},
      {"OMPI_COMM_WORLD_RANK", "an integer in [0, OMPI_COMM_WORLD_SIZE)", "none", "Open MPI (mpirun): this rank"},
      {"OMPI_COMM_WORLD_SIZE", "an integer >= 1", "none", "Open MPI: the world size"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "an integer", "rank mod local size", "Open MPI: this rank's index on its host"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "an integer >= 1", "the world size", "Open MPI: ranks on this host"},
      {"PMIX_NAMESPACE", "the job's namespace", "29500", "Open MPI 5 (PMIx): the store's port is derived from it"},
      {"OMPI_MCA_ess_base_jobid", "the job's id", "29500", "Open MPI 4: the store's port is derived from it"},
      {"OMPI_MCA_orte_ess_jobid", "the job's id", "29500", "Open MPI 3: the store's port is derived from it"},
      {"PMI_RANK", "an integer in [0, PMI_SIZE)", "none", "PMI (MPICH's, Intel MPI's mpirun): this rank"},
      {"PMI_SIZE", "an integer >= 1", "none", "PMI: the world size"},
      {"MPI_LOCALRANKID", "an integer", "rank mod local size", "PMI: this rank's index on its host"},
      {"MPI_LOCALNRANKS", "an integer >= 1", "the world size", "PMI: ranks on this host"},
      {"PMI_KVSNAME", "the job's name", "29500", "PMI: the store's port is derived from it"},
      {"PET_NNODES", "N or N:N", "none", "Kubeflow's PyTorchJob: pods in the job (`fsdp run` in a pod: --nnodes)"},
      {"PET_NODE_RANK", "an integer in [0, PET_NNODES)", "none", "Kubeflow: this pod's index (`fsdp run`: --node-rank)"},
      {"PET_NPROC_PER_NODE", "an integer >= 1", "1",
       "Kubeflow: processes per pod; more than 1 needs `fsdp run` in each pod (its -n)"},
      {"FSDP_TIMEOUT", "seconds, > 0 (e.g. 30 or 2.5)", "CommOptions::timeout (60 s)",
       "how long one collective may take before it fails naming the ranks it waited on"},
      {"FSDP_RENDEZVOUS_TIMEOUT", "seconds, > 0", "60", "how long to wait for every rank to join"},
      {"GLOO_SOCKET_IFNAME", "a network interface name", "CommOptions::ifname, else the route to MASTER_ADDR",
       "the interface the TCP links use"},
      {"FSDP_DEBUG", "off, info or detail", "off",
       "info: one line per choice made (transport, tiers); detail: also check before each collective that every "
       "rank issues the same call"},
      {"FSDP_TRANSPORT", "auto, tcp or cma", "auto", "how ranks on one host move collective bytes (docs/COMM.md)"},
      {"FSDP_BACKEND", "auto, gloo or nccl", "auto (CommOptions::backend: gloo)",
       "the engine of the collectives: gloo (CPU tensors; GPU tensors staged through pinned memory) or nccl "
       "(cuda:LOCAL_RANK)"},
      {"FSDP_CUDA_PLUGIN", "a file", "libfsdp_cuda.so beside the program or where fsdp-cpp was installed",
       "the CUDA plugin to load for CUDA devices and NCCL (fsdp/device.h)"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0, 1, 2 or 3 (PyTorch's own variable)", "3",
       "what ProcessGroupNCCL does with a timed-out collective (3, 1: abort the process; 2: fail the next wait; 0: "
       "nothing); fsdp-cpp only reports it (docs/COMM.md, \"NCCL\")"},
      {"FSDP_TIERS", "on or off", "on", "across hosts: cross-memory attach inside each host, TCP between"},
      {"FSDP_SHARE_HOST", "on or off", "CommOptions::share_host_memory (on)",
       "ranks of one host (or of each host of the tiers) keep one copy of each unit's parameters and reduce "
       "gradients where they lie "
       "(docs/COMM.md, \"Host-shared units\")"},
      {"FSDP_COMPRESS", "off, int8, int4 or fp8", "CommOptions::compress (off)",
       "quantize what crosses hosts (the tiers' inter-host ring, or a flat ring of one rank per host): "
       "parameters' all-gather / gradients' reduce-scatter and all-reduce in int8/int8, int8/int4 or fp8 "
       "e4m3/int8, blocks of 256 with fp32 scales, gradients with error feedback (docs/COMM.md, \"Quantized "
       "formats\")"},
      {"FSDP_COMPRESS_FEEDBACK", "on or off", "CommOptions::error_feedback (on)",
       "with FSDP_COMPRESS: off sends the gradients' plain quantized values and keeps no residual, to show the "
       "bias error feedback removes (docs/COMM.md, \"Quantized formats\")"},
      {"FSDP_COORDINATOR", "host:port", "ReplicaOptions::coordinator (none)",
       "the coordinator of replica groups (`fsdp coordinator`; fsdp/replicas.h)"},
      {"FSDP_REPLICA_GROUP", "an integer in [0, 1048576)", "ReplicaOptions::group (none)",
       "this process's replica group (fsdp/replicas.h)"},
      {"FSDP_RESTART_COUNT", "an integer >= 0", "TORCHELASTIC_RESTART_COUNT (none)",
       "which round of its launcher this process is (`fsdp run` sets it; 0: the first): a replica group's first "
       "round lets a coordinator that heard no rank of the job start it without listening one heartbeat timeout"},
      {"FSDP_COORDINATOR_TIMEOUT", "seconds, > 0", "ReplicaOptions::coordinator_timeout (60 s)",
       "how long a rank of a replica group waits for a coordinator that stopped answering to come back"},
      {"FSDP_JOB_TOKEN", "16 to 128 of [A-Za-z0-9_-]", "none", "the secret shared by the ranks of one job (`fsdp run` sets it)"},
      {"FSDP_HOST_ID", "any text", "host name, boot id and namespaces",
       "which ranks count as one host (tests run two hosts on one machine)"},
      {"FSDP_STORE_BIND", "all", "MASTER_ADDR's interface",
       "all: the rendezvous store listens on every interface"},
      {"FSDP_STORE_HOSTED", "1", "rank 0 hosts the store", "1: the launcher hosts the store (`fsdp run` sets it)"},
      {"FSDP_RING_PIECE_KIB", "an integer in [4, 1048576]", "CommOptions::ring_piece_bytes (1024)",
       "the ring's piece size in KiB"},
      {"FSDP_HEARTBEAT_INTERVAL", "seconds in [0.01, 60]", "CommOptions::heartbeat_interval (timeout / 5, 0.05 to 1)",
       "seconds between a rank's heartbeats"},
      {"FSDP_FLIGHT_RECORDER", "on or off", "InitOptions::flight_recorder (on)",
       "record each collective in the flight recorder"},
      {"FSDP_FLIGHT_ENTRIES", "an integer in [8, 1048576]", "InitOptions::flight_entries (512)",
       "collectives the flight recorder keeps"},
      {"FSDP_FLIGHT_DIR", "a directory", "fsdp-flight (or the program's flight::set_default_dir)",
       "where flight-recorder dumps go, and fsdp run's finding (launcher-node<k>.json)"},
      {"FSDP_ALLOC_CACHE", "on or off", "on", "the counting allocator keeps freed blocks for reuse"},
      {"FSDP_PROGRESS", "on, off, lines or tty", "on", "progress lines on rank 0 (lines: full lines; tty: one line)"},
      {"FSDP_PROGRESS_EVERY", "seconds, >= 0", "ProgressOptions::interval_s (5)",
       "seconds between progress lines off a terminal; 0: every update"},
  };
  return table;
}

namespace {

std::string lower(const char* v) {
  std::string s(v);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "NAME='value' is not <what>; expected <allowed>; unset it for the default".
// An empty `what`: "NAME='value': expected <allowed>; ...".
[[noreturn]] void bad(const char* name, const char* value, const std::string& what, const std::string& allowed) {
  throw Error(detail::cat(name, "='", value, "'", what.empty() ? ":" : " is not " + what + ";", " expected ", allowed,
                          "; unset it for the default"));
}

class Reader {
 public:
  explicit Reader(const Lookup& lookup) : lookup_(lookup) {}

  // The value, or null when unset or empty.
  const char* raw(const char* name) const {
    const char* v = lookup_(name);
    return (v && *v) ? v : nullptr;
  }

  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi, const char* what) const {
    const char* v = raw(name);
    if (!v) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) bad(name, v, "an integer in range", detail::cat(what, ", an integer in [", lo, ", ", hi, "]"));
    return x;
  }

  // Seconds in [lo_s, hi_s] ((lo_s, hi_s] when lo_open); callers convert to ms.
  std::optional<double> seconds(const char* name, double lo_s, bool lo_open, double hi_s, const char* what) const {
    const char* v = raw(name);
    if (!v) return std::nullopt;
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    const bool ok = end != v && !*end && std::isfinite(s) && (lo_open ? s > lo_s : s >= lo_s) && s <= hi_s;
    if (!ok)
      bad(name, v, "a number of seconds in range",
          detail::cat(what, " in ", lo_open ? "(" : "[", lo_s, ", ", hi_s, "] (e.g. 30 or 2.5)"));
    return s;
  }

  // on/off switch: on, 1, yes, true / off, 0, no, false. `what`: what on
  // and off mean, for the message.
  bool on_off(const char* name, bool fallback, const std::string& what) const {
    const char* v = raw(name);
    if (!v) return fallback;
    const std::string s = lower(v);
    for (const char* t : {"on", "1", "yes", "true"})
      if (s == t) return true;
    for (const char* f : {"off", "0", "no", "false"})
      if (s == f) return false;
    bad(name, v, "known", detail::cat("on or off (", what, ")"));
  }

  // One of `choices` (lower-cased), or `fallback` when unset.
  // `what`/`allowed` as bad() takes them.
  std::string choice(const char* name, std::initializer_list<const char*> choices, const char* fallback,
                     const std::string& what, const std::string& allowed) const {
    const char* v = raw(name);
    if (!v) return fallback;
    const std::string s = lower(v);
    for (const char* c : choices)
      if (s == c) return s;
    bad(name, v, what, allowed);
  }

 private:
  const Lookup& lookup_;
};

std::optional<int64_t> ms(std::optional<double> s) {
  if (!s) return std::nullopt;
  return static_cast<int64_t>(std::llround(*s * 1000));
}

// torchrun's variables, as `fsdp run` sets them (and their defaults when
// no launcher's are set: a world of one).
void read_torchrun(const Reader& r, EnvConfig& c) {
  constexpr int64_t kMaxRanks = 1 << 20;
  c.world_from_env = r.raw("RANK") && r.raw("WORLD_SIZE");
  const char* launch = "start ranks with `fsdp run` or set it correctly";
  c.world_size = static_cast<int>(r.integer("WORLD_SIZE", 1, kMaxRanks, "the number of ranks").value_or(1));
  c.rank = static_cast<int>(r.integer("RANK", 0, kMaxRanks, "this process's rank").value_or(0));
  if (c.rank >= c.world_size)
    throw Error(detail::cat("RANK=", c.rank, " is not below WORLD_SIZE=", c.world_size,
                            ": every rank must be in [0, WORLD_SIZE); ", launch));
  c.local_world_size = static_cast<int>(
      r.integer("LOCAL_WORLD_SIZE", 1, c.world_size, "the ranks on this host").value_or(c.world_from_env ? c.world_size : 1));
  c.local_rank = static_cast<int>(
      r.integer("LOCAL_RANK", 0, kMaxRanks, "this rank's index on its host").value_or(c.rank % c.local_world_size));
  if (c.local_rank >= c.local_world_size)
    throw Error(detail::cat("LOCAL_RANK=", c.local_rank, " is not below LOCAL_WORLD_SIZE=", c.local_world_size,
                            "; ", launch));
  if (const char* a = r.raw("MASTER_ADDR")) c.master_addr = a;
  c.master_port = static_cast<int>(r.integer("MASTER_PORT", 1, 65535, "the store's port").value_or(c.master_port));
}

// `lineage` tells nested launchers apart: this process's in read_env(),
// none for a map a caller passes to parse_env.
EnvConfig parse(const Lookup& lookup, const Lineage& lineage) {
  const Reader r(lookup);
  EnvConfig c;
  // The world: torchrun's variables first (what `fsdp run` sets), read as
  // they always were; else Slurm's, Open MPI's, PMI's or Kubeflow's
  // (config/cluster_env.h). Kubeflow sets RANK and WORLD_SIZE per pod:
  // beside PET_* without LOCAL_RANK they are the pod's, read as Kubeflow's.
  const Lookup set = [&](const char* name) { return r.raw(name); };
  const bool pod = (r.raw("PET_NNODES") || r.raw("PET_NODE_RANK")) && !r.raw("LOCAL_RANK");
  const bool torchrun = (r.raw("RANK") || r.raw("WORLD_SIZE")) && !pod;
  const Launch l = torchrun ? Launch{} : detect_launch(set, lineage);
  if (l.launcher.empty()) {
    read_torchrun(r, c);
    if (c.world_from_env) {  // GROUP_RANK too, and the first log line's words
      const Launch t = detect_launch(set, lineage);
      c.launcher = t.launcher;
      c.launch = t.describe();
    }
  } else {
    c.rank = l.rank;
    c.world_size = l.world_size;
    c.local_rank = l.local_rank;
    c.local_world_size = l.local_world_size;
    c.master_addr = l.master_addr;
    c.master_port = l.master_port;
    c.world_from_env = true;
    c.launcher = l.launcher;
    c.launch = l.describe();
  }

  // The communicator.
  constexpr double kWeek = 86400.0 * 7;
  c.timeout_ms = ms(r.seconds("FSDP_TIMEOUT", 0, true, kWeek, "seconds a collective may take"));
  c.rendezvous_timeout_ms = ms(r.seconds("FSDP_RENDEZVOUS_TIMEOUT", 0, true, kWeek, "seconds to wait for every rank"));
  if (const char* i = r.raw("GLOO_SOCKET_IFNAME")) c.ifname = i;
  const std::string debug = r.choice("FSDP_DEBUG", {"off", "0", "info", "detail"}, "off", "a known level",
                                     "off or detail (detail checks that every rank issues the same collective; info "
                                     "prints one line per choice made)");
  c.debug_info = debug == "info" || debug == "detail";
  c.debug_detail = debug == "detail";
  c.transport = r.choice("FSDP_TRANSPORT", {"auto", "tcp", "cma"}, "auto", "a known transport",
                         "auto (the default: cma when every rank is on this host and may read its "
                         "peers' memory, else tcp), tcp (Gloo over TCP) or cma (cross-memory attach between ranks of "
                         "one host)");
  c.backend = r.choice("FSDP_BACKEND", {"auto", "gloo", "nccl"}, "auto", "a known backend",
                       "auto (the default: the program's CommOptions::backend), gloo (fsdp-cpp's collectives; "
                       "GPU tensors are staged through host memory) or nccl (one GPU per rank)");
  c.tiers = r.on_off("FSDP_TIERS", true,
                     "on, the default: across hosts, cross-memory attach inside each host and TCP between; off: TCP "
                     "for everything across hosts");
  if (r.raw("FSDP_SHARE_HOST"))
    c.share_host = r.on_off("FSDP_SHARE_HOST", true,
                            "on, the default: ranks of one host share one copy of each unit's parameters; off: each "
                            "rank keeps its own and collectives move bytes");
  c.compress = r.choice("FSDP_COMPRESS", {"off", "int8", "int4", "fp8"}, "", "a known compression",
                        "off (every byte exact), int8 (parameters and gradients int8), int4 (parameters int8, "
                        "gradients int4) or fp8 (parameters float8 e4m3, gradients int8)");
  if (r.raw("FSDP_COMPRESS_FEEDBACK"))
    c.compress_feedback = r.on_off("FSDP_COMPRESS_FEEDBACK", true,
                                   "on, the default: compressed gradients keep error feedback; off: plain quantized "
                                   "values, no residual");
  if (const char* t = r.raw("FSDP_JOB_TOKEN")) {
    const std::string tok = t;
    bool ok = tok.size() >= 16 && tok.size() <= 128;
    for (char ch : tok) ok &= std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_';
    if (!ok)
      throw Error(detail::cat("FSDP_JOB_TOKEN has ", tok.size(),
                              " characters; expected 16 to 128 of [A-Za-z0-9_-] (e.g. `openssl rand -hex 16`), "
                              "the same on every node of the job"));
    c.job_token = tok;
  }
  if (const char* h = r.raw("FSDP_HOST_ID")) c.host_id = h;
  if (const char* a = r.raw("FSDP_COORDINATOR")) {
    const std::string v = a;
    const auto colon = v.rfind(':');
    const std::string port = colon == std::string::npos ? "" : v.substr(colon + 1);
    const bool digits = !port.empty() && port.size() <= 5 &&
                        std::all_of(port.begin(), port.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); });
    if (colon == 0 || colon == std::string::npos || !digits || std::stoi(port) < 1 || std::stoi(port) > 65535)
      throw Error(detail::cat("FSDP_COORDINATOR='", v, "': expected host:port (e.g. 10.0.0.5:29400), the address "
                              "`fsdp coordinator` listens on"));
    c.coordinator = v;
  }
  if (auto g = r.integer("FSDP_REPLICA_GROUP", 0, (1 << 20) - 1, "this process's replica group"))
    c.replica_group = static_cast<int>(*g);
  if (auto k = r.integer("FSDP_RESTART_COUNT", 0, INT32_MAX, "its launcher's round"))
    c.restart_count = static_cast<int>(*k);
  else if (auto t = r.integer("TORCHELASTIC_RESTART_COUNT", 0, INT32_MAX, "torchrun's round"))
    c.restart_count = static_cast<int>(*t);
  c.coordinator_timeout_ms =
      ms(r.seconds("FSDP_COORDINATOR_TIMEOUT", 0, true, kWeek, "seconds to wait for the coordinator to come back"));
  if (const char* p = r.raw("FSDP_CUDA_PLUGIN")) c.cuda_plugin = p;
  if (const char* m = r.raw("TORCH_NCCL_ASYNC_ERROR_HANDLING")) c.nccl_async_error_handling = m;
  c.store_bind_all = r.choice("FSDP_STORE_BIND", {"all"}, "", "known",
                              "all (the store listens on every interface)") == "all";
  c.store_hosted = r.choice("FSDP_STORE_HOSTED", {"0", "1"}, "0", "known",
                            "1 (the launcher hosts the store; `fsdp run` sets it) or 0") == "1";
  if (auto kib = r.integer("FSDP_RING_PIECE_KIB", kMinRingPieceBytes >> 10, kMaxRingPieceBytes >> 10,
                           "the ring's piece size in KiB"))
    c.ring_piece_bytes = *kib << 10;
  c.heartbeat_interval_ms = ms(r.seconds("FSDP_HEARTBEAT_INTERVAL", kMinHeartbeatMs / 1000.0, false,
                                         kMaxHeartbeatMs / 1000.0, "seconds between heartbeats"));

  // The process.
  if (r.raw("FSDP_FLIGHT_RECORDER"))
    c.flight_recorder = r.on_off("FSDP_FLIGHT_RECORDER", true, "record each collective in the flight recorder");
  if (auto n = r.integer("FSDP_FLIGHT_ENTRIES", kMinFlightEntries, kMaxFlightEntries, "collectives the recorder keeps"))
    c.flight_entries = static_cast<int>(*n);
  if (const char* d = r.raw("FSDP_FLIGHT_DIR")) c.flight_dir = d;
  c.alloc_cache = r.on_off("FSDP_ALLOC_CACHE", true, "the counting allocator's cache of freed blocks");

  // Progress lines.
  const std::string p = r.choice("FSDP_PROGRESS", {"on", "1", "auto", "yes", "true", "off", "0", "no", "false", "lines", "tty"},
                                 "on", "",
                                 "off (no progress), on (the default), lines (full lines even on a terminal) or tty "
                                 "(rewrite one line)");
  c.progress = (p == "off" || p == "0" || p == "no" || p == "false") ? ProgressMode::OFF
               : p == "lines"                                        ? ProgressMode::LINES
               : p == "tty"                                          ? ProgressMode::TTY
                                                                     : ProgressMode::AUTO;
  c.progress_every_s = r.seconds("FSDP_PROGRESS_EVERY", 0, false, kWeek,
                                 "seconds between progress lines, a number >= 0 (0: every update)");
  return c;
}

}  // namespace

EnvConfig parse_env(const Lookup& lookup) { return parse(lookup, {}); }

EnvConfig read_env() {
  return parse([](const char* name) -> const char* { return std::getenv(name); }, this_process());
}

}  // namespace fsdp::config
