// Which launcher started a process (config/cluster_env.h), from exactly the
// variables each launcher sets.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "config/cluster_env.h"
#include "fsdp/config.h"
#include "fsdp/errors.h"
#include "test_util.h"

namespace FSDP_TEST_ID {
using namespace fsdp::config;
using Env = std::map<std::string, std::string>;
Launch run(const Env& env) {
  return detect_launch([&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}
std::string error_of(const Env& env) {
  try {
    run(env);
  } catch (const fsdp::Error& e) {
    return e.what();
  }
  return "(no error)";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ClusterEnv, SlurmsCompressedListsExpand) {
  EXPECT_EQ(expand_nodelist("node[01-04,07],gpu5,x[8-10]y"),
            (std::vector<std::string>{"node01", "node02", "node03", "node04", "node07", "gpu5", "x8y", "x9y", "x10y"}));
  EXPECT_EQ(expand_tasks_per_node("4(x2),3"), (std::vector<int>{4, 4, 3}));
  for (const char* bad : {"node[01-", "a,,b", "n[3-1]", "n[a]", "x,"}) EXPECT_THROW(expand_nodelist(bad), fsdp::Error) << bad;
  for (const char* bad : {"", "4(x", "0", "4,", "a"}) EXPECT_THROW(expand_tasks_per_node(bad), fsdp::Error) << bad;
  EXPECT_EQ(derived_port("123456"), 23456);
  EXPECT_EQ(derived_port("prterun-h-1234@1"), derived_port("prterun-h-1234@1"));
}

TEST(ClusterEnv, EachLaunchersVariablesPlaceTheRank) {
  const Env slurm = {{"SLURM_PROCID", "5"},        {"SLURM_NTASKS", "11"},
                     {"SLURM_LOCALID", "1"},       {"SLURM_NODEID", "1"},
                     {"SLURM_NNODES", "3"},        {"SLURM_TASKS_PER_NODE", "4(x2),3"},
                     {"SLURM_JOB_NODELIST", "node[01-03]"}, {"SLURM_JOB_ID", "123456"},
                     {"SLURM_STEP_ID", "0"}};
  auto s = run(slurm);
  EXPECT_EQ(s.launcher, "slurm");
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.world_size, 11);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.local_world_size, 4);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.nnodes, 3);
  EXPECT_EQ(s.master_addr, "node01");
  EXPECT_EQ(s.master_port, 23456);
  EXPECT_TRUE(has(s.describe(), "launcher: slurm (")) << s.describe();
  EXPECT_TRUE(has(s.describe(), "SLURM_JOB_NODELIST=node[01-03]")) << s.describe();
  // A batch script's own shell (no step) is one process.
  EXPECT_EQ(run({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}).launcher, "");

