// fsdp-cpp: internal-invariant failures (see include/fsdp/errors.h).
#include "fsdp/errors.h"

#include <cstdlib>

namespace fsdp::detail {

int current_rank_for_errors() {
  static int rank = [] {
    const char* r = std::getenv("RANK");
    return r ? std::atoi(r) : -1;
  }();
  return rank;
}

void internal_error(const char* file, int line, const std::string& msg) {
  throw InternalError(cat("fsdp-cpp internal error at ", file, ":", line, " (rank ",
                             current_rank_for_errors(), "): ", msg,
                             ". This is a bug in fsdp-cpp; please report it with this message."));
}

}  // namespace fsdp::detail
