// fsdp-cpp: the process-wide setup a training program asks for, once, first.
// defines: InitOptions, init
//
//   int main(int argc, char** argv) {
//     fsdp::init();                                 // before any tensor exists
//     auto comm = fsdp::make_communicator_from_env();
//     ...
//
// Nothing else in the library changes process-wide state: the communicator
// factories and fully_shard() install no allocator and no signal handler,
// so a program that embeds fsdp-cpp decides (docs/DESIGN.md, "Process-wide
// state", lists what the library keeps per process, and why).
#pragma once

#include "fsdp/flight.h"

namespace fsdp {

// What fsdp::init sets up for the process. Every part is on by default and
// may be left to the program instead.
struct InitOptions {
  // Installs the counting CPU allocator (fsdp/memory.h) with
  // c10::SetCPUAllocator, for every tensor allocated afterwards: the ledger's
  // measured peak/current, memory::stats(), memory::set_limit (--max-memory)
  // and the trace's memory counter need it. Call init before the model is
  // built or those bytes are not counted. Off: the ledger's peak and current
  // read 0 and no limit applies.
  bool install_allocator = true;
  // The counting allocator keeps freed blocks of 64 KiB and more for reuse
  // (fsdp/memory.h; FSDP_ALLOC_CACHE=off overrides). Off: every block goes
  // back to the system when freed.
  bool allocator_cache = true;
  // Sets SIGPIPE to SIG_IGN when it is still SIG_DFL (a handler of the
  // program's own is kept). A peer rank that dies makes the next socket
  // write raise SIGPIPE, which would kill this rank silently; ignored, the
  // write fails and the collective raises a CollectiveError naming the peer.
  // Off: the program handles SIGPIPE itself.
  bool ignore_sigpipe = true;
  // Makes SIGUSR1 dump the flight recorder (fsdp/flight.h; `fsdp run`
  // sends it to a rank that went silent, and the heartbeat says whether a
  // rank can): a handler that only writes to a pipe, and a thread that
  // waits on the pipe and writes the dump. Installed only while SIGUSR1 is
  // still SIG_DFL: a handler of the program's own is kept. Off: the program
  // may call flight::dump() itself.
  bool dump_flight_on_sigusr1 = true;
  // The flight recorder (fsdp/flight.h): whether it records, and how many
  // collectives its ring keeps. FSDP_FLIGHT_RECORDER and
  // FSDP_FLIGHT_ENTRIES override; the size applies only before the first
  // collective is recorded.
  flight::RecorderOptions flight_recorder;
};

// Idempotent: a second call applies what the first did not (an allocator
// once installed stays installed). Thread-safe; call it from main(). Reads
// the environment (docs/CONFIG.md) and throws fsdp::Error for a variable
// set to something not allowed, naming it.
void init(const InitOptions& opts = {});

}  // namespace fsdp
