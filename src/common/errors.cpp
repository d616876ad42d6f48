// fsdp-cpp: internal-invariant failures (see include/fsdp/errors.h).
#include "fsdp/errors.h"

#include <atomic>

namespace fsdp::detail {

namespace {
std::atomic<int> g_rank{-1};
}

int current_rank_for_errors() { return g_rank.load(std::memory_order_relaxed); }

void set_rank_for_errors(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

void internal_error(const char* file, int line, const std::string& msg) {
  throw InternalError(cat("fsdp-cpp internal error at ", file, ":", line, " (rank ",
                             current_rank_for_errors(), "): ", msg,
                             ". This is a bug in fsdp-cpp; please report it with this message."));
}

}  // namespace fsdp::detail
