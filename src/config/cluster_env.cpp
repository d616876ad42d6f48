// fsdp-cpp: recognising the launcher (see cluster_env.h).
#include "config/cluster_env.h"

#include <unistd.h>

#include <cctype>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>

#include "common/env.h"
#include "fsdp/errors.h"

namespace fsdp::config {
namespace {

constexpr int64_t kMaxRanks = 1 << 20;

// Reads one launcher's variables, remembering each one it read.
class Vars {
 public:
  Vars(const LaunchLookup& lookup, const char* launcher) : lookup_(lookup), launcher_(launcher) {}

  const char* raw(const char* name) const { return lookup_(name); }
  bool has(const char* name) const { return raw(name) != nullptr; }

  std::optional<std::string> text(const char* name) {
    const char* v = raw(name);
    if (!v) return std::nullopt;
    seen_.push_back(std::string(name) + "=" + v);
    return std::string(v);
  }

  // An integer in [lo, hi]; nullopt when unset.
  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) {
    auto v = text(name);
    if (!v) return std::nullopt;
    size_t used = 0;
    int64_t x = 0;
    bool ok = !v->empty();
    try {
      x = std::stoll(*v, &used);
    } catch (const std::exception&) {
      ok = false;
    }
    if (!ok || used != v->size() || x < lo || x > hi)
      malformed(name, *v, detail::cat("is not an integer in range; expected an integer in [", lo, ", ", hi, "]"));
    return x;
  }

  // "NAME='value' <what>, as <launcher> sets it; start the program with
  // <launcher> or unset it": `what` says what was expected.
  [[noreturn]] void malformed(const char* name, const std::string& value, const std::string& what) const {
    throw Error(detail::cat(name, "='", value, "' ", what, ", as ", launcher_, " sets it; start the program with ",
                            launcher_, " or unset it"));
  }

  // Every one of `names` set, or none: else one error naming the missing ones.
  void all_or_none(std::initializer_list<const char*> names) const {
    std::string set, missing;
    for (const char* n : names) {
      std::string& list = has(n) ? set : missing;
      list += (list.empty() ? "" : ", ") + std::string(n);
    }
    if (!set.empty() && !missing.empty())
      throw Error(detail::cat("partial ", launcher_, " variables: ", set, " set but ", missing,
                              " not; a process started by ", launcher_, " has all of them (unset the others, or "
                              "start it with ", launcher_, ")"));
  }

  [[noreturn]] void contradiction(const std::string& what) const {
    std::string vars;
    for (auto& s : seen_) vars += (vars.empty() ? "" : ", ") + s;
    throw Error(detail::cat(launcher_, "'s variables contradict each other: ", what, " (", vars,
                            "); start the program with ", launcher_, " or unset them"));
  }

  std::vector<std::string> seen() const { return seen_; }

