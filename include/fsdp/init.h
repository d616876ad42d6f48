// fsdp-cpp: the process-wide setup a training program asks for, once, first.
// defines: InitOptions, init
//
//   int main(int argc, char** argv) {
//     fsdp::init();                                 // before any tensor exists
//     auto comm = fsdp::make_communicator_from_env();
//     ...
//
// Nothing else in the library changes process-wide state: the communicator
// factories and fully_shard() no longer install the allocator or touch
// signals on first use, so a program that embeds fsdp-cpp decides.
#pragma once

namespace fsdp {

struct InitOptions {
  // Installs the counting CPU allocator (fsdp/memory.h) with
  // c10::SetCPUAllocator, for every tensor allocated afterwards: the ledger's
  // measured peak/current, memory::stats(), memory::set_limit (--max-memory)
  // and the trace's memory counter need it. Call init before the model is
  // built or those bytes are not counted. Off: the ledger's peak and current
  // read 0 and no limit applies.
  bool install_allocator = true;
  // Sets SIGPIPE to SIG_IGN when it is still SIG_DFL (a handler of the
  // program's own is kept). A peer rank that dies makes the next socket
  // write raise SIGPIPE, which would kill this rank silently; ignored, the
  // write fails and the collective raises a CollectiveError naming the peer.
  // Off: the program handles SIGPIPE itself.
  bool ignore_sigpipe = true;
};

// Idempotent: a second call applies what the first did not (an allocator
// once installed stays installed). Thread-safe; call it from main().
void init(const InitOptions& opts = {});

}  // namespace fsdp
