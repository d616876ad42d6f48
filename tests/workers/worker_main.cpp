// fsdp-cpp tests: the rank process of multi-process tests (see scenario.h).
#include <cstdio>
#include <exception>

#include "fsdp/init.h"
#include "scenario.h"

namespace fsdp::testing {
std::map<std::string, ScenarioFn>& scenarios() {
  static std::map<std::string, ScenarioFn> all;
  return all;
}
}  // namespace fsdp::testing

int main(int argc, char** argv) {
  fsdp::init();  // every scenario measures with the counting allocator
  auto& all = fsdp::testing::scenarios();
  if (argc < 2 || !all.count(argv[1])) {
    std::fprintf(stderr, "usage: fsdp_test_worker <scenario> [args...]\nscenarios:");
    for (auto& kv : all) std::fprintf(stderr, " %s", kv.first.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return all[argv[1]](args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scenario %s failed: %s\n", argv[1], e.what());
    std::fflush(stderr);
    return 1;
  }
}
