// One configuration, parsed once (fsdp/config.h): every variable is in the
// table, the table is docs/CONFIG.md's, nothing else in src/ reads the
// environment, each variable set wrong is one error naming it, and the
// tuning knobs are also options in code.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "comm/world_env.h"
#include "fsdp/comm.h"
#include "fsdp/config.h"
#include "fsdp/errors.h"
#include "test_util.h"

using fsdp::config::EnvConfig;
using fsdp::testing::bin_path;
using fsdp::testing::lines_with;
using fsdp::testing::run_command;
using fsdp::testing::run_ranks;
using fsdp::testing::slurp;
using fsdp::testing::source_path;

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

EnvConfig parse(const std::map<std::string, std::string>& env) {
  return fsdp::config::parse_env([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& env) {
  try {
    parse(env);
  } catch (const fsdp::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

TEST(Config, DefaultsAndValuesAreTyped) {
  const EnvConfig d = parse({});
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.world_size, 1);
  EXPECT_FALSE(d.world_from_env);
  EXPECT_EQ(d.master_addr, "127.0.0.1");
  EXPECT_EQ(d.master_port, 29500);
  EXPECT_FALSE(d.timeout_ms.has_value());
  EXPECT_EQ(d.transport, "auto");
  EXPECT_TRUE(d.tiers);
  EXPECT_EQ(d.compress, "");  // CommOptions::compress decides (off)
  EXPECT_FALSE(d.compress_feedback.has_value());  // CommOptions::error_feedback decides (on)
  EXPECT_TRUE(fsdp::comm::resolve_options({}, d).error_feedback);
  EXPECT_FALSE(d.ring_piece_bytes.has_value());
  EXPECT_FALSE(d.heartbeat_interval_ms.has_value());
  EXPECT_FALSE(d.flight_recorder.has_value());
  EXPECT_TRUE(d.alloc_cache);
  EXPECT_EQ(d.progress, fsdp::config::ProgressMode::AUTO);

  const EnvConfig c = parse({{"RANK", "2"},
                             {"WORLD_SIZE", "4"},
                             {"LOCAL_WORLD_SIZE", "2"},
                             {"MASTER_PORT", "1234"},
                             {"FSDP_TIMEOUT", "2.5"},
                             {"FSDP_DEBUG", "DETAIL"},
                             {"FSDP_TRANSPORT", "Tcp"},
                             {"FSDP_TIERS", "off"},
                             {"FSDP_COMPRESS", "INT4"},
                             {"FSDP_COMPRESS_FEEDBACK", "off"},
                             {"FSDP_HOST_ID", "node-a"},
                             {"FSDP_STORE_HOSTED", "1"},
                             {"FSDP_RING_PIECE_KIB", "64"},
                             {"FSDP_HEARTBEAT_INTERVAL", "0.25"},
                             {"FSDP_FLIGHT_RECORDER", "off"},
                             {"FSDP_FLIGHT_ENTRIES", "64"},
                             {"FSDP_ALLOC_CACHE", "0"},
                             {"FSDP_PROGRESS", "lines"},
                             {"FSDP_PROGRESS_EVERY", "0"}});
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_TRUE(c.world_from_env);
  EXPECT_EQ(c.local_rank, 0);  // RANK mod LOCAL_WORLD_SIZE
  EXPECT_EQ(c.master_port, 1234);
  EXPECT_EQ(c.timeout_ms.value(), 2500);
  EXPECT_TRUE(c.debug_detail && c.debug_info);
  EXPECT_EQ(c.transport, "tcp");
  EXPECT_FALSE(c.tiers);
  EXPECT_EQ(c.compress, "int4");
  EXPECT_EQ(fsdp::comm::resolve_options({}, c).compress, fsdp::Compression::INT4);
  EXPECT_EQ(c.compress_feedback, false);
  EXPECT_FALSE(fsdp::comm::resolve_options({}, c).error_feedback);
  EXPECT_EQ(c.host_id, "node-a");
  EXPECT_TRUE(c.store_hosted);
  EXPECT_EQ(c.ring_piece_bytes.value(), 64 << 10);
  EXPECT_EQ(c.heartbeat_interval_ms.value(), 250);
  EXPECT_EQ(c.flight_recorder.value(), false);
  EXPECT_EQ(c.flight_entries.value(), 64);
  EXPECT_FALSE(c.alloc_cache);
  EXPECT_EQ(c.progress, fsdp::config::ProgressMode::LINES);
  EXPECT_EQ(c.progress_every_s.value(), 0.0);
}

// Each variable set to something not allowed is one error that names the
// variable and the value, and says what is allowed; none is ignored.
TEST(Config, EveryVariableSetWrongIsOneErrorNamingIt) {
  const std::map<std::string, std::string> bad = {
      {"RANK", "x"},
      {"WORLD_SIZE", "0"},
      {"LOCAL_RANK", "-1"},
      {"LOCAL_WORLD_SIZE", "abc"},
      {"MASTER_PORT", "70000"},
      {"FSDP_TIMEOUT", "-3"},
      {"FSDP_RENDEZVOUS_TIMEOUT", "soon"},
      {"FSDP_DEBUG", "verbose"},
      {"FSDP_TRANSPORT", "shm"},
      {"FSDP_BACKEND", "mpi"},
      {"FSDP_TIERS", "maybe"},
      {"FSDP_SHARE_HOST", "maybe"},
      {"FSDP_COMPRESS", "zstd"},
      {"FSDP_COMPRESS_FEEDBACK", "maybe"},
      {"FSDP_COORDINATOR", "nowhere"},
      {"FSDP_REPLICA_GROUP", "-1"},
      {"FSDP_RESTART_COUNT", "-2"},
      {"FSDP_COORDINATOR_TIMEOUT", "0"},
      {"FSDP_STORE_BIND", "some"},
      {"FSDP_STORE_HOSTED", "yes"},
      {"FSDP_RING_PIECE_KIB", "1"},
      {"FSDP_HEARTBEAT_INTERVAL", "0.001"},
      {"FSDP_FLIGHT_RECORDER", "sometimes"},
      {"FSDP_FLIGHT_ENTRIES", "3"},
      {"FSDP_ALLOC_CACHE", "never"},
      {"FSDP_PROGRESS", "sometimes"},
      {"FSDP_PROGRESS_EVERY", "-1"},
  };
  std::set<std::string> covered;
  for (const auto& [name, value] : bad) {
    const std::string e = error_of({{name, value}});
    EXPECT_TRUE(contains(e, name + "='" + value + "'")) << name << ": " << e;
    EXPECT_TRUE(contains(e, "expected")) << name << ": " << e;
    covered.insert(name);
  }
  // The messages the suite has always checked stay.
  EXPECT_TRUE(contains(error_of({{"FSDP_TRANSPORT", "shm"}}), "FSDP_TRANSPORT='shm' is not a known transport; expected auto"));
  EXPECT_TRUE(contains(error_of({{"FSDP_TIERS", "maybe"}}), "FSDP_TIERS='maybe' is not known; expected on"));
  EXPECT_TRUE(contains(error_of({{"FSDP_COMPRESS", "zstd"}}),
                       "FSDP_COMPRESS='zstd' is not a known compression; expected off (every byte exact), int8 "
                       "(parameters and gradients int8), int4 (parameters int8, gradients int4) or fp8 (parameters "
                       "float8 e4m3, gradients int8); unset it for the default"));
  EXPECT_TRUE(contains(error_of({{"FSDP_DEBUG", "verbose"}}), "FSDP_DEBUG='verbose' is not a known level; expected off or detail"));
  EXPECT_TRUE(contains(error_of({{"FSDP_PROGRESS", "sometimes"}}), "FSDP_PROGRESS='sometimes': expected off"));
  EXPECT_TRUE(contains(error_of({{"FSDP_JOB_TOKEN", "short"}}), "FSDP_JOB_TOKEN has 5 characters; expected 16 to 128"));
  EXPECT_TRUE(contains(error_of({{"RANK", "3"}, {"WORLD_SIZE", "2"}}), "RANK=3 is not below WORLD_SIZE=2"));
  // The ring piece size names its unit and bounds.
  EXPECT_TRUE(contains(error_of({{"FSDP_RING_PIECE_KIB", "1"}}), "an integer in [4, 1048576]"));
  covered.insert("FSDP_JOB_TOKEN");
  // The launchers' variables, each set wrong beside the others its launcher
  // sets (alone they would not be that launcher's).
  using Env = std::map<std::string, std::string>;
  const Env step = {{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "1"}};
  const Env ompi = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  const Env pmi = {{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}};
  const Env pod = {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "0"}};
  const std::vector<std::tuple<std::string, std::string, Env>> beside = {
      {"GROUP_RANK", "x", {{"RANK", "0"}, {"WORLD_SIZE", "2"}}},
      {"SLURM_PROCID", "x", step},
      {"SLURM_NTASKS", "0", step},
      {"SLURM_LOCALID", "-1", step},
      {"SLURM_NODEID", "x", step},
      {"SLURM_NNODES", "0", step},
      {"SLURM_TASKS_PER_NODE", "4(x", step},
      {"SLURM_STEP_NODELIST", "n[1-", step},
      {"SLURM_JOB_NODELIST", "n[1-", step},
      {"SLURM_TASK_PID", "x", step},
      {"OMPI_COMM_WORLD_RANK", "x", ompi},
      {"OMPI_COMM_WORLD_SIZE", "0", ompi},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "x", ompi},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "0", ompi},
      {"PMI_RANK", "x", pmi},
      {"PMI_SIZE", "0", pmi},
      {"MPI_LOCALRANKID", "x", pmi},
      {"MPI_LOCALNRANKS", "0", pmi},
      {"PET_NNODES", "x", pod},
      {"PET_NODE_RANK", "x", pod},
      {"PET_NPROC_PER_NODE", "0", pod},
  };
  for (auto [name, value, env] : beside) {
    env[name] = value;
    const std::string e = error_of(env);
    EXPECT_TRUE(contains(e, name + "='" + value + "'")) << name << ": " << e;
    EXPECT_TRUE(contains(e, "expected")) << name << ": " << e;
    covered.insert(name);
  }
  // Every variable that takes a restricted value is covered above; the rest
  // take any text (an address, an interface, an id, a directory), or are
  // PyTorch's, only reported (TORCH_NCCL_ASYNC_ERROR_HANDLING: torch checks it).
  for (const auto& v : fsdp::config::variables()) {
    const std::set<std::string> free_text = {"MASTER_ADDR",     "GLOO_SOCKET_IFNAME", "FSDP_HOST_ID",
                                             "FSDP_FLIGHT_DIR", "SLURM_STEP_ID",      "SLURM_STEPID",
                                             "FSDP_CUDA_PLUGIN",        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                             "SLURM_JOB_ID",    "PMIX_NAMESPACE",     "OMPI_MCA_ess_base_jobid",
                                             "OMPI_MCA_orte_ess_jobid", "PMI_KVSNAME"};
    EXPECT_TRUE(covered.count(v.name) || free_text.count(v.name)) << v.name << " has no bad-value case here";
  }
}

