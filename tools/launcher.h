// fsdp-cpp: `fsdp run`, the launcher that starts the ranks of one node.
// defines: LaunchOptions, launch
//
// torchrun's conventions: each rank gets RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (plus FSDP_RESTART_COUNT and
// FSDP_JOB_TOKEN, the job's secret for the rendezvous store), and
// OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS = cores / local
// ranks unless the user set them or passed --threads, and
// OMP_WAIT_POLICY=PASSIVE when ranks x threads exceed the cores (unless set).
//
// Fail together: the first rank that exits non-zero or dies by a signal stops
// the others (SIGTERM, then SIGKILL after a grace period) and the launcher
// names the rank that caused it, not merely the first to exit: a rank killed
// by a signal, a rank stopped (SIGSTOP, read from /proc and waitpid), or the
// rank the others' timeouts name (their verdicts and the heartbeats in the
// store), with its process state and the collective or phase it was in;
// then the last lines of the first rank that failed.
//
// The store: on node 0 the launcher hosts the rendezvous store itself
// (ranks get FSDP_STORE_HOSTED=1), so heartbeats stay readable when rank 0
// freezes. SIGUSR1 to the launcher asks every rank to dump its flight
// recorder (fsdp/flight.h) into --flight-dir (FSDP_FLIGHT_DIR); a stopped
// culprit is continued once to dump before it is killed.
#pragma once

#include <string>
#include <vector>

#include "usage.h"

namespace fsdp::tools {

struct LaunchOptions {
  int nproc = 1;             // local ranks on this node
  int nnodes = 1;             // with min_nodes: the most nodes (MAX of --nnodes MIN:MAX)
  // Elastic (--nnodes MIN:MAX with MIN < MAX): the fewest nodes the job runs
  // on; 0 (or nnodes): a fixed number of nodes. See elastic.h.
  int min_nodes = 0;
  double rdzv_settle_s = 2;   // elastic: once MIN nodes joined a round, wait this long for more
  double rdzv_timeout_s = 60; // elastic: how long a round waits for MIN nodes
  int node_rank = 0;          // elastic: this launcher's node id (node 0 hosts the store)
  std::string master_addr;   // empty: 127.0.0.1 (single node only)
  int master_port = 0;       // 0: a free port (single node only)
  int threads = 0;           // 0: cores / nproc
  int max_restarts = 0;      // restart every rank this many times after a failure
  double grace_s = 3;        // SIGTERM -> SIGKILL
  int tail_lines = 10;       // lines of the failed rank quoted in the report
  std::vector<std::string> argv;  // the program and its arguments
  // FSDP_JOB_TOKEN given to the ranks (the rendezvous store's keys live under
  // it). Empty: the launcher's own FSDP_JOB_TOKEN if set, else on one node a
  // fresh random token per attempt; a multi-node job needs the same token on
  // every node (export it), otherwise it runs without one and says so.
  std::string job_token;
  // FSDP_FLIGHT_DIR given to the ranks: where flight recorder dumps go.
  // Empty: the ranks' own default (the trainers: <ckpt-dir>/flight).
  std::string flight_dir;
};

// Elastic mode (min_nodes < nnodes): rounds of membership (elastic.h); a
// failure anywhere ends the round and the launchers that are left start
// the next one at the new world size, while restarts remain
// (max_restarts) and at least min_nodes are there. Each round's ranks get
// FSDP_RESTART_COUNT = the round's number.
//
// Checks the options (throws fsdp::UsageError on bad input), runs the ranks to
// the end and returns the launcher's exit code: 0 when every rank exited 0;
// the failed rank's exit code (128 + signal when killed) otherwise.
int launch(LaunchOptions opts);

}  // namespace fsdp::tools
