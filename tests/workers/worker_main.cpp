// fsdp-cpp tests: the rank process of multi-process tests (see scenario.h).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>

#include "fsdp/init.h"
#include "scenario.h"

namespace fsdp::testing {
std::map<std::string, ScenarioFn>& scenarios() {
  static std::map<std::string, ScenarioFn> all;
  return all;
}
}  // namespace fsdp::testing

int main(int argc, char** argv) {
  // FSDP_TEST_HOST_LAYOUT=a,a,b,b: rank r looks like it runs on host
  // field r (FSDP_HOST_ID), so one launcher simulates several hosts in any
  // order of ranks.
  if (const char* layout = std::getenv("FSDP_TEST_HOST_LAYOUT"); layout && std::getenv("RANK")) {
    std::stringstream in(layout);
    std::string host;
    for (int q = 0; std::getline(in, host, ','); ++q)
      if (q == std::atoi(std::getenv("RANK"))) setenv("FSDP_HOST_ID", ("test-host-" + host).c_str(), 1);
  }
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
