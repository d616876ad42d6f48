// Which launcher started a process (common/cluster_env.h), from exactly the
// variables each launcher sets.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/cluster_env.h"
#include "fsdp/errors.h"

using namespace fsdp::config;

namespace {
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
}  // namespace

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
