// fsdp-cpp: which launcher started this process, and where it sits —
// torchrun's variables, Slurm's, Open MPI's, PMI's, or Kubeflow's
// PyTorchJob's, recognised with no flags. Torch-free.
// defines: config::Launch, config::Ancestor, config::Lineage,
//          config::this_process, config::detect_launch, config::NodeLaunch,
//          config::detect_node_launch, config::without_cluster_variables,
//          config::expand_nodelist, config::expand_tasks_per_node,
//          config::derived_port
//
// The launcher that started this process wins, the innermost of those whose
// variables are set: clusters nest launchers (an `mpirun` inside an `srun`
// step; Open MPI and MPICH start their daemons on other nodes with srun, so
// every rank also has the daemon's step variables; `fsdp run` inside a step
// or a pod), and each child inherits the variables of every launcher above.
//   torchrun   RANK, WORLD_SIZE [, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//              MASTER_ADDR, MASTER_PORT] (also what `fsdp run` sets): always
//              the innermost, set for each rank by the launcher that forks it
//   openmpi    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   pmi        PMI_RANK, PMI_SIZE [, MPI_LOCALRANKID, MPI_LOCALNRANKS]
//   slurm      (inside an srun step: SLURM_STEP_ID set; a batch script's own
//              shell is not a rank) SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//              SLURM_NNODES, SLURM_TASKS_PER_NODE ("4(x2),3"),
//              SLURM_JOB_NODELIST ("node[01-04,07]": the first host is the
//              master), SLURM_JOB_ID (the port: 20000 + id mod 20000)
//   kubeflow   PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE (its RANK and
//              WORLD_SIZE count pods, not processes: with more than one
//              process per pod, run `fsdp run` in each pod); always the
//              outermost: the pod holds every other launcher
// Where MPI's and Slurm's are both set, the lineage decides, not the list:
// srun started this process itself when SLURM_TASK_PID is its pid (and then
// set the MPI variables it has, as `srun --mpi=pmi2` does, or passed them on
// from outside the step); otherwise the nearest ancestor that has one
// launcher's variables but not the other's runs inside the first, and the
// other started this process. Where the lineage cannot tell (unreadable, or
// both set at once): the same world (rank and size) is read from Slurm's
// variables, which name the hosts; different worlds are one fsdp::Error
// naming both.
// MASTER_ADDR and MASTER_PORT, when set, override the derived ones. MPI
// names no host for rank 0: across hosts under mpirun, MASTER_ADDR is
// required. Partial or contradictory variables are one fsdp::Error naming
// them.
//
// config::parse_env (fsdp/config.h) places the rank with detect_launch
// where torchrun's RANK and WORLD_SIZE are not set (torchrun's it reads as
// it always did), and make_communicator_from_env prints describe() as each
// rank's first log line, which also says which launchers' variables were
// ignored and why; `fsdp run` places its node with detect_node_launch.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fsdp::config {

// Where this process sits, and which launcher said so.
struct Launch {
  // "torchrun", "slurm", "openmpi", "pmi", "kubeflow"; "" when none: one process.
  std::string launcher;
  // The variables it was read from, "NAME=value" each (for the first log line).
  std::vector<std::string> variables;
  // This process's rank and the world's size.
  int rank = 0, world_size = 1;
  // Its index among the ranks of its host, and their number.
  int local_rank = 0, local_world_size = 1;
  // Its host's index, and the number of hosts.
  int node_rank = 0, nnodes = 1;
  // Where rank 0 (or node 0's launcher) hosts the store.
  std::string master_addr = "127.0.0.1";
  // The store's port.
  int master_port = 29500;
  // The other launchers whose variables are set, each with why they were not
  // read: "slurm's variables ignored (SLURM_PROCID=0 SLURM_NTASKS=1): ...".
  std::vector<std::string> ignored;

  // "launcher: slurm (SLURM_PROCID=3 SLURM_NTASKS=8 ...): rank 3 of 8, local rank 1 of 4, node 0 of 2,
  // store at node01:23456", then "; " and each of `ignored`; "launcher: none (one process)".
  std::string describe() const;
};

// A variable's value, or null when unset.
using LaunchLookup = std::function<const char*(const char* name)>;

// A process above this one, as /proc shows it.
struct Ancestor {
  int pid = 0;
  // Its name (/proc/PID/comm), e.g. "mpirun".
  std::string command;
  // Whether its environment could be read (not: another user's, or gone).
  bool readable = false;
  // Its environment as it started (/proc/PID/environ): what it passed on.
  std::map<std::string, std::string> env;
};

// This process and the ones above it: which launcher started it, where the
// variables alone cannot tell.
struct Lineage {
  // This process's id; 0: unknown.
  int pid = 0;
  // Its ancestors, the parent first, up to pid 1 or the first it cannot
  // read; called only where two launchers' variables are set. Null: unknown.
  std::function<std::vector<Ancestor>()> ancestors;
};

// This process's lineage, from getpid() and /proc (Linux).
Lineage this_process();

// The launcher `lookup`'s variables name, and where this process sits;
// `lineage` tells nested launchers apart (the default knows nothing: two
// launchers that describe different worlds are then an error). Throws
// fsdp::Error naming the variables when they are partial, contradict each
// other, or name two worlds with nothing to tell which launcher started
// this process.
Launch detect_launch(const LaunchLookup& lookup, const Lineage& lineage = {});

// Where one `fsdp run` (one per node or pod, starting that node's ranks)
// sits when the cluster started it: inside an srun step with one task per
// node (SLURM_NODEID, SLURM_NNODES, the first host of SLURM_JOB_NODELIST, a
// port from SLURM_JOB_ID), or in a Kubeflow PyTorchJob's pod (PET_NNODES,
// PET_NODE_RANK, PET_NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT).
struct NodeLaunch {
  // "slurm" or "kubeflow"; "" when neither: the flags (or their defaults) say.
  std::string launcher;
  // The variables it was read from, "NAME=value" each.
  std::vector<std::string> variables;
  // The nodes of the job, and this one's index.
  int nnodes = 1, node_rank = 0;
  // Ranks per node the cluster asked for (PET_NPROC_PER_NODE); 0: not said.
  int nproc_per_node = 0;
  // Node 0's host and the store's port.
  std::string master_addr;
  // The store's port; 0: not said.
  int master_port = 0;

  // "slurm (SLURM_NODEID=1 SLURM_NNODES=2 ...): node 1 of 2, store at node01:23456".
  std::string describe() const;
};

// The node's place from `lookup`'s variables (Slurm's inside a step, then
// Kubeflow's). Throws fsdp::Error naming them when they are partial, or when
// the step runs more than one task per node.
NodeLaunch detect_node_launch(const LaunchLookup& lookup);

// `lookup` without the cluster launchers' variables (Slurm's, MPI's,
// Kubeflow's): what `fsdp run`, which places its node with
// detect_node_launch, parses its own settings from.
LaunchLookup without_cluster_variables(const LaunchLookup& lookup);

// Slurm's compressed host list: "node[01-04,07],gpu5" -> node01, node02,
// node03, node04, node07, gpu5 (zero padding kept). Throws fsdp::Error
// naming `list` when it is malformed.
std::vector<std::string> expand_nodelist(const std::string& list);
// Slurm's tasks per node: "4(x2),3" -> 4, 4, 3.
std::vector<int> expand_tasks_per_node(const std::string& spec);
// A port in [20000, 40000) derived from a job's id (the same on every node).
int derived_port(const std::string& job_id);

}  // namespace fsdp::config
