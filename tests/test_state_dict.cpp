// fsdp-cpp tests: checkpoints of a wrapped model (include/fsdp/state_dict.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core_model.h"
#include "fsdp/fsdp.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

std::string tmpdir(const std::string& name) { return temp_dir("state-" + name); }

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
  auto py = run_command({fsdp::testing::torch_python(), "-c",
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

// The full files (model + consolidated optimizer state) are a resume point
// too: bitwise at the same world size, within 1e-6 at another size/strategy.
TEST(StateDict, FullModelAndOptimizerFilesResumeAtAnyWorldSize) {
  auto d = tmpdir("fullresume");
  run_ok(2, {"straight", "10", d + "/ck", d + "/straight.safetensors"});
  run_ok(2, {"full_first", "10", d + "/full2", ""});
  run_ok(2, {"full_second", "10", d + "/full2", d + "/resumed2.safetensors"});
  bool bitwise = false;
  max_rel_diff(d + "/straight.safetensors", d + "/resumed2.safetensors", &bitwise);
  EXPECT_TRUE(bitwise) << "10 straight steps != 5 + save_full(_optim) + load_full(_optim) + 5 at N=2";
  run_ok(3, {"full_second", "10", d + "/full2", d + "/resumed3.safetensors", "grad-op"});
  double rel = max_rel_diff(d + "/straight.safetensors", d + "/resumed3.safetensors", &bitwise);
  EXPECT_LE(rel, 1e-6) << "consolidated at N=2 FULL_SHARD, resumed at N=3 SHARD_GRAD_OP";
  // The offline conversion of a sharded checkpoint's optimizer section gives
  // the same file (same training, same N), so it loads with load_full_optim.
  run_ok(2, {"first", "10", d + "/ck", ""});
  ckpt::convert_to_full(d + "/ck", d + "/converted.safetensors", "optim");
  max_rel_diff(d + "/full2/optim.safetensors", d + "/converted.safetensors", &bitwise);
  EXPECT_TRUE(bitwise) << "save_full_optim != fsdp ckpt convert --section optim";
  EXPECT_EQ(ckpt::SafetensorsReader(d + "/converted.safetensors").metadata().at("format"), "fsdp-optim");
  fs::remove_all(d);
}

// The consolidated optimizer file does not depend on the world size it was
// written at, and PyTorch reads it by parameter name.
TEST(StateDict, ConsolidatedOptimizerStateIsByParameterName) {
  auto d = tmpdir("fulloptim");
  run_ok(1, {"full_first", "6", d + "/n1", ""});
  run_ok(3, {"full_first", "6", d + "/n3", "", "full"});
  auto a = read_all(d + "/n1/optim.safetensors"), b = read_all(d + "/n3/optim.safetensors");
  ASSERT_EQ(a.size(), b.size());
  torch::manual_seed(7);
  Net net;
  int params = 0;
  for (auto& p : net->named_parameters()) {
    ++params;
    for (const char* f : {".exp_avg", ".exp_avg_sq"}) {
      auto k = p.key() + f;
      ASSERT_TRUE(a.count(k) && b.count(k)) << k;
      EXPECT_EQ(a[k].sizes(), p.value().sizes()) << k;
      double rel = (a[k] - b[k]).abs().max().item<double>() / std::max(1e-12, a[k].abs().max().item<double>());
      EXPECT_LE(rel, 1e-5) << k << ": N=1 vs N=3";
    }
    auto st = p.key() + ".step";
    ASSERT_TRUE(a.count(st)) << st;
    EXPECT_EQ(a[st].item<int64_t>(), 3) << st;
    EXPECT_EQ(b[st].item<int64_t>(), 3) << st << " (gate.g has fewer elements than ranks)";
  }
  EXPECT_EQ(static_cast<int>(a.size()), 3 * params);
  ckpt::SafetensorsReader r(d + "/n3/optim.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "fsdp-optim");
  EXPECT_EQ(r.metadata().at("optimizer"), "adamw");
  EXPECT_NE(r.metadata().at("param_groups").find("\"inp.weight\""), std::string::npos);
  auto py = run_command({fsdp::testing::torch_python(), "-c",
                         "import json,struct,torch,sys\n"
                         "b=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n])\n"
                         "e=h['blocks.1.fc2.weight.exp_avg_sq']; s,t=e['data_offsets']\n"
                         "x=torch.frombuffer(bytearray(b[8+n+s:8+n+t]),dtype=torch.float32).reshape(e['shape'])\n"
                         "st=h['blocks.1.fc2.weight.step']; s,t=st['data_offsets']\n"
                         "k=torch.frombuffer(bytearray(b[8+n+s:8+n+t]),dtype=torch.int64)\n"
                         "g=json.loads(h['__metadata__']['param_groups'])\n"
                         "print('PY shape=%s step=%d lr=%g sum=%.9e' % (list(x.shape), k.item(), g[0]['lr'], x.double().sum().item()))\n",
                         d + "/n3/optim.safetensors"});
  ASSERT_EQ(py.exit_code, 0) << py.output;
  char want[160];
  std::snprintf(want, sizeof want, "PY shape=[12, 25] step=3 lr=0.001 sum=%.9e",
                b["blocks.1.fc2.weight.exp_avg_sq"].to(torch::kFloat64).sum().item<double>());
  EXPECT_NE(py.output.find(want), std::string::npos) << py.output << " expected " << want;
  fs::remove_all(d);
}

// Gathering the full state goes to rank 0 alone: the other ranks hold nothing
// beyond their shards, rank 0 one unsharded unit (plus the output it asked for).
TEST(StateDict, FullStateIsGatheredToRankZeroOnly) {
  auto d = tmpdir("fullmem");
  auto r = run_ranks(3, "core_full_memory", {d});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = lines_with(r.output, "MEM op=");
  ASSERT_EQ(lines.size(), 9u) << r.output;
  auto field = [](const std::string& line, const std::string& key) {
    auto at = line.find(key + "=");
    return std::stoll(line.substr(at + key.size() + 1));
  };
  int64_t full_bytes = 0;
  for (auto& l : lines_with(r.output, "FULL rank=0")) full_bytes = field(l, "bytes");
  EXPECT_GT(full_bytes, 0);
  const int64_t slack = 4096;  // status flags, step counters, allocator headers
  for (auto& l : lines) {
    const bool root = l.find("rank=0") != std::string::npos;
    const int64_t extra = field(l, "extra"), block = field(l, "block"), shard = field(l, "shard");
    if (l.find("op=save_full_optim") != std::string::npos)
      // Every rank lays out one field of its shard's optimizer state at a time.
      EXPECT_LE(extra, shard + (root ? block : 0) + slack) << l;
    else if (l.find("op=save_full") != std::string::npos)
      EXPECT_LE(extra, (root ? block : 0) + slack) << l;
    else
      EXPECT_LE(extra, (root ? full_bytes + block : 0) + slack) << l;
  }
  fs::remove_all(d);
}

TEST(StateDict, LoadFullOptimRejectsTheWrongFileAndLeavesTheOptimizer) {
  auto d = tmpdir("optimbad");
  torch::manual_seed(3);
  Net net;
  FsdpOptions o;
  o.wrap = WrapPolicy::module_type<BlockImpl>("Block");
  auto model = fully_shard(net, make_local_communicator(), o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  model.forward(torch::randn({2, 7})).sum().backward();
  opt.step();
  save_full(*model, d + "/model.safetensors");
  save_full_optim(*model, opt, d + "/optim.safetensors");
  auto expect_error = [&](torch::optim::Optimizer& o2, const std::string& path, const std::string& what) {
    const size_t before = o2.state().size();
    try {
      load_full_optim(*model, o2, path);
      ADD_FAILURE() << "expected an error loading " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(o2.state().size(), before) << "a failed load changed the optimizer";
  };
  torch::optim::AdamW fresh(model->parameters(), torch::optim::AdamWOptions(1e-3));
  expect_error(fresh, d + "/model.safetensors", "is not a consolidated optimizer file");
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  expect_error(sgd, d + "/optim.safetensors", "holds adamw optimizer state, but the optimizer given is sgd");
  expect_error(fresh, d + "/missing.safetensors", "missing.safetensors");
  // A good load restores the state exactly.
  load_full_optim(*model, fresh, d + "/optim.safetensors");
  ASSERT_EQ(fresh.state().size(), opt.state().size());
  for (auto& [key, st] : opt.state()) {
    auto& a = static_cast<torch::optim::AdamWParamState&>(*st);
    auto& b = static_cast<torch::optim::AdamWParamState&>(*fresh.state().at(key));
    EXPECT_EQ(a.step(), b.step());
    EXPECT_TRUE(torch::equal(a.exp_avg(), b.exp_avg()));
    EXPECT_TRUE(torch::equal(a.exp_avg_sq(), b.exp_avg_sq()));
  }
  fs::remove_all(d);
}

// --- Background saves (CheckpointOptions::async) ---------------------------------

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The snapshot is what is written: two more steps change every shard while a
// throttled background write goes on, and the checkpoint is byte for byte the
// synchronous one, and resumes bitwise; the snapshot copied by the save's
// thread (the default) and by the call. N = 3 (uneven shards).
class BackgroundSnapshot : public ::testing::TestWithParam<std::string> {};

TEST_P(BackgroundSnapshot, WritesTheSnapshotWhileTrainingChangesTheShards) {
  const std::string phase = GetParam();
  auto d = tmpdir(phase.c_str());
  run_ok(3, {"straight", "10", d + "/unused", d + "/straight.safetensors"});
  run_ok(3, {"first", "10", d + "/sync", ""});
  auto r = run_ranks(3, "core_resume", {phase, "10", d + "/async", ""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "OVERLAPPED 1").size(), 3u) << "the steps should end before the write\n" << r.output;
  const auto committed = lines_with(r.output, "COMMITTED " + d + "/async/step-000005 bytes=");
  ASSERT_EQ(committed.size(), 3u) << r.output;
  for (auto& line : committed) {
    EXPECT_EQ(line.find(" C=0"), std::string::npos) << "the ledger's C: " << line;
    const auto at = line.find(" snapshot_wait=");
    ASSERT_NE(at, std::string::npos) << line;
    const double waited = std::stod(line.substr(at + 15));
    // Copied on the thread, the wait depends on timing: the line only has to carry it.
    if (phase == "first_async_caller") EXPECT_EQ(waited, 0.0) << "the call copied it: " << line;
  }
  int files = 0;
  for (auto& e : fs::directory_iterator(d + "/sync/step-000005")) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(file_bytes(e.path().string()), file_bytes(d + "/async/step-000005/" + name)) << name;
    ++files;
  }
  EXPECT_EQ(files, 4) << "metadata.json and three shard files";
  EXPECT_TRUE(ckpt::verify_checkpoint(d + "/async/step-000005").empty());
  run_ok(3, {"second", "10", d + "/async", d + "/resumed.safetensors"});
  bool bitwise = false;
  max_rel_diff(d + "/straight.safetensors", d + "/resumed.safetensors", &bitwise);
  EXPECT_TRUE(bitwise) << "10 straight steps != 5 + background save + load + 5";
  fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(StateDict, BackgroundSnapshot, ::testing::Values("first_async", "first_async_caller"),
                         [](const auto& info) { return info.param == "first_async" ? "OnThread" : "InCaller"; });

// The snapshot copied on the save's thread: parameters changed in place
// before it was waited for fail the save on every rank, naming the tensor,
// and the previous checkpoint stays latest; changed after wait_for_snapshot,
// the checkpoint holds the values at the save.
TEST(StateDict, AChangeBeforeTheSnapshotIsCopiedFailsTheSaveAndNamesTheTensor) {
  auto d = tmpdir("async-changed");
  auto r = run_ranks(2, "core_async_changed", {d});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto errors = lines_with(r.output, "ERROR the background save of " + d + "/step-000002 failed: ");
  ASSERT_EQ(errors.size(), 2u) << r.output;
  EXPECT_GE(lines_with(r.output, " was copying it (version ").size(), 1u) << r.output;
  for (auto& e : errors) EXPECT_NE(e.find("previous checkpoint is intact"), std::string::npos) << e;
  const auto named = lines_with(r.output, "changed while the background save of " + d + "/step-000002");
  ASSERT_GE(named.size(), 1u) << r.output;
  EXPECT_NE(named[0].find("fsdp::wait_for_snapshot"), std::string::npos) << named[0];
  EXPECT_FALSE(fs::exists(d + "/step-000002")) << "nothing of the failed save";
  EXPECT_EQ(lines_with(r.output, "SAVED " + d + "/step-000003").size(), 2u) << r.output;
  EXPECT_EQ(lines_with(r.output, "SNAPSHOT exact").size(), 2u) << r.output;
  EXPECT_EQ(ckpt::resolve_checkpoint(d), d + "/step-000003");
  EXPECT_TRUE(ckpt::verify_checkpoint(d + "/step-000003").empty());
  fs::remove_all(d);
}

// One save at a time: a save after a background one finds it committed; a
// background save that fails says so to whoever waits, on every rank, and
// one nobody waited for is printed when the model goes.
TEST(StateDict, BackgroundSavesGoOneAtATimeAndTheirErrorsReachTheCaller) {
  auto d = tmpdir("async-order");
  auto r = run_ranks(2, "core_async_order", {d});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_with(r.output, "WAITED").size(), 2u) << r.output;
  EXPECT_EQ(lines_with(r.output, "NONE").size(), 2u) << r.output;
  EXPECT_EQ(lines_with(r.output, "RETURNED in_background=1").size(), 2u) << r.output;
  const auto errors = lines_with(r.output, "ERROR the background save of " + d + "/not-a-dir/ck/step-000003 failed: ");
  ASSERT_EQ(errors.size(), 2u) << r.output;
  for (auto& e : errors) EXPECT_NE(e.find("the previous checkpoint is intact"), std::string::npos) << e;
  EXPECT_EQ(lines_with(r.output, "fsdp: the background save of " + d +
                                      "/not-a-dir/ck/step-000004 failed and nobody waited for it: ").size(),
            2u)
      << r.output;
  fs::remove_all(d);
}

// A rank killed in the middle of its background write: the previous
// checkpoint stays `latest` and whole, the next run resumes from it, and its
// next save clears what the killed one left.
TEST(StateDict, AKillDuringABackgroundWriteLeavesThePreviousCheckpoint) {
  auto d = tmpdir("async-kill");
  auto r = run_ranks(2, "core_async_kill", {d + "/ck"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  ASSERT_EQ(lines_with(r.output, "[rank 1] KILLING rank 1 while " + d + "/ck/.tmp-step-000002/rank-00001-of-00002.safetensors.tmp is partial").size(), 1u)
      << r.output;
  EXPECT_EQ(lines_with(r.output, "NOT KILLED").size(), 0u) << r.output;
  EXPECT_TRUE(fs::exists(d + "/ck/.tmp-step-000002")) << "the interrupted write";
  EXPECT_FALSE(fs::exists(d + "/ck/step-000002"));
  EXPECT_EQ(ckpt::resolve_checkpoint(d + "/ck"), d + "/ck/step-000001");
  EXPECT_TRUE(ckpt::verify_checkpoint(d + "/ck/step-000001").empty());
  auto resumed = run_ranks(2, "core_resume", {"second", "4", d + "/ck", d + "/out.safetensors"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(lines_with(resumed.output, "RESUMED step=1 from world 2").size(), 2u) << resumed.output;
  run_ok(2, {"first", "4", d + "/ck", ""});  // saves step 2 again
  EXPECT_FALSE(fs::exists(d + "/ck/.tmp-step-000002")) << "a later save clears the leftovers";
  EXPECT_EQ(ckpt::resolve_checkpoint(d + "/ck"), d + "/ck/step-000002");
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

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
