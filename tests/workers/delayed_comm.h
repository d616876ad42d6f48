// fsdp-cpp tests: a communicator that holds every collective back, so a
// missing wait is caught (the prefetch / async-reduce parity grid).
// defines: with_comm_delay, comm_from_env_with_test_delay
#pragma once

#include <chrono>

#include "fsdp/comm.h"

namespace fsdp::testing {

// Forwards every call to `inner`, but each collective first waits `delay` on
// the wrapper's own thread (in issue order), so its output is written well
// after the call returned: a caller that reads it without wait() reads stale
// data. Work::wait() blocks until inner's collective finished. Counters,
// timeouts and errors are inner's.
CommPtr with_comm_delay(CommPtr inner, std::chrono::milliseconds delay);

// make_communicator_from_env(), wrapped with_comm_delay when the test sets
// FSDP_TEST_COMM_DELAY_MS=M: rank r waits M*(r+1) ms per collective (ranks
// out of step as well as late).
CommPtr comm_from_env_with_test_delay();

}  // namespace fsdp::testing