// The table (config::variables()), docs/CONFIG.md and the sources agree:
// the docs' table is `fsdp env --markdown`'s output; the library reads the
// environment only in src/config/config.cpp; every FSDP_* name a string of
// src/ mentions is in the table, and every variable of the table is read.
TEST(Config, TheDocsTableAndTheSourcesNameEveryVariable) {
  const auto md = run_command({bin_path("fsdp"), "env", "--markdown"});
  ASSERT_EQ(md.exit_code, 0) << md.output;
  const std::string docs = slurp(source_path("docs/CONFIG.md"));
  ASSERT_FALSE(docs.empty());
  EXPECT_TRUE(contains(docs, md.output)) << "docs/CONFIG.md's table is not `fsdp env --markdown`'s; regenerate it:\n"
                                         << md.output;
  size_t rows = 0;
  for (const auto& v : fsdp::config::variables()) {
    EXPECT_EQ(lines_with(md.output, std::string("| `") + v.name + "` |").size(), 1u) << v.name;
    ++rows;
  }
  EXPECT_GE(rows, 24u);

  std::set<std::string> table;
  for (const auto& v : fsdp::config::variables()) table.insert(v.name);
  const std::regex literal("\"([^\"\\\\]|\\\\.)*\"");
  const std::regex var("(FSDP|SLURM|OMPI_COMM_WORLD|PMI|PET)_[A-Z][A-Z0-9_]*[A-Z0-9]");
  std::set<std::string> mentioned;
  size_t files = 0;
  for (const auto& dir : {"src", "include/fsdp"}) {
    for (const auto& e : fs::recursive_directory_iterator(source_path(dir))) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".h") continue;
      ++files;
      const std::string text = slurp(e.path().string());
      const std::string rel = fs::relative(e.path(), source_path("")).string();
      if (rel != "src/config/config.cpp")
        EXPECT_FALSE(contains(text, "getenv(")) << rel << " reads the environment; read it in src/config/config.cpp";
      for (auto it = std::sregex_iterator(text.begin(), text.end(), literal); it != std::sregex_iterator(); ++it) {
        const std::string s = it->str();
        for (auto v = std::sregex_iterator(s.begin(), s.end(), var); v != std::sregex_iterator(); ++v)
          mentioned.insert(v->str());
      }
    }
  }
  EXPECT_GT(files, 50u);
  // The table's own strings (src/config/config.cpp) name all 17 FSDP_* variables.
  EXPECT_GE(mentioned.size(), 17u);
  // CMake options the messages name (how to rebuild), not variables.
  const std::set<std::string> cmake_options = {"FSDP_CUDA"};
  for (const auto& m : mentioned)
    EXPECT_TRUE(table.count(m) || cmake_options.count(m)) << m << " is named in src/ but not in the table";
  // Read: config.cpp names each variable of the table in a string, in the
  // table and where parse_env reads it (the launchers' variables: in
  // cluster_env.cpp, the reader parse_env calls).
  const std::string cfg = slurp(source_path("src/config/config.cpp")) + slurp(source_path("src/config/cluster_env.cpp"));
  for (const auto& t : table) {
    size_t n = 0;
    for (size_t p = cfg.find("\"" + t + "\""); p != std::string::npos; p = cfg.find("\"" + t + "\"", p + 1)) ++n;
    EXPECT_GE(n, 2u) << t << ": in the table, but parse_env does not read it";
  }
}

