// fsdp-cpp tests: the example trainers as rank scenarios, with faults.
//
// tiny  FLAGS...  examples/tiny (tiny::run) with tiny's flags
// gpt   FLAGS...  examples/gpt (gpt::run) with gpt's flags
//
// The same programs as build/bin/tiny and build/bin/gpt, plus the faults of
// fault_injection.h from the environment (FSDP_INJECT_STEP_DELAY=RANK:MS,
// FSDP_INJECT_DATA_HANG=RANK:STEP): the tests of the straggler monitor and
// of the watchdog run them as `fsdp run -n N -- fsdp_test_worker tiny ...`.
#include <string>
#include <vector>

#include "fault_injection.h"
#include "gpt/train.h"
#include "scenario.h"
#include "tiny/tiny.h"

namespace FSDP_TEST_ID {

// argv for a program's run(): its name, then the scenario's arguments.
int run_as(const char* name, const std::vector<std::string>& args,
           int (*run)(int, char**, const examples::StepHooks&)) {
  std::vector<std::string> owned{name};
  owned.insert(owned.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  return run(int(owned.size()), argv.data(), fsdp::testing::fault_hooks());
}

FSDP_SCENARIO(tiny) { return run_as("tiny", args, tiny::run); }

FSDP_SCENARIO(gpt) { return run_as("gpt", args, gpt::run); }

}  // namespace FSDP_TEST_ID
