// fsdp-cpp tests: error feedback's residuals in checkpoints (issue 57): a
// compressed run saved mid-way resumes bit for bit, because every rank gets
// its own residuals back; a load that cannot use them drops them with a
// note. Runs FULL_SHARD over 2 simulated hosts x 2 ranks with FSDP_COMPRESS=int8
// and FSDP_SHARE_HOST=off (parameters and gradients both cross int8).
// Scenarios: tests/workers/residual_scenarios.cpp (core_residuals).
#include <gtest/gtest.h>

#include <filesystem>

#include "fsdp/fsdp.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// 2 hosts x 2 ranks, both collectives compressed.
const std::vector<std::string> kCompressed = {"FSDP_TEST_HOST_LAYOUT=a,a,b,b", "FSDP_COMPRESS=int8",
                                              "FSDP_SHARE_HOST=off"};
// The same hosts, nothing compressed.
const std::vector<std::string> kExact = {"FSDP_TEST_HOST_LAYOUT=a,a,b,b", "FSDP_COMPRESS=off", "FSDP_SHARE_HOST=off"};

ProcResult run_ok(int n, const std::vector<std::string>& args, const std::vector<std::string>& env) {
  auto r = run_ranks(n, "core_residuals", args, env, 240);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r;
}

// Whether two safetensors files hold the same tensors, bit for bit.
bool same_bits(const std::string& a, const std::string& b) {
  ckpt::SafetensorsReader A(a), B(b);
  if (A.entries().size() != B.entries().size()) return false;
  for (auto& e : A.entries())
    if (!B.find(e.name) || !torch::equal(A.read_all(e.name), B.read_all(e.name))) return false;
  return true;
}

// The one NOTE line of each rank (core_residuals' second phases).
std::vector<std::string> notes(const ProcResult& r) { return lines_with(r.output, "NOTE rank="); }

// Saved at step 3 of 6, resumed in new processes: parameters and AdamW's
// state equal an uninterrupted compressed run bit for bit. The same resume
// with the residuals replaced by none is not equal: they are what makes it
// exact. The checkpoint holds every rank's own residuals (per_rank section)
// under "residual/<comm>/": `comm` is the communicator that compresses
// ("world", or HYBRID's "replica"), `prefix` its RESIDUALS fields' ("" or
// "replica_").
void expect_bitwise_resume(const std::string& strategy, const std::string& comm, const std::string& prefix) {
  const auto d = temp_dir("residuals-" + strategy);
  run_ok(4, {"straight", "6", d + "/ck", d + "/straight", strategy}, kCompressed);
  auto first = run_ok(4, {"first", "6", d + "/ck", "", strategy}, kCompressed);
  auto saved = lines_with(first.output, "RESIDUALS rank=");
  ASSERT_EQ(saved.size(), 4u) << first.output;
  std::map<long long, long long> count;  // rank -> residuals it saved
  for (auto& l : saved) {
    EXPECT_TRUE(contains(l, " " + prefix + "compress=int8")) << l;
    EXPECT_GT(parse_kv(l)[prefix + "count"], 0) << l;
    count[parse_kv(l)["rank"]] = parse_kv(l)[prefix + "count"];
  }
  const ckpt::CheckpointInfo info = ckpt::read_info(d + "/ck");
  for (int r = 0; r < 4; ++r) {
    int mine = 0;
    const std::string name = "rank-0000" + std::to_string(r) + "/residual/" + comm + "/";
    for (auto& t : info.tensors) mine += t.section == "per_rank" && t.name.rfind(name, 0) == 0;
    EXPECT_EQ(mine, count[r]) << "rank " << r << "'s residuals in " << info.path;
  }
  EXPECT_TRUE(info.train_state.contains("error_feedback")) << info.train_state.dump();

  auto resumed = run_ok(4, {"second", "6", d + "/ck", d + "/resumed", strategy}, kCompressed);
  for (auto& l : notes(resumed)) EXPECT_FALSE(contains(l, "residuals")) << l;
  EXPECT_TRUE(same_bits(d + "/straight.model.safetensors", d + "/resumed.model.safetensors"))
      << strategy << ": 6 compressed steps != 3 + save + load + 3 (parameters)";
  EXPECT_TRUE(same_bits(d + "/straight.optim.safetensors", d + "/resumed.optim.safetensors"))
      << strategy << ": 6 compressed steps != 3 + save + load + 3 (optimizer state)";

  run_ok(4, {"second_zero", "6", d + "/ck", d + "/zeroed", strategy}, kCompressed);
  EXPECT_FALSE(same_bits(d + "/straight.model.safetensors", d + "/zeroed.model.safetensors"))
      << strategy << ": the resume without residuals equals the uninterrupted run: the test proves nothing";
  fs::remove_all(d);
}

