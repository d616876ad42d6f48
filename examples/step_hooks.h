// fsdp-cpp examples: the two places in a trainer's step where a test may act
// (tiny, gpt). Their own main() leaves both empty; the tests run the same
// trainers inside tests/workers with a rank slowed down or stuck in its data
// loader, to see the straggler monitor and the watchdog name it. Not
// library code.
// defines: examples::StepHooks
#pragma once

#include <cstdint>
#include <functional>

namespace examples {

struct StepHooks {
  // At the start of every training step, inside the time the straggler
  // monitor counts as the step's.
  std::function<void(int rank, int64_t step)> step;
  // Inside the data phase (fsdp::Phase::DATA), where the step's batch is read.
  std::function<void(int rank, int64_t step)> data;
};

}  // namespace examples
