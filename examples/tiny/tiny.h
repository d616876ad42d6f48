// fsdp-cpp: the tiny example as one function (tiny.cpp): its main (main.cpp)
// calls it, and the tests run it inside tests/workers with a rank slowed
// down or stuck (examples::StepHooks).
// defines: tiny::run
#pragma once

#include "step_hooks.h"

namespace tiny {

// The whole program on this rank: flags, training, the report. Returns the
// exit code: 0; 1 for an error; 2 for a usage error (said on stderr).
int run(int argc, char** argv, const examples::StepHooks& hooks = {});

}  // namespace tiny