 private:
  const LaunchLookup& lookup_;
  const char* launcher_;
  std::vector<std::string> seen_;
};

// MASTER_ADDR/MASTER_PORT override what the launcher derives.
void master_override(Vars& v, std::string& addr, int& port) {
  if (auto a = v.text("MASTER_ADDR")) addr = *a;
  if (auto p = v.integer("MASTER_PORT", 1, 65535)) port = static_cast<int>(*p);
}

void check_ranks(Vars& v, const Launch& l) {
  if (l.rank >= l.world_size) v.contradiction(detail::cat("rank ", l.rank, " is not below the world size ", l.world_size));
  if (l.local_rank >= l.local_world_size)
    v.contradiction(detail::cat("local rank ", l.local_rank, " is not below the ranks on this host, ", l.local_world_size));
  if (l.local_world_size > l.world_size)
    v.contradiction(detail::cat(l.local_world_size, " ranks on this host but ", l.world_size, " in the world"));
  if (l.node_rank >= l.nnodes)
    v.contradiction(detail::cat("node ", l.node_rank, " is not below the number of nodes, ", l.nnodes));
}

// The launcher's rank and world size (both, or an error naming the missing
// one); with `local_rank`/`local_size` (null: the caller reads its own), the
// host's ranks too (all of the world when unset), the host's index and the
// number of hosts following from them.
void read_ranks(Vars& v, Launch& l, const char* rank, const char* size, const char* local_rank = nullptr,
                const char* local_size = nullptr) {
  v.all_or_none({rank, size});
  l.world_size = static_cast<int>(*v.integer(size, 1, kMaxRanks));
  l.rank = static_cast<int>(*v.integer(rank, 0, kMaxRanks));
  if (!local_rank) return;
  l.local_world_size = static_cast<int>(v.integer(local_size, 1, kMaxRanks).value_or(l.world_size));
  l.local_rank = static_cast<int>(v.integer(local_rank, 0, kMaxRanks).value_or(l.rank % l.local_world_size));
  l.nnodes = (l.world_size + l.local_world_size - 1) / l.local_world_size;
  l.node_rank = l.rank / l.local_world_size;
}

Launch torchrun(const LaunchLookup& lookup) {
  Vars v(lookup, "torchrun");
  Launch l;
  l.launcher = "torchrun";
  read_ranks(v, l, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  l.node_rank = static_cast<int>(v.integer("GROUP_RANK", 0, kMaxRanks).value_or(l.node_rank));
  master_override(v, l.master_addr, l.master_port);
  check_ranks(v, l);
  l.variables = v.seen();
  return l;
}

// Where Slurm's task 0 (or node 0) runs: the first host of the step's (or
// job's) list (srun's default block distribution); the port from the job's
// id. Unchanged when not said.
void slurm_store(Vars& v, int nnodes, std::string& addr, int& port) {
  const char* name = "SLURM_STEP_NODELIST";
  std::optional<std::string> list = v.text(name);
  if (!list) list = v.text(name = "SLURM_JOB_NODELIST");
  if (list) {
    std::vector<std::string> hosts;
    try {
      hosts = expand_nodelist(*list);
    } catch (const Error& e) {
      v.malformed(name, *list, detail::cat("is not a host list (", e.what(), ")"));
    }
    if (!hosts.empty()) addr = hosts.front();
  } else if (nnodes > 1) {
    v.contradiction("several nodes but no SLURM_JOB_NODELIST to find the first one");
  }
  if (auto id = v.text("SLURM_JOB_ID")) port = derived_port(*id);
}

Launch slurm(const LaunchLookup& lookup) {
  Vars v(lookup, "Slurm (srun)");
  Launch l;
  l.launcher = "slurm";
  read_ranks(v, l, "SLURM_PROCID", "SLURM_NTASKS");
  l.local_rank = static_cast<int>(v.integer("SLURM_LOCALID", 0, kMaxRanks).value_or(0));
  l.node_rank = static_cast<int>(v.integer("SLURM_NODEID", 0, kMaxRanks).value_or(0));
  l.nnodes = static_cast<int>(v.integer("SLURM_NNODES", 1, kMaxRanks).value_or(1));
  if (auto per = v.text("SLURM_TASKS_PER_NODE")) {
    std::vector<int> tasks;
    try {
      tasks = expand_tasks_per_node(*per);
    } catch (const Error& e) {
      v.malformed("SLURM_TASKS_PER_NODE", *per, detail::cat("is not a list of tasks per node (", e.what(), ")"));
    }
    if (static_cast<int>(tasks.size()) != l.nnodes)
      v.contradiction(detail::cat("SLURM_TASKS_PER_NODE names ", tasks.size(), " nodes, SLURM_NNODES ", l.nnodes));
    int64_t sum = 0;
    for (int t : tasks) sum += t;
    if (sum != l.world_size)
      v.contradiction(detail::cat("SLURM_TASKS_PER_NODE adds up to ", sum, " tasks, SLURM_NTASKS is ", l.world_size));
    if (l.node_rank < static_cast<int>(tasks.size())) l.local_world_size = tasks[l.node_rank];
  } else {
    l.local_world_size = l.nnodes == 1 ? l.world_size : 1;
  }
  slurm_store(v, l.nnodes, l.master_addr, l.master_port);
  master_override(v, l.master_addr, l.master_port);
  check_ranks(v, l);
  l.variables = v.seen();
  return l;
}

// Open MPI and PMI: no host for rank 0 is named; one host needs none.
Launch mpi(const LaunchLookup& lookup, const char* name, const char* launcher, const char* rank, const char* size,
           const char* local_rank, const char* local_size, std::initializer_list<const char*> job_ids) {
  Vars v(lookup, launcher);
  Launch l;
  l.launcher = name;
  read_ranks(v, l, rank, size, local_rank, local_size);
  for (const char* id : job_ids)
    if (auto j = v.text(id)) {
      l.master_port = derived_port(*j);
      break;
    }
  const bool addr_given = v.has("MASTER_ADDR");
  master_override(v, l.master_addr, l.master_port);
  if (l.nnodes > 1 && !addr_given)
    throw Error(detail::cat(launcher, " started ", l.world_size, " ranks on ", l.nnodes, " hosts (", size, "=",
                            l.world_size, ", ", local_size, "=", l.local_world_size, ") but names no host for rank "
                            "0: export MASTER_ADDR=<rank 0's host> (and MASTER_PORT) to every rank, e.g. mpirun -x "
                            "MASTER_ADDR=..."));
  check_ranks(v, l);
  l.variables = v.seen();
  return l;
}

// Kubeflow's pods: their number (PET_NNODES), this one's index, and the
// processes each asks for (PET_NPROC_PER_NODE, 0 when unset).
void read_pods(Vars& v, int& nnodes, int& node_rank, int& nproc) {
  v.all_or_none({"PET_NNODES", "PET_NODE_RANK"});
  // PET_NNODES may be elastic, "MIN:MAX"; a fixed size is "N" or "N:N".
  const std::string given = *v.text("PET_NNODES");
  std::string nn = given;
  const auto colon = nn.find(':');
  if (colon != std::string::npos) {
    if (nn.substr(0, colon) != nn.substr(colon + 1))
      v.contradiction("PET_NNODES is a range (elastic), which fsdp run does not support; give the PyTorchJob a "
                      "fixed number of replicas");
    nn = nn.substr(0, colon);
  }
  try {
    size_t used = 0;
    nnodes = std::stoi(nn, &used);
    if (used != nn.size() || nnodes < 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    v.malformed("PET_NNODES", given, "is not a number of pods; expected N or N:N with N >= 1");
  }
  node_rank = static_cast<int>(*v.integer("PET_NODE_RANK", 0, kMaxRanks));
  nproc = static_cast<int>(v.integer("PET_NPROC_PER_NODE", 1, kMaxRanks).value_or(0));
  if (node_rank >= nnodes)
    v.contradiction(detail::cat("node ", node_rank, " is not below the number of nodes, ", nnodes));
}

Launch kubeflow(const LaunchLookup& lookup) {
  Vars v(lookup, "Kubeflow's PyTorchJob");
  Launch l;
  l.launcher = "kubeflow";
  read_pods(v, l.nnodes, l.node_rank, l.local_world_size);
  if (l.local_world_size == 0) l.local_world_size = 1;
  if (l.local_world_size > 1)
    throw Error(detail::cat("Kubeflow's PyTorchJob asks for ", l.local_world_size, " processes per pod "
                            "(PET_NPROC_PER_NODE) and its RANK counts pods, not processes: start the program with "
                            "`fsdp run` in each pod (it reads PET_NNODES, PET_NODE_RANK and PET_NPROC_PER_NODE)"));
  l.world_size = l.nnodes;
  l.rank = l.node_rank;
  master_override(v, l.master_addr, l.master_port);
  check_ranks(v, l);
  l.variables = v.seen();
  return l;
}

// One of the cluster launchers that place a rank by themselves.
struct Cluster {
  const char* name;  // Launch::launcher
  const char* command;  // what a user types to start it, for the messages
  // Whether its variables are set.
  bool (*set)(const LaunchLookup& lookup);
  // This process's place in its world (rank, world size first): what an
  // ancestor with the same values inherited rather than was given.
  std::vector<const char*> place;
  Launch (*read)(const LaunchLookup& lookup);
};

bool has(const LaunchLookup& lookup, const char* name) { return lookup(name) != nullptr; }

Launch openmpi(const LaunchLookup& lookup) {
  return mpi(lookup, "openmpi", "Open MPI (mpirun)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
             "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
             {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"});
}

Launch pmi(const LaunchLookup& lookup) {
  return mpi(lookup, "pmi", "PMI (MPICH's or Intel MPI's mpirun)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
             "MPI_LOCALNRANKS", {"PMI_KVSNAME", "PMIX_NAMESPACE"});
}

// Where the lineage cannot tell, the one whose variables say most (Slurm's
// name the hosts) places a world that several describe alike.
const std::vector<Cluster>& clusters() {
  static const std::vector<Cluster> all = {
      {"slurm", "srun",
       // Inside a step only: a batch script's own shell has SLURM_PROCID and
       // SLURM_NTASKS (the allocation's) but no step, and a program it runs
       // directly is one process.
       [](const LaunchLookup& l) {
         return (has(l, "SLURM_PROCID") || has(l, "SLURM_NTASKS")) &&
                (has(l, "SLURM_STEP_ID") || has(l, "SLURM_STEPID"));
       },
       {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID"}, slurm},
      {"openmpi", "mpirun",
       [](const LaunchLookup& l) { return has(l, "OMPI_COMM_WORLD_RANK") || has(l, "OMPI_COMM_WORLD_SIZE"); },
       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, openmpi},
      {"pmi", "mpiexec", [](const LaunchLookup& l) { return has(l, "PMI_RANK") || has(l, "PMI_SIZE"); },
       {"PMI_RANK", "PMI_SIZE"}, pmi},
  };
  return all;
}

// "slurm's (SLURM_PROCID=0 SLURM_NTASKS=1)": its rank and world size as set.
std::string world_of(const Cluster& c, const LaunchLookup& lookup) {
  std::string vars;
  for (size_t i = 0; i < 2; ++i)
    if (const char* v = lookup(c.place[i])) vars += detail::cat(vars.empty() ? "" : " ", c.place[i], "=", v);
  return detail::cat(c.name, "'s (", vars, ")");
}

bool same_world(const Cluster& a, const Cluster& b, const LaunchLookup& lookup) {
  for (size_t i = 0; i < 2; ++i) {
    const char *x = lookup(a.place[i]), *y = lookup(b.place[i]);
    if (!x || !y || std::string(x) != y) return false;
  }
  return true;
}

// Whether `a` has `c`'s place as this process has it: it inherited it, so
// `c` started a process at or above `a`.
bool carries(const Ancestor& a, const Cluster& c, const LaunchLookup& lookup) {
  for (const char* name : c.place) {
    const char* v = lookup(name);
    if (!v) continue;
    auto it = a.env.find(name);
    if (it == a.env.end() || it->second != v) return false;
  }
  return true;
}

// Which of `set` (two or more launchers' variables) started this process;
// the others' reasons go to `ignored`. Throws when they describe different
// worlds and the lineage cannot tell.
const Cluster& innermost(const std::vector<const Cluster*>& set, const LaunchLookup& lookup, const Lineage& lineage,
                         std::vector<std::string>& ignored) {
  auto in = [](const std::vector<const Cluster*>& v, const Cluster* c) {
    return std::find(v.begin(), v.end(), c) != v.end();
  };
  // Those set for this process by the launcher that started it, and why
  // the others are an outer launcher's.
  std::vector<const Cluster*> inner = set;
  std::string outer;
  // Why the lineage does not pick one of `inner`.
  std::string untold = "nothing is known of the processes above this one";

  const Cluster* slurm_set = nullptr;
  for (const Cluster* c : set)
    if (std::string(c->name) == "slurm") slurm_set = c;
  const char* task = lookup("SLURM_TASK_PID");
  const bool srun_forked_it = slurm_set && lineage.pid > 0 && task && std::to_string(lineage.pid) == task;
  if (srun_forked_it) {
    // slurmstepd forks each task itself: variables it did not set came with
    // srun's environment, from outside the step.
    inner = {slurm_set};
    outer = detail::cat("srun started this process itself (SLURM_TASK_PID=", task,
                        "), so they came with srun's environment, from outside its step");
  } else if (lineage.ancestors) {
    // The nearest ancestor with some of the places but not all: those it
    // lacks were given below it, by the launcher that started this process.
    const std::vector<Ancestor> above = lineage.ancestors();
    if (!above.empty()) untold = "every process above this one has them all";
    for (const Ancestor& a : above) {
      if (!a.readable) {
        untold = detail::cat("process ", a.pid, " (", a.command, ") above this one cannot be read");
        break;
      }
      std::vector<const Cluster*> lacked;
      for (const Cluster* c : set)
        if (!carries(a, *c, lookup)) lacked.push_back(c);
      if (lacked.empty()) continue;
      std::string names;
      for (const Cluster* c : lacked) names += detail::cat(names.empty() ? "" : " or ", c->name, "'s");
      if (lacked.size() < set.size()) {
        inner = lacked;
        outer = detail::cat("an outer launcher's, already set for process ", a.pid, " (", a.command,
                            ") above this one, which has no ", names);
      }
      untold = detail::cat("process ", a.pid, " (", a.command, ") above this one has none of ", names,
                           ": one launcher set them at once");
      break;
    }
  }
  // Several set at once describe one world, or not.
  bool alike = true;
  for (const Cluster* c : inner) alike &= same_world(*c, *inner.front(), lookup);
  if (!alike) {
    // The example: the first in clusters()' order as the outer one (Slurm
    // around an MPI launcher, as clusters nest them).
    const Cluster &outside = *inner[0], &inside = *inner[1];
    std::string unset;
    for (size_t i = 0; i < 2; ++i) unset += detail::cat(" -u ", outside.place[i]);
    throw Error(detail::cat("two launchers' variables describe different worlds, ", world_of(inside, lookup), " and ",
                            world_of(outside, lookup), ", and which one started this process cannot be told (",
                            untold, "): start it with one launcher, or unset the outer one's variables where the "
                            "inner one starts (e.g. when ", outside.command, " is the outer one: env", unset, " ",
                            inside.command, " ...)"));
  }
  const Cluster* winner = nullptr;
  for (const Cluster& c : clusters())
    if (!winner && in(inner, &c)) winner = &c;
  for (const Cluster* c : set)
    if (c != winner)
      // `srun --mpi=pmi2` sets PMI's for its own task: the same world.
      ignored.push_back(in(inner, c) || (srun_forked_it && same_world(*c, *winner, lookup))
                            ? detail::cat(world_of(*c, lookup), " variables describe the same world")
                            : detail::cat(world_of(*c, lookup), " variables ignored: ", outer));
  return *winner;
}

}  // namespace

std::string Launch::describe() const {
  if (launcher.empty()) return "launcher: none (one process: no launcher's variables are set)";
  std::string vars;
  for (auto& s : variables) vars += (vars.empty() ? "" : " ") + s;
  std::string why;
  for (auto& s : ignored) why += "; " + s;
  return detail::cat("launcher: ", launcher, " (", vars, "): rank ", rank, " of ", world_size, ", local rank ",
                     local_rank, " of ", local_world_size, ", node ", node_rank, " of ", nnodes, ", store at ",
                     master_addr, ":", master_port, why);
}

Lineage this_process() {
  Lineage l;
  l.pid = static_cast<int>(::getpid());
  l.ancestors = [] {
    std::vector<Ancestor> out;
    // Bounded: a pid reused while we climb must not loop.
    for (int pid = static_cast<int>(::getppid()), depth = 0; pid > 0 && depth < 64; ++depth) {
      const std::string dir = "/proc/" + std::to_string(pid);
      Ancestor a;
      a.pid = pid;
      a.command = ::fsdp::detail::read_proc_text(dir + "/comm", 4096);
      if (const auto nl = a.command.find('\n'); nl != std::string::npos) a.command.resize(nl);
      const std::string env_text = ::fsdp::detail::read_proc_text(dir + "/environ", size_t(2) << 20);
      for (size_t at = 0; at < env_text.size();) {
        size_t end = env_text.find('\0', at);
        if (end == std::string::npos) end = env_text.size();
        const std::string entry = env_text.substr(at, end - at);
        const size_t eq = entry.find('=');
        if (eq != std::string::npos) a.env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
        at = end + 1;
      }
      // An unreadable environ reads as empty; the empty one of a process
      // started with none says nothing either.
      a.readable = !a.env.empty();
      out.push_back(a);
      if (!a.readable || pid == 1) break;
      // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
      std::string line = ::fsdp::detail::read_proc_text(dir + "/stat", 4096);
      if (const auto nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
      const size_t close = line.rfind(')');
      int ppid = 0;
      if (close == std::string::npos || std::sscanf(line.c_str() + close + 1, " %*c %d", &ppid) != 1) break;
      pid = ppid;
    }
    return out;
  };
  return l;
}

Launch detect_launch(const LaunchLookup& lookup, const Lineage& lineage) {
  // Kubeflow sets RANK and WORLD_SIZE per pod; torchrun and `fsdp run` set
  // LOCAL_RANK too. RANK without LOCAL_RANK beside PET_*: the pod's.
  const bool pet = has(lookup, "PET_NNODES") || has(lookup, "PET_NODE_RANK");
  const bool by_torchrun = (has(lookup, "RANK") || has(lookup, "WORLD_SIZE")) && (!pet || has(lookup, "LOCAL_RANK"));
  std::vector<const Cluster*> set;
  for (const Cluster& c : clusters())
    if (c.set(lookup)) set.push_back(&c);
  std::vector<std::string> ignored;
  Launch l;
  if (by_torchrun) {
    l = torchrun(lookup);
    for (const Cluster* c : set)
      ignored.push_back(detail::cat(world_of(*c, lookup), " variables ignored: torchrun's are set for each rank by "
                                    "the launcher that started it (torchrun, fsdp run), inside the others"));
  } else if (!set.empty()) {
    for (const Cluster* c : set)
      if (c->read == slurm) {
        // Read only where two launchers' are set; checked wherever Slurm's are.
        Vars v(lookup, "Slurm (srun)");
        v.integer("SLURM_TASK_PID", 1, std::numeric_limits<int32_t>::max());
      }
    l = (set.size() == 1 ? *set.front() : innermost(set, lookup, lineage, ignored)).read(lookup);
  } else if (pet) {
    return kubeflow(lookup);
  } else {
    if (const char* a = lookup("MASTER_ADDR")) l.master_addr = a;
    return l;
  }
  if (pet)
    ignored.push_back(detail::cat("kubeflow's (PET_NNODES=", lookup("PET_NNODES") ? lookup("PET_NNODES") : "",
                                  " PET_NODE_RANK=", lookup("PET_NODE_RANK") ? lookup("PET_NODE_RANK") : "",
                                  ") variables ignored: the pod's, which holds the launcher that started this process"));
  l.ignored = ignored;
  return l;
}

std::string NodeLaunch::describe() const {
  if (launcher.empty()) return "none";
  std::string vars;
  for (auto& s : variables) vars += (vars.empty() ? "" : " ") + s;
  return detail::cat(launcher, " (", vars, "): node ", node_rank, " of ", nnodes,
                     nproc_per_node ? detail::cat(", ", nproc_per_node, " ranks per node") : std::string(),
                     master_addr.empty() ? std::string() : detail::cat(", store at ", master_addr, ":", master_port));
}

NodeLaunch detect_node_launch(const LaunchLookup& lookup) {
  auto has = [&](const char* n) { return lookup(n) != nullptr; };
  NodeLaunch n;
  if ((has("SLURM_NODEID") || has("SLURM_NNODES")) && (has("SLURM_STEP_ID") || has("SLURM_STEPID"))) {
    Vars v(lookup, "Slurm (srun)");
    v.all_or_none({"SLURM_NODEID", "SLURM_NNODES"});
    n.launcher = "slurm";
    n.nnodes = static_cast<int>(*v.integer("SLURM_NNODES", 1, kMaxRanks));
    n.node_rank = static_cast<int>(*v.integer("SLURM_NODEID", 0, kMaxRanks));
    if (n.node_rank >= n.nnodes)
      v.contradiction(detail::cat("node ", n.node_rank, " is not below the number of nodes, ", n.nnodes));
    // One `fsdp run` per node: it starts the node's ranks itself.
    if (auto tasks = v.integer("SLURM_NTASKS", 1, kMaxRanks); tasks && *tasks != n.nnodes)
      throw Error(detail::cat("fsdp run starts each node's ranks itself, so it runs once per node, but this srun "
                              "step runs SLURM_NTASKS=", *tasks, " tasks on SLURM_NNODES=", n.nnodes,
                              " nodes: start it with one task per node (srun --ntasks=", n.nnodes,
                              " --ntasks-per-node=1 fsdp run -n RANKS_PER_NODE -- PROGRAM; in a batch script "
                              "--ntasks=$SLURM_NNODES, or srun takes the job's tasks and ignores "
                              "--ntasks-per-node), or start the program itself with srun (srun "
                              "--ntasks-per-node=RANKS_PER_NODE PROGRAM)"));
    n.master_addr = "127.0.0.1";
    slurm_store(v, n.nnodes, n.master_addr, n.master_port);
    master_override(v, n.master_addr, n.master_port);
    n.variables = v.seen();
  } else if (has("PET_NNODES") || has("PET_NODE_RANK")) {
    Vars v(lookup, "Kubeflow's PyTorchJob");
    n.launcher = "kubeflow";
    read_pods(v, n.nnodes, n.node_rank, n.nproc_per_node);
    master_override(v, n.master_addr, n.master_port);
    if (n.nnodes > 1 && (n.master_addr.empty() || !n.master_port))
      v.contradiction("several pods but no MASTER_ADDR and MASTER_PORT naming pod 0 (the PyTorchJob's operator "
                      "sets them)");
    n.variables = v.seen();
  }
  return n;
}

LaunchLookup without_cluster_variables(const LaunchLookup& lookup) {
  return [lookup](const char* name) -> const char* {
    for (const char* prefix : {"SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "PET_"})
      if (std::string(name).rfind(prefix, 0) == 0) return nullptr;
    return lookup(name);
  };
}

std::vector<std::string> expand_nodelist(const std::string& list) {
  auto bad = [&](const std::string& why) -> Error {
    return Error(detail::cat("Slurm's node list '", list, "' is malformed (", why, "); expected e.g. node[01-04,07],gpu5"));
  };
  std::vector<std::string> out;
  size_t i = 0;
  while (i < list.size()) {
    // One entry: a prefix, then optionally [ranges], up to a top-level comma.
    std::string prefix;
    while (i < list.size() && list[i] != ',' && list[i] != '[') prefix += list[i++];
    if (i < list.size() && list[i] == '[') {
      const size_t close = list.find(']', i);
      if (close == std::string::npos) throw bad("an unclosed '['");
      const std::string ranges = list.substr(i + 1, close - i - 1);
      i = close + 1;
      std::string suffix;
      while (i < list.size() && list[i] != ',') suffix += list[i++];
      if (suffix.find('[') != std::string::npos) throw bad("more than one bracket in an entry");
      size_t r = 0;
      while (r <= ranges.size()) {
        size_t end = ranges.find(',', r);
        if (end == std::string::npos) end = ranges.size();
        const std::string part = ranges.substr(r, end - r);
        const size_t dash = part.find('-');
        const std::string lo = part.substr(0, dash), hi = dash == std::string::npos ? lo : part.substr(dash + 1);
        auto digits = [](const std::string& s) {
          if (s.empty() || s.size() > 9) return false;
          for (char c : s)
            if (!std::isdigit(static_cast<unsigned char>(c))) return false;
          return true;
        };
        if (!digits(lo) || !digits(hi)) throw bad("'" + part + "' is not a number or a range of numbers");
        const long a = std::stol(lo), b = std::stol(hi);
        if (b < a) throw bad("the range '" + part + "' runs backwards");
        if (b - a > 100000) throw bad("the range '" + part + "' is too long");
        for (long x = a; x <= b; ++x) {
          std::string n = std::to_string(x);
          if (n.size() < lo.size()) n.insert(0, lo.size() - n.size(), '0');  // node01: the padding kept
          out.push_back(prefix + n + suffix);
        }
        r = end + 1;
      }
    } else if (prefix.empty()) {
      throw bad("an empty entry");
    } else {
      out.push_back(prefix);
    }
    if (i < list.size() && list[i] == ',') {
      ++i;
      if (i == list.size()) throw bad("a trailing comma");
    }
  }
  if (out.empty()) throw bad("no host");
  return out;
}

std::vector<int> expand_tasks_per_node(const std::string& spec) {
  auto bad = [&]() {
    return Error(detail::cat("Slurm's tasks per node '", spec, "' is malformed; expected e.g. 4(x2),3"));
  };
  std::vector<int> out;
  size_t i = 0;
  while (i < spec.size()) {
    size_t used = 0;
    int n = 0, times = 1;
    try {
      n = std::stoi(spec.substr(i), &used);
    } catch (const std::exception&) {
      throw bad();
    }
    if (n < 1) throw bad();
    i += used;
    if (spec.compare(i, 2, "(x") == 0) {
      i += 2;
      try {
        times = std::stoi(spec.substr(i), &used);
      } catch (const std::exception&) {
        throw bad();
      }
      i += used;
      if (times < 1 || times > (1 << 20) || i >= spec.size() || spec[i] != ')') throw bad();
      ++i;
    }
    out.insert(out.end(), times, n);
    if (i < spec.size()) {
      if (spec[i] != ',' || i + 1 == spec.size()) throw bad();
      ++i;
    }
  }
  if (out.empty()) throw bad();
  return out;
}

int derived_port(const std::string& job_id) {
  // FNV-1a over the id, so non-numeric ids (PMIx namespaces) spread too; a
  // numeric Slurm id maps to 20000 + id mod 20000, consecutive ids apart.
  bool numeric = !job_id.empty() && job_id.size() < 18;
  for (char c : job_id) numeric &= std::isdigit(static_cast<unsigned char>(c)) != 0;
  if (numeric) return 20000 + static_cast<int>(std::stoll(job_id) % 20000);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : job_id) h = (h ^ c) * 1099511628211ull;
  return 20000 + static_cast<int>(h % 20000);
}

}  // namespace fsdp::config
