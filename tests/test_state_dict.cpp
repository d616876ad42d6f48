// fsdp-cpp tests: checkpoints of a wrapped model (include/fsdp/state_dict.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core_model.h"
#include "fsdp/fsdp.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace fsdp::testing {
namespace {

std::string tmpdir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("fsdp-state-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::map<std::string, torch::Tensor> read_all(const std::string& path) {
  ckpt::SafetensorsReader r(path);
  std::map<std::string, torch::Tensor> out;
  for (auto& e : r.entries()) out[e.name] = r.read_all(e.name);
  return out;
}

double max_rel_diff(const std::string& a, const std::string& b, bool* bitwise) {
  auto A = read_all(a), B = read_all(b);
  EXPECT_EQ(A.size(), B.size());
  double worst = 0;
  *bitwise = true;
  for (auto& [k, t] : A) {
    auto it = B.find(k);
    if (it == B.end()) {
      ADD_FAILURE() << "missing " << k;
      continue;
    }
    *bitwise = *bitwise && torch::equal(t, it->second);
    double d = (t - it->second).abs().max().item<double>() / std::max(1e-12, t.abs().max().item<double>());
    worst = std::max(worst, d);
  }
  return worst;
}

void run_ok(int n, const std::vector<std::string>& args) {
  auto r = run_ranks(n, "core_resume", args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

TEST(StateDict, ExactResumeIsBitwiseAtTheSameWorldSize) {
  auto d = tmpdir("resume");
  run_ok(2, {"straight", "10", d + "/ck", d + "/straight.safetensors"});
  run_ok(2, {"first", "10", d + "/ck", ""});
  run_ok(2, {"second", "10", d + "/ck", d + "/resumed.safetensors"});
  bool bitwise = false;
  max_rel_diff(d + "/straight.safetensors", d + "/resumed.safetensors", &bitwise);
  EXPECT_TRUE(bitwise) << "10 straight steps != 5 + save + load + 5";
  fs::remove_all(d);
}

TEST(StateDict, ResumeAtAnotherWorldSizeAndStrategy) {
  auto d = tmpdir("reshard");
  run_ok(2, {"straight", "10", d + "/ck", d + "/straight.safetensors"});
  run_ok(2, {"first", "10", d + "/ck", "", "full"});
  run_ok(3, {"second", "10", d + "/ck", d + "/resumed3.safetensors", "grad-op"});
  bool bitwise = false;
  double rel = max_rel_diff(d + "/straight.safetensors", d + "/resumed3.safetensors", &bitwise);
  EXPECT_LE(rel, 1e-6) << "saved at N=2 FULL_SHARD, resumed at N=3 SHARD_GRAD_OP";
  fs::remove_all(d);
}

TEST(StateDict, FailedLoadLeavesModelAndOptimizerUntouched) {
  auto d = tmpdir("bad");
  run_ok(2, {"first", "4", d + "/ck", ""});
  // Flip one byte in the middle of rank 1's shard file.
  std::string ckdir = ckpt::resolve_checkpoint(d + "/ck");
  std::string victim;
  for (auto& e : fs::directory_iterator(ckdir))
    if (e.path().extension() == ".safetensors") victim = e.path().string();
  ASSERT_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    auto size = static_cast<long>(f.tellg());
    f.seekg(size - 16);
    char c;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(size - 16);
    f.write(&c, 1);
  }
  auto r = run_ranks(2, "core_load_bad", {d + "/ck"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "UNTOUCHED opt_state=0").size(), 2u) << r.output;
  fs::remove_all(d);
}

TEST(StateDict, FullSafetensorsRoundTripsAndPythonReadsIt) {
  auto d = tmpdir("full");
  torch::manual_seed(3);
  Net net;
  auto comm = make_local_communicator();
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, comm, o);
  auto path = d + "/model.safetensors";
  save_full(*model, path);
  auto full = model->full_state();
  auto file = read_all(path);
  ASSERT_EQ(file.size(), full.size());
  for (auto& [k, t] : full) EXPECT_TRUE(torch::equal(file.at(k), t)) << k;
  // Load into a differently initialised model: equal afterwards.
  torch::manual_seed(4);
  Net other;
  auto m2 = fully_shard(other, make_local_communicator(), o);
  load_full(*m2, path);
  auto full2 = m2->full_state();
  for (size_t i = 0; i < full.size(); ++i) EXPECT_TRUE(torch::equal(full[i].second, full2[i].second));
  // PyTorch reads it with no fsdp-cpp code (struct + json + torch).
  auto py = run_command({"/usr/bin/python3", "-c",
                         "import json,struct,torch,sys\n"
                         "b=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n])\n"
                         "e=h['inp.weight']; s,t=e['data_offsets']\n"
                         "x=torch.frombuffer(bytearray(b[8+n+s:8+n+t]),dtype=torch.float32).reshape(e['shape'])\n"
                         "print('SUM %.6f' % x.double().sum().item())\n",
                         path});
  ASSERT_EQ(py.exit_code, 0) << py.output;
  double expect = 0;
  for (auto& [k, t] : full)
    if (k == "inp.weight") expect = t.to(torch::kFloat64).sum().item<double>();
  char buf[64];
  std::snprintf(buf, sizeof buf, "SUM %.6f", expect);
  EXPECT_NE(py.output.find(buf), std::string::npos) << py.output << " expected " << buf;
  fs::remove_all(d);
}

TEST(StateDict, OomNamesTheLedgerTerm) {
  torch::manual_seed(3);
  Net net(7, 64, 5, 2);
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, make_local_communicator(), o);
  // Just enough for the resident shards, not for a block's unsharded parameters.
  memory::set_limit(memory::stats().current + 4096);
  try {
    model.forward(torch::randn({2, 7}));
    memory::set_limit(0);
    FAIL() << "expected an out-of-memory error";
  } catch (const memory::OutOfMemory& e) {
    memory::set_limit(0);
    std::string m = e.what();
    EXPECT_NE(m.find("P_block"), std::string::npos) << m;
    EXPECT_NE(m.find("Remedies"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace fsdp::testing