TEST(CkptResiduals, CompressedResumeIsBitwiseOnlyWithTheResiduals) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  expect_bitwise_resume("full", "world", "");
}

// HYBRID_SHARD over 2 hosts x 2 ranks: each replica group has one rank per
// host, so its all-reduce compresses (two residuals per unit: the input's
// and the owner's reduced chunk's) on the replica group's communicator,
// which the checkpoint saves under "replica".
TEST(CkptResiduals, HybridReplicaResidualsResumeBitwise) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  expect_bitwise_resume("hybrid", "replica", "replica_");
}

// A background save's snapshot holds the residuals as they were at the
// call, though two more steps change every one before the write.
TEST(CkptResiduals, ABackgroundSaveCarriesThem) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  const auto d = temp_dir("residuals-async");
  run_ok(4, {"straight", "6", d + "/ck", d + "/straight"}, kCompressed);
  run_ok(4, {"first_async", "6", d + "/ck", ""}, kCompressed);
  run_ok(4, {"second", "6", d + "/ck", d + "/resumed"}, kCompressed);
  EXPECT_TRUE(same_bits(d + "/straight.model.safetensors", d + "/resumed.model.safetensors"));
  EXPECT_TRUE(same_bits(d + "/straight.optim.safetensors", d + "/resumed.optim.safetensors"));
  fs::remove_all(d);
}

// Loads that cannot use the residuals drop them (or start them at zero)
// with one note, and load the model and optimizer as ever: into an
// uncompressed run (one host at N = 2: another world size too; 2 x 2 with
// FSDP_COMPRESS=off), at another world size (resharded offline to 2, which
// drops the per_rank section), and an uncompressed checkpoint into a
// compressed run.
TEST(CkptResiduals, ALoadThatCannotUseThemDropsThemWithANote) {
  if (!cma_available()) GTEST_SKIP() << "this host forbids process_vm_readv";
  const auto d = temp_dir("residuals-drop");
  run_ok(4, {"first", "6", d + "/ck", ""}, kCompressed);
  auto expect_note = [](const ProcResult& r, const std::string& why, size_t ranks) {
    auto n = notes(r);
    ASSERT_EQ(n.size(), ranks) << r.output;
    for (auto& l : n) {
      EXPECT_TRUE(contains(l, "error feedback's residuals were not restored: " + why)) << l;
      EXPECT_TRUE(contains(l, "starts at zero")) << l;
    }
    EXPECT_EQ(lines_with(r.output, "fsdp: loading ").size(), 1u) << "rank 0 says it on stderr\n" << r.output;
  };
  expect_note(run_ok(2, {"second", "6", d + "/ck", d + "/two"}, {}), "this run compresses nothing", 2);
  expect_note(run_ok(4, {"second", "6", d + "/ck", d + "/exact"}, kExact), "this run compresses nothing", 4);

  const std::string resharded = ckpt::reshard_offline(d + "/ck", 2, d + "/re");
  for (auto& t : ckpt::read_info(resharded).tensors) EXPECT_NE(t.section, "per_rank") << t.name;
  expect_note(run_ok(4, {"second", "6", d + "/re", d + "/re4"}, kCompressed),
              "they belong to the ranks of a world of 2, this one has 4", 4);

  run_ok(4, {"first", "6", d + "/plain", ""}, kExact);
  EXPECT_FALSE(ckpt::read_info(d + "/plain").train_state.contains("error_feedback"));
  expect_note(run_ok(4, {"second", "6", d + "/plain", d + "/into"}, kCompressed),
              "the checkpoint holds none (it was saved without compression)", 4);
  fs::remove_all(d);
}

// A communicator that compresses nothing keeps no residuals, and refuses
// some rather than dropping them silently.
TEST(CkptResiduals, ACommunicatorWithoutCompressionKeepsNone) {
  auto c = make_local_communicator();
  Residuals r = c->residuals();
  EXPECT_EQ(r.compress, Compression::OFF);
  EXPECT_TRUE(r.by_buffer.empty());
  c->load_residuals({});  // nothing to keep: fine
  try {
    c->load_residuals({{"blocks.0 [8 fp32]", torch::zeros({8})}});
    FAIL() << "expected fsdp::Error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "compresses nothing, so it keeps no error-feedback residuals, but 1 were given "
                                   "(the first 'blocks.0 [8 fp32]')"))
        << e.what();
  }
}

}  // namespace FSDP_TEST_ID
}  // namespace fsdp::testing