// The knobs are options in code too; out of range is an error naming the
// option, and the environment's value wins over the program's.
TEST(Config, TheKnobsAreOptionsInCode) {
  fsdp::CommOptions o;
  o.ring_piece_bytes = 100;
  try {
    fsdp::make_local_communicator(o);
    ADD_FAILURE() << "ring_piece_bytes = 100 was accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "CommOptions::ring_piece_bytes must be 0")) << e.what();
    EXPECT_TRUE(contains(e.what(), "found 100")) << e.what();
  }
  fsdp::CommOptions h;
  h.heartbeat_interval = std::chrono::milliseconds(5);
  try {
    fsdp::make_local_communicator(h);
    ADD_FAILURE() << "heartbeat_interval = 5 ms was accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "CommOptions::heartbeat_interval must be 0")) << e.what();
  }
  fsdp::CommOptions ok;
  ok.ring_piece_bytes = 64 << 10;
  ok.heartbeat_interval = std::chrono::milliseconds(200);
  EXPECT_NE(fsdp::make_local_communicator(ok), nullptr);
}

// The ring's piece size reaches the collectives: every collective of the
// grid (sizes up to 4 MiB, three in flight) is exact when blocks are cut
// into 4 KiB pieces, over TCP and, where allowed, cross-memory attach.
TEST(Config, SmallRingPiecesKeepEveryCollectiveExact) {
  for (const std::string transport : {"tcp", "cma"}) {
    if (transport == "cma" && !fsdp::testing::cma_available()) {
      std::printf("[  NOTE    ] cma not checked: this host forbids process_vm_readv\n");
      continue;
    }
    auto r = run_ranks(3, "comm_collectives", {}, {"FSDP_TRANSPORT=" + transport, "FSDP_RING_PIECE_KIB=4"}, 240);
    EXPECT_EQ(r.exit_code, 0) << transport << "\n" << r.output;
    EXPECT_EQ(lines_with(r.output, "comm_collectives passed").size(), 3u) << transport << "\n" << r.output;
  }
}

