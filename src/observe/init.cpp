// fsdp-cpp: process-wide setup (see include/fsdp/init.h).
#include "fsdp/init.h"

#include <csignal>
#include <mutex>

#include "fsdp/flight.h"
#include "fsdp/memory.h"

namespace fsdp {

void init(const InitOptions& opts) {
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  const config::EnvConfig env = config::read_env();  // the one read, before any change
  flight::configure(opts.flight_recorder);
  flight::apply_env(env);
  if (opts.install_allocator && memory::install() && !(opts.allocator_cache && env.alloc_cache))
    memory::set_caching(false);
  if (opts.ignore_sigpipe) {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  }
  if (opts.dump_flight_on_sigusr1) flight::dump_on_signal();
}

}  // namespace fsdp
