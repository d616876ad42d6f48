// fsdp-cpp: every environment variable fsdp-cpp reads, parsed in one place
// into one typed configuration.
// defines: config::Variable, config::variables, config::EnvConfig,
//          config::ProgressMode, config::Lookup, config::parse_env,
//          config::read_env
//
// The environment is read at the library's edges only: a communicator made
// from the environment (make_communicator_from_env, make_local_communicator),
// fsdp::init, a Progress reporter, and the `fsdp` command. Each calls
// read_env() once and passes the values it needs down; nothing deeper calls
// getenv. A variable that is set but not valid is one fsdp::Error naming the
// variable, the value found and what is allowed. Unset (or empty) means the
// default, which for the tuning knobs is the value the program chose in code
// (CommOptions, InitOptions): a variable set in the environment overrides
// the program's choice. (ProgressOptions keeps its own order: see progress.h.)
//
// variables() is the table of every variable; docs/CONFIG.md lists the same
// rows and `fsdp env` prints them with this process's values. A test fails
// when the docs, the table and the sources disagree, or when getenv appears
// anywhere else in src/. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

// The environment fsdp-cpp reads, in one table and one parser.
namespace fsdp::config {

// One row of the table.
struct Variable {
  const char* name;      // e.g. "FSDP_TIMEOUT"
  const char* allowed;   // the values accepted
  const char* fallback;  // what unset means
  const char* meaning;   // what it sets
};
// Every variable read_env() reads, in the order of docs/CONFIG.md.
const std::vector<Variable>& variables();

// How a Progress reporter draws (FSDP_PROGRESS).
enum class ProgressMode {
  AUTO,   // on: lines, or one line rewritten on a terminal
  OFF,    // nothing
  LINES,  // full lines even on a terminal
  TTY,    // one line rewritten even off a terminal
};

// What the environment says, typed; unset optionals: the program's choice.
struct EnvConfig {
  // --- Where this process sits: torchrun's variables (as `fsdp run` sets
  // them), else Slurm's (in an srun step), Open MPI's, PMI's or Kubeflow's
  int rank = 0;                           // RANK (or SLURM_PROCID, OMPI_COMM_WORLD_RANK, ...)
  int world_size = 1;                     // WORLD_SIZE (or SLURM_NTASKS, ...)
  int local_rank = 0;                     // LOCAL_RANK (or SLURM_LOCALID, ...)
  int local_world_size = 1;               // LOCAL_WORLD_SIZE (or from SLURM_TASKS_PER_NODE, ...)
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR (or SLURM_JOB_NODELIST's first host)
  int master_port = 29500;                // MASTER_PORT (or derived from SLURM_JOB_ID, ...)
  bool world_from_env = false;  // a launcher's rank and world size were both set
  std::string launcher;  // whose variables: torchrun, slurm, openmpi, pmi, kubeflow; "" none
  std::string launch;    // "launcher: slurm (SLURM_PROCID=1 ...): rank 1 of 4, ...": each rank's first log line

  // --- The communicator
  std::optional<int64_t> timeout_ms;             // FSDP_TIMEOUT
  std::optional<int64_t> rendezvous_timeout_ms;  // FSDP_RENDEZVOUS_TIMEOUT
  std::string ifname;                            // GLOO_SOCKET_IFNAME, "" unset
  bool debug_info = false;                       // FSDP_DEBUG=info or detail
  bool debug_detail = false;                     // FSDP_DEBUG=detail
  std::string transport = "auto";                // FSDP_TRANSPORT: auto, tcp, cma
  std::string backend = "auto";                  // FSDP_BACKEND: auto (the program's), gloo, nccl
  bool tiers = true;                             // FSDP_TIERS
  std::optional<bool> share_host;                // FSDP_SHARE_HOST, unset: CommOptions::share_host_memory
  std::string compress;                          // FSDP_COMPRESS: off, int8, int4 or fp8; "": CommOptions::compress
  std::optional<bool> compress_feedback;         // FSDP_COMPRESS_FEEDBACK, unset: CommOptions::error_feedback
  std::string job_token;                         // FSDP_JOB_TOKEN, "" unset
  std::string host_id;                           // FSDP_HOST_ID, "" unset
  std::string coordinator;                       // FSDP_COORDINATOR ("host:port"), "" unset
  std::optional<int> replica_group;              // FSDP_REPLICA_GROUP
  std::optional<int> restart_count;              // FSDP_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT
  std::optional<int64_t> coordinator_timeout_ms; // FSDP_COORDINATOR_TIMEOUT
  std::string cuda_plugin;                       // FSDP_CUDA_PLUGIN, "" unset (fsdp/device.h)
  std::string nccl_async_error_handling = "3";   // TORCH_NCCL_ASYNC_ERROR_HANDLING, as given (torch's)
  bool store_bind_all = false;                   // FSDP_STORE_BIND=all
  bool store_hosted = false;                     // FSDP_STORE_HOSTED=1
  std::optional<int64_t> ring_piece_bytes;       // FSDP_RING_PIECE_KIB x 1024
  std::optional<int64_t> heartbeat_interval_ms;  // FSDP_HEARTBEAT_INTERVAL

  // --- The process (fsdp::init)
  std::optional<bool> flight_recorder;   // FSDP_FLIGHT_RECORDER
  std::optional<int> flight_entries;     // FSDP_FLIGHT_ENTRIES
  std::string flight_dir;                // FSDP_FLIGHT_DIR, "" unset
  bool alloc_cache = true;               // FSDP_ALLOC_CACHE

  // --- Progress lines
  ProgressMode progress = ProgressMode::AUTO;  // FSDP_PROGRESS
  std::optional<double> progress_every_s;      // FSDP_PROGRESS_EVERY
};

// A variable's value, or null when unset. read_env() uses getenv; tests
// pass a map.
using Lookup = std::function<const char*(const char* name)>;

// Parses and validates every variable of the table. Throws fsdp::Error for
// the first one set to something not allowed: "NAME='value': expected ...".
EnvConfig parse_env(const Lookup& lookup);
// parse_env over this process's environment.
EnvConfig read_env();

// Bounds shared by the variables and the options in code they override.
inline constexpr int64_t kMinRingPieceBytes = 4 << 10;           // FSDP_RING_PIECE_KIB, ring_piece_bytes: 4 KiB
inline constexpr int64_t kMaxRingPieceBytes = int64_t(1) << 30;  // ... at most 1 GiB
inline constexpr int kMinFlightEntries = 8;                      // FSDP_FLIGHT_ENTRIES, RecorderOptions::entries
inline constexpr int kMaxFlightEntries = 1 << 20;                // ... at most 2^20
inline constexpr int64_t kMinHeartbeatMs = 10;                   // FSDP_HEARTBEAT_INTERVAL, heartbeat_interval
inline constexpr int64_t kMaxHeartbeatMs = 60'000;               // ... at most 60 s

}  // namespace fsdp::config