// A variable set wrong stops a rank, the launcher and `fsdp env` with the
// one message; `fsdp env` lists every variable with its value.
TEST(Config, ABadVariableStopsEveryEdgeWithOneMessage) {
  const std::string msg = "FSDP_FLIGHT_ENTRIES='3' is not an integer in range; expected collectives the recorder keeps, "
                          "an integer in [8, 1048576]";
  auto rank = run_ranks(2, "comm_hello", {}, {"FSDP_FLIGHT_ENTRIES=3"});
  EXPECT_NE(rank.exit_code, 0) << rank.output;
  EXPECT_TRUE(contains(rank.output, msg)) << rank.output;
  for (const char* program : {"gpt", "tiny"}) {
    auto direct = run_command({bin_path(program)}, {"FSDP_FLIGHT_ENTRIES=3"});
    EXPECT_EQ(direct.exit_code, 1) << program << ": " << direct.output;
    EXPECT_TRUE(contains(direct.output, std::string(program) + ": error: " + msg)) << direct.output;
  }
  auto env = run_command({bin_path("fsdp"), "env"}, {"FSDP_FLIGHT_ENTRIES=3", "FSDP_TIERS=off"});
  EXPECT_EQ(env.exit_code, 1) << env.output;
  EXPECT_TRUE(contains(env.output, "not valid: " + msg)) << env.output;
  EXPECT_EQ(lines_with(env.output, "FSDP_TIERS               'off'").size(), 1u) << env.output;
  EXPECT_EQ(lines_with(env.output, "FSDP_HOST_ID             (unset)").size(), 1u) << env.output;
  auto good = run_command({bin_path("fsdp"), "env"}, {"FSDP_TIERS=off"});
  EXPECT_EQ(good.exit_code, 0) << good.output;
  EXPECT_TRUE(contains(good.output, "every variable that is set is valid")) << good.output;
}

}  // namespace FSDP_TEST_ID
