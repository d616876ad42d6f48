// fsdp-cpp tests: scenarios that run inside each rank of a multi-process test.
// defines: Scenario, ScenarioRegistrar, FSDP_SCENARIO
//
// build/bin/fsdp_test_worker <scenario> [args...] runs one registered scenario;
// tests start it through the launcher (`fsdp run -n N -- fsdp_test_worker ...`),
// so RANK/WORLD_SIZE/... come from the environment. A scenario returns the
// process exit code; it reports values on stdout for the test to parse.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fsdp::testing {

using ScenarioFn = std::function<int(const std::vector<std::string>& args)>;
std::map<std::string, ScenarioFn>& scenarios();

struct ScenarioRegistrar {
  ScenarioRegistrar(const std::string& name, ScenarioFn fn) { scenarios()[name] = std::move(fn); }
};

}  // namespace fsdp::testing

#define FSDP_SCENARIO(name) \
  static int fsdp_scenario_##name(const std::vector<std::string>& args); \
  static ::fsdp::testing::ScenarioRegistrar fsdp_scenario_reg_##name(#name, fsdp_scenario_##name); \
  static int fsdp_scenario_##name(const std::vector<std::string>& args)
