// fsdp-cpp tests: what every program built on fsdp-cpp does first, done once
// for fsdp_tests (the ledger and memory tests measure through the counting
// allocator). Kept out of test_util.cpp, which the torch-free install test
// compiles too.
#include <gtest/gtest.h>

#include "fsdp/init.h"

namespace FSDP_TEST_ID {

class InitEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { fsdp::init(); }
};
const auto* const g_init_env = ::testing::AddGlobalTestEnvironment(new InitEnvironment);

}  // namespace FSDP_TEST_ID
