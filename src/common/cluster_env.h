// fsdp-cpp: which launcher started this process, and where it sits —
// torchrun's variables, Slurm's, Open MPI's, PMI's, or Kubeflow's
// PyTorchJob's, recognised with no flags. Torch-free.
// defines: config::Launch, config::detect_launch, config::NodeLaunch,
//          config::detect_node_launch, config::without_cluster_variables,
//          config::expand_nodelist, config::expand_tasks_per_node,
//          config::derived_port
//
// In this order (the first whose variables are present wins; a launcher
// started under another, e.g. `fsdp run` inside an `srun` step, sets
// torchrun's variables for its ranks, which come first):
//   torchrun   RANK, WORLD_SIZE [, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//              MASTER_ADDR, MASTER_PORT] (also what `fsdp run` sets)
//   slurm      (inside an srun step: SLURM_STEP_ID set; a batch script's own
//              shell is not a rank) SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//              SLURM_NNODES, SLURM_TASKS_PER_NODE ("4(x2),3"),
//              SLURM_JOB_NODELIST ("node[01-04,07]": the first host is the
//              master), SLURM_JOB_ID (the port: 20000 + id mod 20000)
//   openmpi    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   pmi        PMI_RANK, PMI_SIZE [, MPI_LOCALRANKID, MPI_LOCALNRANKS]
//   kubeflow   PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE (its RANK and
//              WORLD_SIZE count pods, not processes: with more than one
//              process per pod, run `fsdp run` in each pod)
// MASTER_ADDR and MASTER_PORT, when set, override the derived ones. MPI
// names no host for rank 0: across hosts under mpirun, MASTER_ADDR is
// required. Partial or contradictory variables are one fsdp::Error naming
// them.
//
// config::parse_env (fsdp/config.h) places the rank with detect_launch
// where torchrun's RANK and WORLD_SIZE are not set (torchrun's it reads as
// it always did), and make_communicator_from_env prints describe() as each
// rank's first log line; `fsdp run` places its node with detect_node_launch.
#pragma once

#include <functional>
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

  // "launcher: slurm (SLURM_PROCID=3 SLURM_NTASKS=8 ...): rank 3 of 8, local rank 1 of 4, node 0 of 2,
  // store at node01:23456"; "launcher: none (one process)".
  std::string describe() const;
};

// A variable's value, or null when unset.
using LaunchLookup = std::function<const char*(const char* name)>;

// The launcher `lookup`'s variables name, and where this process sits.
// Throws fsdp::Error naming the variables when they are partial or
// contradict each other.
Launch detect_launch(const LaunchLookup& lookup);

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