  auto o = run({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"PMIX_NAMESPACE", "prterun-h-1234@1"}});
  EXPECT_EQ(o.launcher, "openmpi");
  EXPECT_EQ(o.rank, 2);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, derived_port("prterun-h-1234@1"));

  auto p = run({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  EXPECT_EQ(p.launcher, "pmi");
  EXPECT_EQ(p.rank, 1);

  auto k = run({{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "1"}, {"RANK", "1"},
                {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"}});
  EXPECT_EQ(k.launcher, "kubeflow");
  EXPECT_EQ(k.rank, 1);
  EXPECT_EQ(k.master_addr, "job-master-0");
  // `fsdp run` in a pod sets torchrun's variables (LOCAL_RANK among them): they win.
  auto t = run({{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "4"}, {"RANK", "5"},
                {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(t.launcher, "torchrun");
  EXPECT_EQ(t.rank, 5);
  EXPECT_EQ(t.node_rank, 1);
  EXPECT_EQ(run({}).launcher, "");
}

TEST(ClusterEnv, PartialOrContradictoryVariablesAreOneErrorNamingThem) {
  EXPECT_TRUE(has(error_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}}),
                  "rank 5 is not below the world size 4 (SLURM_NTASKS=4, SLURM_PROCID=5)"));
  EXPECT_TRUE(has(error_of({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"}}), "SLURM_PROCID set but SLURM_NTASKS not"));
  EXPECT_TRUE(has(error_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"},
                            {"SLURM_TASKS_PER_NODE", "3(x2)"}, {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_STEP_ID", "0"}}),
                  "SLURM_TASKS_PER_NODE adds up to 6 tasks, SLURM_NTASKS is 4"));
  EXPECT_TRUE(has(error_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
                  "names no host for rank 0: export MASTER_ADDR"));
  EXPECT_TRUE(has(error_of({{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "4"}, {"RANK", "1"},
                            {"WORLD_SIZE", "2"}}),
                  "start the program with `fsdp run` in each pod"));
  EXPECT_TRUE(has(error_of({{"RANK", "1"}}), "RANK set but WORLD_SIZE not"));
  EXPECT_TRUE(has(error_of({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}}),
                  "SLURM_PROCID='x' is not an integer"));
}

// ---- Exactly what each launcher sets, rank by rank ----

// What `srun -N 2 -n 4 ./train` (block distribution) gives task `r` of job
// 4242 on node01 and node02: Slurm's own variables, nothing else.
Env srun_task(int r) {
  return {{"SLURM_JOB_ID", "4242"},          {"SLURM_JOBID", "4242"},
          {"SLURM_JOB_NODELIST", "node[01-02]"}, {"SLURM_NODELIST", "node[01-02]"},
          {"SLURM_JOB_NUM_NODES", "2"},      {"SLURM_NNODES", "2"},
          {"SLURM_NTASKS", "4"},             {"SLURM_NPROCS", "4"},
          {"SLURM_STEP_ID", "0"},            {"SLURM_STEPID", "0"},
          {"SLURM_STEP_NODELIST", "node[01-02]"}, {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_TASKS", "4"},     {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_PROCID", std::to_string(r)},
          {"SLURM_LOCALID", std::to_string(r % 2)}, {"SLURM_NODEID", std::to_string(r / 2)},
          {"SLURMD_NODENAME", r < 2 ? "node01" : "node02"}, {"SLURM_CPUS_ON_NODE", "8"},
          {"SLURM_GTIDS", r < 2 ? "0,1" : "2,3"}};
}

// What Open MPI 4's `mpirun -np 4 ./train` gives rank `r` on one host.
Env mpirun_rank(int r) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_SIZE", "4"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
          {"OMPI_COMM_WORLD_NODE_RANK", std::to_string(r)}, {"OMPI_UNIVERSE_SIZE", "4"},
          {"OMPI_APP_CTX_NUM_PROCS", "4"}, {"OMPI_MCA_ess_base_jobid", "2786459649"},
          {"OMPI_MCA_ess_base_vpid", std::to_string(r)}, {"PMIX_RANK", std::to_string(r)},
          {"PMIX_NAMESPACE", "2786459649"}, {"OMPI_MCA_orte_launch", "1"}};
}

// What MPICH's (Hydra's) `mpiexec -n 4 ./train` gives rank `r` on one host.
Env hydra_rank(int r) {
  return {{"PMI_RANK", std::to_string(r)}, {"PMI_SIZE", "4"}, {"PMI_FD", "6"},
          {"MPI_LOCALRANKID", std::to_string(r)}, {"MPI_LOCALNRANKS", "4"}};
}

// What Kubeflow's training operator gives the container of pod `k` of a
// PyTorchJob with 2 replicas (1 Master, 1 Worker) and nprocPerNode: 2.
Env pytorchjob_pod(int k, const std::string& addr = "job-master-0", const std::string& port = "23456") {
  return {{"PET_NNODES", "2"},        {"PET_NODE_RANK", std::to_string(k)}, {"PET_NPROC_PER_NODE", "2"},
          {"PET_MASTER_ADDR", addr},  {"PET_MASTER_PORT", port},            {"MASTER_ADDR", addr},
          {"MASTER_PORT", port},      {"RANK", std::to_string(k)},          {"WORLD_SIZE", "2"},
          {"PYTHONUNBUFFERED", "1"}};
}

fsdp::config::EnvConfig parse(const Env& env) {
  return fsdp::config::parse_env([&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

fsdp::config::NodeLaunch node(const Env& env) {
  return detect_node_launch([&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// Ranks 0-3 of `rank_env` (an MPI launcher's, on one host): each placed by
// `launcher`, the store on this host at `port`.
void expect_four_ranks_on_one_host(Env (*rank_env)(int), const std::string& launcher, int port) {
  for (int r = 0; r < 4; ++r) {
    const auto c = parse(rank_env(r));
    EXPECT_EQ(c.launcher, launcher);
    EXPECT_EQ(c.rank, r);
    EXPECT_EQ(c.world_size, 4);
    EXPECT_EQ(c.local_rank, r);
    EXPECT_EQ(c.local_world_size, 4);
    EXPECT_EQ(c.master_addr, "127.0.0.1");
    EXPECT_EQ(c.master_port, port);
  }
}

TEST(ClusterEnv, SrunFourTasksOnTwoNodes) {
  for (int r = 0; r < 4; ++r) {
    const auto c = parse(srun_task(r));
    EXPECT_EQ(c.launcher, "slurm");
    EXPECT_TRUE(c.world_from_env);
    EXPECT_EQ(c.rank, r);
    EXPECT_EQ(c.world_size, 4);
    EXPECT_EQ(c.local_rank, r % 2);
    EXPECT_EQ(c.local_world_size, 2);
    EXPECT_EQ(c.master_addr, "node01");
    EXPECT_EQ(c.master_port, 24242);
    EXPECT_TRUE(has(c.launch, "launcher: slurm (SLURM_NTASKS=4 SLURM_PROCID=" + std::to_string(r))) << c.launch;
  }
  EXPECT_EQ(parse(srun_task(3)).launch,
            "launcher: slurm (SLURM_NTASKS=4 SLURM_PROCID=3 SLURM_LOCALID=1 SLURM_NODEID=1 SLURM_NNODES=2 "
            "SLURM_TASKS_PER_NODE=2(x2) SLURM_STEP_NODELIST=node[01-02] SLURM_JOB_ID=4242): rank 3 of 4, local rank 1 "
            "of 2, node 1 of 2, store at node01:24242");
  // MASTER_ADDR and MASTER_PORT, when exported, win over the derived ones.
  Env pinned = srun_task(2);
  pinned["MASTER_ADDR"] = "10.0.0.7";
  pinned["MASTER_PORT"] = "31000";
  EXPECT_EQ(parse(pinned).master_addr, "10.0.0.7");
  EXPECT_EQ(parse(pinned).master_port, 31000);
  // The batch script's own shell (no step): not a rank, a world of one.
  Env batch = srun_task(0);
  batch.erase("SLURM_STEP_ID");
  batch.erase("SLURM_STEPID");
  EXPECT_EQ(parse(batch).launcher, "");
  EXPECT_EQ(parse(batch).world_size, 1);
}

TEST(ClusterEnv, MpirunFourRanks) {
  expect_four_ranks_on_one_host(mpirun_rank, "openmpi", derived_port("2786459649"));
  EXPECT_TRUE(has(parse(mpirun_rank(2)).launch, "launcher: openmpi (OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=2 "))
      << parse(mpirun_rank(2)).launch;
  // Across hosts Open MPI names no host for rank 0: one error saying what to export.
  Env two_hosts = mpirun_rank(3);
  two_hosts["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  two_hosts["OMPI_COMM_WORLD_LOCAL_RANK"] = "1";
  try {
    parse(two_hosts);
    ADD_FAILURE() << "two hosts without MASTER_ADDR were accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(has(e.what(), "Open MPI (mpirun) started 4 ranks on 2 hosts")) << e.what();
    EXPECT_TRUE(has(e.what(), "export MASTER_ADDR=<rank 0's host>")) << e.what();
  }
  two_hosts["MASTER_ADDR"] = "host-a";
  EXPECT_EQ(parse(two_hosts).master_addr, "host-a");
  EXPECT_EQ(parse(two_hosts).local_world_size, 2);
}

TEST(ClusterEnv, PmiFourRanks) {
  expect_four_ranks_on_one_host(hydra_rank, "pmi", 29500);
  EXPECT_TRUE(has(error_of({{"PMI_SIZE", "4"}}), "PMI_SIZE set but PMI_RANK not")) << error_of({{"PMI_SIZE", "4"}});
}

TEST(ClusterEnv, PyTorchJobTwoPodsTwoProcesses) {
  // Each pod runs `fsdp run -n 2`, which reads the pod's place...
  for (int k = 0; k < 2; ++k) {
    const auto n = node(pytorchjob_pod(k));
    EXPECT_EQ(n.launcher, "kubeflow");
    EXPECT_EQ(n.nnodes, 2);
    EXPECT_EQ(n.node_rank, k);
    EXPECT_EQ(n.nproc_per_node, 2);
    EXPECT_EQ(n.master_addr, "job-master-0");
    EXPECT_EQ(n.master_port, 23456);
    EXPECT_TRUE(has(n.describe(), "kubeflow (PET_NNODES=2 PET_NODE_RANK=" + std::to_string(k))) << n.describe();
    // ...and gives each of its ranks torchrun's variables, which win over the pod's.
    for (int i = 0; i < 2; ++i) {
      Env rank = pytorchjob_pod(k);
      rank["RANK"] = std::to_string(2 * k + i);
      rank["WORLD_SIZE"] = "4";
      rank["LOCAL_RANK"] = std::to_string(i);
      rank["LOCAL_WORLD_SIZE"] = "2";
      rank["GROUP_RANK"] = std::to_string(k);
      const auto c = parse(rank);
      EXPECT_EQ(c.launcher, "torchrun");
      EXPECT_EQ(c.rank, 2 * k + i);
      EXPECT_EQ(c.world_size, 4);
      EXPECT_EQ(c.master_addr, "job-master-0");
    }
  }
  // The program started in the pod directly, with 2 processes asked for: one error saying to use fsdp run.
  try {
    parse(pytorchjob_pod(1));
    ADD_FAILURE() << "a pod's RANK was taken for a process's";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(has(e.what(), "start the program with `fsdp run` in each pod")) << e.what();
  }
  // One process per pod: the pod is the rank.
  Env one = pytorchjob_pod(1);
  one["PET_NPROC_PER_NODE"] = "1";
  EXPECT_EQ(parse(one).launcher, "kubeflow");
  EXPECT_EQ(parse(one).rank, 1);
  EXPECT_EQ(parse(one).world_size, 2);
}

TEST(ClusterEnv, FsdpRunInsideAnSrunStepPlacesItsNode) {
  // `srun -N 2 --ntasks-per-node=1 fsdp run -n 4 -- ./train`: task k is node k.
  for (int k = 0; k < 2; ++k) {
    Env e = srun_task(k * 2);
    e["SLURM_NTASKS"] = "2";
    e["SLURM_PROCID"] = std::to_string(k);
    e["SLURM_LOCALID"] = "0";
    e["SLURM_NODEID"] = std::to_string(k);
    e["SLURM_TASKS_PER_NODE"] = "1(x2)";
    const auto n = node(e);
    EXPECT_EQ(n.launcher, "slurm");
    EXPECT_EQ(n.nnodes, 2);
    EXPECT_EQ(n.node_rank, k);
    EXPECT_EQ(n.master_addr, "node01");
    EXPECT_EQ(n.master_port, 24242);
  }
  // Four tasks on two nodes would start four launchers: one error saying how to start one per node.
  try {
    node(srun_task(1));
    ADD_FAILURE() << "fsdp run accepted an srun step with 2 tasks per node";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(has(e.what(), "SLURM_NTASKS=4 tasks on SLURM_NNODES=2 nodes")) << e.what();
    EXPECT_TRUE(has(e.what(), "srun --ntasks=2 --ntasks-per-node=1 fsdp run")) << e.what();
    EXPECT_TRUE(has(e.what(), "in a batch script --ntasks=$SLURM_NNODES")) << e.what();
  }
  EXPECT_EQ(node({}).launcher, "");
  EXPECT_EQ(node(mpirun_rank(0)).launcher, "");
}

TEST(ClusterEnv, TorchrunsVariablesKeepPriority) {
  // torchrun's (or fsdp run's) variables beside a cluster's: torchrun's place the rank.
  Env e = srun_task(3);
  for (auto& [k, v] : mpirun_rank(1)) e[k] = v;
  e["RANK"] = "1";
  e["WORLD_SIZE"] = "2";
  const auto c = parse(e);
  EXPECT_EQ(c.launcher, "torchrun");
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.world_size, 2);
  EXPECT_EQ(c.master_addr, "127.0.0.1");
  EXPECT_EQ(c.master_port, 29500);
  // The first log line says why the others were not read.
  EXPECT_TRUE(has(c.launch, "; slurm's (SLURM_PROCID=3 SLURM_NTASKS=4) variables ignored: torchrun's are set for each "
                            "rank by the launcher that started it (torchrun, fsdp run), inside the others; openmpi's "
                            "(OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4) variables ignored: torchrun's"))
      << c.launch;
  // Empty means unset, for the launchers' variables too.
  EXPECT_EQ(parse({{"OMPI_COMM_WORLD_RANK", ""}, {"OMPI_COMM_WORLD_SIZE", ""}}).launcher, "");
  // No launcher: a world of one, and no launcher line.
  EXPECT_EQ(parse({}).launcher, "");
  EXPECT_EQ(parse({}).launch, "");
}

// ---- Launchers nested as clusters nest them: the innermost wins ----

Launch run_in(const Env& env, const Lineage& lineage) {
  return detect_launch(
      [&](const char* n) -> const char* {
        auto it = env.find(n);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      lineage);
}

std::string error_in(const Env& env, const Lineage& lineage) {
  try {
    run_in(env, lineage);
  } catch (const fsdp::Error& e) {
    return e.what();
  }
  return "(no error)";
}

Ancestor ancestor(int pid, const std::string& command, Env env) {
  Ancestor a;
  a.pid = pid;
  a.command = command;
  a.readable = true;
  a.env = std::move(env);
  return a;
}

Lineage lineage_of(int pid, std::vector<Ancestor> above) {
  Lineage l;
  l.pid = pid;
  l.ancestors = [above] { return above; };
  return l;
}

// What the task of `srun -n 1` (job 77, step 0) has: slurmstepd forked
// process 5003 with it.
Env one_task_step() {
  return {{"SLURM_JOB_ID", "77"},   {"SLURM_JOB_NODELIST", "node01"}, {"SLURM_NNODES", "1"},
          {"SLURM_NTASKS", "1"},    {"SLURM_STEP_ID", "0"},           {"SLURM_STEPID", "0"},
          {"SLURM_PROCID", "0"},    {"SLURM_LOCALID", "0"},           {"SLURM_NODEID", "0"},
          {"SLURM_TASKS_PER_NODE", "1"}, {"SLURM_TASK_PID", "5003"}};
}

// Rank `r` of `srun -n 1 mpirun -np 2 ./train`: mpirun is the step's task
// (pid 5003), the ranks its children, with the step's variables inherited.
Env nested_rank(int r) {
  Env e = one_task_step();
  for (auto& [k, v] : mpirun_rank(r)) e[k] = v;
  e["OMPI_COMM_WORLD_SIZE"] = e["OMPI_COMM_WORLD_LOCAL_SIZE"] = e["OMPI_UNIVERSE_SIZE"] = "2";
  return e;
}

std::vector<Ancestor> above_nested_rank() {
  return {ancestor(5003, "mpirun", one_task_step()), ancestor(5001, "slurmstepd", {{"PATH", "/usr/bin"}})};
}

TEST(ClusterEnv, MpirunInsideAnSrunStepIsOneWorldOfMpirunsRanks) {
  for (int r = 0; r < 2; ++r) {
    const Launch l = run_in(nested_rank(r), lineage_of(5010 + r, above_nested_rank()));
    EXPECT_EQ(l.launcher, "openmpi");
    EXPECT_EQ(l.rank, r);
    EXPECT_EQ(l.world_size, 2);
    EXPECT_EQ(l.local_world_size, 2);
    EXPECT_EQ(l.master_addr, "127.0.0.1");
    EXPECT_EQ(l.master_port, derived_port("2786459649"));
    // The first log line says why the step's variables were not read.
    EXPECT_TRUE(has(l.describe(), ": rank " + std::to_string(r) + " of 2, local rank " + std::to_string(r) +
                                      " of 2, node 0 of 1, store at 127.0.0.1:" +
                                      std::to_string(derived_port("2786459649")) +
                                      "; slurm's (SLURM_PROCID=0 SLURM_NTASKS=1) variables ignored: an outer "
                                      "launcher's, already set for process 5003 (mpirun) above this one, which has "
                                      "no openmpi's"))
        << l.describe();
  }
  // mpirun started by a script of the step (`srun -n 1 bash -c 'mpirun ...; ...'`): the script has
  // the step's variables and no MPI's, as mpirun does.
  auto above = above_nested_rank();
  above.insert(above.begin(), ancestor(5007, "bash", one_task_step()));
  EXPECT_EQ(run_in(nested_rank(1), lineage_of(5011, above)).launcher, "openmpi");
}

// Open MPI across nodes inside an allocation starts its daemons with srun:
// every rank of node 1 has the daemon's step (task 1 of 2) beside its own.
TEST(ClusterEnv, RanksOfAnMpiDaemonStartedBySrunAreMpis) {
  Env step = srun_task(2);
  step["SLURM_NTASKS"] = "2";
  step["SLURM_PROCID"] = "1";
  step["SLURM_TASKS_PER_NODE"] = "1(x2)";
  step["SLURM_TASK_PID"] = "900";
  Env rank = step;
  for (auto& [k, v] : mpirun_rank(3)) rank[k] = v;
  rank["OMPI_COMM_WORLD_LOCAL_RANK"] = "1";
  rank["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  rank["MASTER_ADDR"] = "node01";
  const Launch l = run_in(rank, lineage_of(950, {ancestor(900, "orted", step)}));
  EXPECT_EQ(l.launcher, "openmpi");
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.node_rank, 1);
  EXPECT_EQ(l.master_addr, "node01");
  // MPICH's Hydra alike: its proxy is the step's task.
  Env hydra = step;
  for (auto& [k, v] : hydra_rank(3)) hydra[k] = v;
  hydra["MPI_LOCALNRANKS"] = "2";
  hydra["MPI_LOCALRANKID"] = "1";
  hydra["MASTER_ADDR"] = "node01";
  EXPECT_EQ(run_in(hydra, lineage_of(951, {ancestor(900, "hydra_pmi_proxy", step)})).launcher, "pmi");
}

TEST(ClusterEnv, SrunsOwnTaskIsSlurmsBesideMpiVariables) {
  // `srun --mpi=pmi2 -n 2`: slurmstepd sets PMI's variables for the task it forks, the same world.
  Env pmi2 = srun_task(1);
  pmi2["PMI_RANK"] = "1";
  pmi2["PMI_SIZE"] = "4";
  pmi2["PMI_FD"] = "11";
  pmi2["SLURM_TASK_PID"] = "4321";
  const Launch l = run_in(pmi2, lineage_of(4321, {ancestor(4300, "slurmstepd", {{"PATH", "/usr/bin"}})}));
  EXPECT_EQ(l.launcher, "slurm");
  EXPECT_EQ(l.rank, 1);
  EXPECT_EQ(l.master_addr, "node01");
  EXPECT_TRUE(has(l.describe(), "; pmi's (PMI_RANK=1 PMI_SIZE=4) variables describe the same world")) << l.describe();
  // The same, with nothing known of the lineage (a map given to parse_env): one world, Slurm's place.
  EXPECT_EQ(parse(pmi2).launcher, "slurm");
  EXPECT_EQ(parse(pmi2).master_addr, "node01");
  // A task forked by srun whose environment had an outer mpirun's rank: srun's world.
  Env stale = srun_task(2);
  for (auto& [k, v] : mpirun_rank(0)) stale[k] = v;
  stale["SLURM_TASK_PID"] = "4322";
  const Launch s = run_in(stale, lineage_of(4322, {}));
  EXPECT_EQ(s.launcher, "slurm");
  EXPECT_EQ(s.rank, 2);
  EXPECT_TRUE(has(s.describe(), "; openmpi's (OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4) variables ignored: srun "
                                "started this process itself (SLURM_TASK_PID=4322), so they came with srun's "
                                "environment, from outside its step"))
      << s.describe();
}

TEST(ClusterEnv, TwoWorldsWithNothingToTellThemApartAreOneError) {
  // Nothing known of the lineage.
  const std::string none = error_in(nested_rank(1), {});
  EXPECT_TRUE(has(none, "two launchers' variables describe different worlds, openmpi's (OMPI_COMM_WORLD_RANK=1 "
                        "OMPI_COMM_WORLD_SIZE=2) and slurm's (SLURM_PROCID=0 SLURM_NTASKS=1), and which one started "
                        "this process cannot be told (nothing is known of the processes above this one): start it "
                        "with one launcher, or unset the outer one's variables where the inner one starts (e.g. when "
                        "srun is the outer one: env -u SLURM_PROCID -u SLURM_NTASKS mpirun ...)"))
      << none;
  // The parent cannot be read (another user's).
  Ancestor hidden;
  hidden.pid = 5003;
  hidden.command = "mpirun";
  EXPECT_TRUE(has(error_in(nested_rank(1), lineage_of(5011, {hidden})),
                  "(process 5003 (mpirun) above this one cannot be read)"))
      << error_in(nested_rank(1), lineage_of(5011, {hidden}));
  // A script that exported both sets at once.
  const std::string once = error_in(nested_rank(1), lineage_of(5011, {ancestor(5003, "sh", {{"HOME", "/root"}})}));
  EXPECT_TRUE(has(once, "(process 5003 (sh) above this one has none of slurm's or openmpi's: one launcher set them "
                        "at once)"))
      << once;
  // Every process above has them all.
  EXPECT_TRUE(has(error_in(nested_rank(1), lineage_of(5011, {ancestor(1, "init", nested_rank(1))})),
                  "(every process above this one has them all)"));
  // Slurm's task pid, when set, is a pid.
  Env bad = nested_rank(1);
  bad["SLURM_TASK_PID"] = "x";
  EXPECT_TRUE(has(error_of(bad), "SLURM_TASK_PID='x' is not an integer in range")) << error_of(bad);
}

// ---- Ranks started with a cluster launcher's variables only ----

using fsdp::testing::bin_path;

// One process's exit status and what it wrote to stdout and to stderr.
struct Ran {
  int exit_code = -1;
  std::string out, err;
};

// Runs each of `envs` as one process of `argv` at once, with the cluster
// launchers' and torchrun's variables of this process removed first, and
// each process's stdout and stderr kept apart (files in a temp dir).
std::vector<Ran> run_processes(const std::vector<std::string>& argv, const std::vector<Env>& envs, double timeout_s) {
  const std::string dir = fsdp::testing::temp_dir("cluster-env");
  std::vector<pid_t> pids;
  for (size_t i = 0; i < envs.size(); ++i) {
    const std::string out = dir + "/" + std::to_string(i) + ".out", err = dir + "/" + std::to_string(i) + ".err";
    const pid_t pid = fork();
    if (pid == 0) {
      if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
      setpgid(0, 0);
      for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                            "MASTER_PORT", "FSDP_STORE_HOSTED", "FSDP_RANK_TEST"})
        unsetenv(k);
      std::vector<std::string> drop;
      for (char** e = environ; *e; ++e)
        for (const char* prefix : {"SLURM_", "OMPI_", "PMI_", "PMIX_", "PET_", "MPI_LOCAL"})
          if (std::strncmp(*e, prefix, std::strlen(prefix)) == 0)
            drop.push_back(std::string(*e, std::strcspn(*e, "=")));
      for (auto& k : drop) unsetenv(k.c_str());
      for (auto& [k, v] : envs[i]) setenv(k.c_str(), v.c_str(), 1);
      fsdp::testing::exec_or_exit(argv);
    }
    pids.push_back(pid);
  }
  std::vector<Ran> ran(envs.size());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    while (waitpid(pids[i], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(-pids[i], SIGKILL);
        waitpid(pids[i], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ran[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    ran[i].out = fsdp::testing::slurp(dir + "/" + std::to_string(i) + ".out");
    ran[i].err = fsdp::testing::slurp(dir + "/" + std::to_string(i) + ".err");
  }
  std::filesystem::remove_all(dir);
  return ran;
}

// A job id whose derived port is free on this machine now.
std::string job_id_with_free_port() {
  for (int tries = 0; tries < 100; ++tries) {
    const std::string id = std::to_string(::getpid() * 100 + tries);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(derived_port(id)));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    if (free) return id;
  }
  return "1";
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// Three ranks of the collectives' worker with only what Open MPI's mpirun
// sets (no RANK, WORLD_SIZE or MASTER_*): they form one world, every
// all_reduce is exact, and each rank's stderr starts with the launcher.
TEST(ClusterLaunch, OpenMpiVariablesAloneFormAWorld) {
  const std::string ns = job_id_with_free_port();
  std::vector<Env> envs;
  for (int r = 0; r < 3; ++r)
    envs.push_back({{"OMPI_COMM_WORLD_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_SIZE", "3"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                    {"OMPI_COMM_WORLD_NODE_RANK", std::to_string(r)}, {"OMPI_UNIVERSE_SIZE", "3"},
                    {"OMPI_MCA_ess_base_jobid", ns}, {"PMIX_RANK", std::to_string(r)}, {"PMIX_NAMESPACE", ns}});
  const auto ran = run_processes({bin_path("fsdp_test_worker"), "comm_collectives"}, envs, 180);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + "\nstdout:\n" + ran[r].out + "\nstderr:\n" + ran[r].err);
    EXPECT_EQ(ran[r].exit_code, 0);
    EXPECT_TRUE(has(ran[r].out, "comm_collectives passed"));
    EXPECT_TRUE(has(ran[r].out, " 0 failures"));
    EXPECT_EQ(first_line(ran[r].err),
              "fsdp: launcher: openmpi (OMPI_COMM_WORLD_SIZE=3 OMPI_COMM_WORLD_RANK=" + std::to_string(r) +
                  " OMPI_COMM_WORLD_LOCAL_SIZE=3 OMPI_COMM_WORLD_LOCAL_RANK=" + std::to_string(r) +
                  " PMIX_NAMESPACE=" + ns + "): rank " + std::to_string(r) + " of 3, local rank " +
                  std::to_string(r) + " of 3, node 0 of 1, store at 127.0.0.1:" + std::to_string(derived_port(ns)));
  }
}

// Two pods of a PyTorchJob, each running `fsdp run -n 2` with no flags but
// -n: the pods' variables place each launcher, and the four ranks form one
// world (the pods count as two hosts).
TEST(ClusterLaunch, PyTorchJobPodsRunFsdpRunWithoutFlags) {
  const std::string port = std::to_string(fsdp::testing::free_port());
  std::vector<Env> envs;
  for (int k = 0; k < 2; ++k) {
    Env e = pytorchjob_pod(k, "127.0.0.1", port);
    e["FSDP_HOST_ID"] = "pod-" + std::to_string(k);
    e["FSDP_JOB_TOKEN"] = "pytorchjob_test_token_0123456789";
    envs.push_back(e);
  }
  const std::vector<std::string> hello = {bin_path("fsdp_test_worker"), "comm_hello"};
  auto fsdp_run = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv = {bin_path("fsdp"), "run"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back("--");
    argv.insert(argv.end(), hello.begin(), hello.end());
    return argv;
  };
  const auto ran = run_processes(fsdp_run({"-n", "2"}), envs, 180);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("pod " + std::to_string(k) + "\nstdout:\n" + ran[k].out + "\nstderr:\n" + ran[k].err);
    EXPECT_EQ(ran[k].exit_code, 0);
    EXPECT_TRUE(has(ran[k].err, "fsdp run: launcher: kubeflow (PET_NNODES=2 PET_NODE_RANK=" + std::to_string(k)));
    for (int i = 0; i < 2; ++i) {
      const std::string tag = "[rank " + std::to_string(2 * k + i) + "] ";
      EXPECT_TRUE(has(ran[k].out + ran[k].err, tag + "hello from ")) << tag;
      EXPECT_TRUE(has(ran[k].out + ran[k].err, tag + "fsdp: launcher: torchrun (")) << tag;
    }
  }
  // A flag that contradicts the pod's variables is one error, before any rank starts.
  const auto bad = run_processes(fsdp_run({"-n", "2", "--nnodes", "3"}), {pytorchjob_pod(0, "127.0.0.1", port)}, 60);
  EXPECT_EQ(bad[0].exit_code, 2) << bad[0].err;
  EXPECT_TRUE(has(bad[0].err, "fsdp run: error: --nnodes 3 contradicts PET_NNODES=2")) << bad[0].err;
  const auto bad_n = run_processes(fsdp_run({"-n", "3"}), {pytorchjob_pod(0, "127.0.0.1", port)}, 60);
  EXPECT_EQ(bad_n[0].exit_code, 2) << bad_n[0].err;
  EXPECT_TRUE(has(bad_n[0].err, "fsdp run: error: -n 3 contradicts PET_NPROC_PER_NODE=2")) << bad_n[0].err;
}

// Two srun tasks, one per node, each running `fsdp run -n 2` with no flags
// but -n: Slurm's variables place each launcher (the store on the first
// host of the list, its port from the job id).
TEST(ClusterLaunch, SrunStepRunsFsdpRunWithoutFlags) {
  const std::string id = job_id_with_free_port();
  std::vector<Env> envs;
  for (int k = 0; k < 2; ++k)
    envs.push_back({{"SLURM_JOB_ID", id}, {"SLURM_JOB_NODELIST", "localhost,127.0.0.2"}, {"SLURM_NNODES", "2"},
                    {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", std::to_string(k)},
                    {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", std::to_string(k)}, {"SLURM_TASKS_PER_NODE", "1(x2)"},
                    {"FSDP_HOST_ID", "node-" + std::to_string(k)},
                    {"FSDP_JOB_TOKEN", "srun_step_test_token_0123456789"}});
  const auto ran = run_processes({bin_path("fsdp"), "run", "-n", "2", "--", bin_path("fsdp_test_worker"), "comm_hello"},
                                 envs, 180);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("node " + std::to_string(k) + "\nstdout:\n" + ran[k].out + "\nstderr:\n" + ran[k].err);
    EXPECT_EQ(ran[k].exit_code, 0);
    EXPECT_TRUE(has(ran[k].err, "fsdp run: launcher: slurm (SLURM_NNODES=2 SLURM_NODEID=" + std::to_string(k)));
    EXPECT_TRUE(has(ran[k].err, "store at localhost:" + std::to_string(derived_port(id))));
    for (int i = 0; i < 2; ++i)
      EXPECT_TRUE(has(ran[k].out + ran[k].err, "[rank " + std::to_string(2 * k + i) + "] hello from "));
  }
}

// The real `mpirun -np 3` (Open MPI), when installed: three ranks of the
// collectives' worker, started as a user would, form one world.
TEST(ClusterLaunch, RealMpirunStartsThreeRanks) {
  std::string mpirun;
  for (const char* d : {"/usr/bin/mpirun", "/usr/local/bin/mpirun"})
    if (access(d, X_OK) == 0) mpirun = d;
  if (mpirun.empty())
    GTEST_SKIP() << "mpirun (Open MPI; Debian's openmpi-bin, which `make deps` installs) is not installed";
  // As root Open MPI wants --allow-run-as-root; --oversubscribe: more ranks than cores.
  const auto ran = run_processes({mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3",
                                  bin_path("fsdp_test_worker"), "comm_collectives"},
                                 {Env{}}, 240);
  SCOPED_TRACE("mpirun's stdout:\n" + ran[0].out + "\nstderr:\n" + ran[0].err);
  EXPECT_EQ(ran[0].exit_code, 0);
  EXPECT_EQ(fsdp::testing::lines_with(ran[0].out, "comm_collectives passed").size(), 3u);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(fsdp::testing::lines_with(ran[0].err, "fsdp: launcher: openmpi (OMPI_COMM_WORLD_SIZE=3 "
                                                    "OMPI_COMM_WORLD_RANK=" + std::to_string(r) + " ").size(),
              1u);
}

// The real `mpirun -np 2` started with the variables of an srun step's one
// task, as `srun -n 1 mpirun -np 2` starts it (tests/test_slurm.cpp runs the
// real srun): the ranks have both sets, read their parent's environment,
// and form one world of two.
TEST(ClusterLaunch, RealMpirunInsideAStepsTaskFormsOneWorld) {
  std::string mpirun;
  for (const char* d : {"/usr/bin/mpirun", "/usr/local/bin/mpirun"})
    if (access(d, X_OK) == 0) mpirun = d;
  if (mpirun.empty())
    GTEST_SKIP() << "mpirun (Open MPI; Debian's openmpi-bin, which `make deps` installs) is not installed";
  const auto ran = run_processes({mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                                  bin_path("fsdp_test_worker"), "comm_collectives"},
                                 {one_task_step()}, 240);
  SCOPED_TRACE("mpirun's stdout:\n" + ran[0].out + "\nstderr:\n" + ran[0].err);
  EXPECT_EQ(ran[0].exit_code, 0);
  EXPECT_EQ(fsdp::testing::lines_with(ran[0].out, "comm_collectives passed").size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const auto lines = fsdp::testing::lines_with(
        ran[0].err, "fsdp: launcher: openmpi (OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=" + std::to_string(r) + " ");
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_TRUE(has(lines[0], ": rank " + std::to_string(r) + " of 2, local rank " + std::to_string(r) + " of 2"))
        << lines[0];
    EXPECT_TRUE(has(lines[0], "; slurm's (SLURM_PROCID=0 SLURM_NTASKS=1) variables ignored: an outer launcher's, "
                              "already set for process "))
        << lines[0];
    EXPECT_TRUE(has(lines[0], " (mpirun) above this one, which has no openmpi's")) << lines[0];
  }
}

}  // namespace FSDP_TEST_ID
