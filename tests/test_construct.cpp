// Sharded construction (fsdp::DeferredInit + FsdpOptions::param_init): a model
// built without memory, each unit initialised by name and sharded at once;
// initial weights that do not depend on the world size or the construction;
// --init into shards; the memory budget from process start.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "fsdp/fsdp.h"
#include "proc_status.h"
#include "test_util.h"

using fsdp::testing::bin_path;
using fsdp::testing::lines_with;
using fsdp::testing::parse_kv;
using fsdp::testing::run_command;

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;
using namespace fsdp;

using fsdp::testing::temp_dir;

int64_t vm_rss() { return fsdp::testing::status_bytes("VmRSS"); }  // bytes resident now

using fsdp::testing::slurp;

// A text the gpt trainer can read (--text): enough bytes for a few rows.
std::string write_text(const std::string& dir) {
  std::string t;
  for (int i = 0; i < 400; i++) t += "the quick brown fox " + std::to_string(i) + " jumps over the lazy dog\n";
  std::ofstream(dir + "/t.txt") << t;
  return dir + "/t.txt";
}

// A small GPT under `fsdp run -n N`.
fsdp::testing::ProcResult gpt_run(int n, const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {bin_path("fsdp"), "run", "-n", std::to_string(n), "--", bin_path("gpt"),
                                   "--threads", "1", "--no-progress", "--log-every", "1", "--eval-every", "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, env, 180);
}

// The output layer reuses the embedding's weight (tied) and adds its own bias.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(torch::Tensor w) {
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", torch::zeros({w.size(0)}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(TiedHead);

// Linear + Embedding + LayerNorm + BatchNorm (buffers), a weight tied
// between two modules, and tensors smaller than the world size.
struct TinyImpl : torch::nn::Module {
  TinyImpl() {
    emb = register_module("emb", torch::nn::Embedding(11, 6));
    a = register_module("a", torch::nn::Linear(6, 7));
    bn = register_module("bn", torch::nn::BatchNorm1d(7));
    b = register_module("b", torch::nn::Linear(7, 6));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
    small = register_module("small", torch::nn::Linear(2, 1));  // 2 + 1 elements
    head = register_module("head", TiedHead(emb->weight));  // tied: one tensor, two names
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    auto x = emb(idx);                                              // [B,6]
    x = fsdp::call(b, torch::relu(bn(fsdp::call(a, x))));          // [B,6]; a, b may be units
    x = ln(x) + small(x.narrow(1, 0, 2));                           // [B,6]
    return head(x);                                                 // [B,11]
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear a{nullptr}, b{nullptr}, small{nullptr};
  TiedHead head{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(Tiny);

// default_param_init for what it knows; the tied head's own bias starts at 0.
ParamInit tiny_init(uint64_t seed) {
  ParamInit base = default_param_init(seed);
  return [base](const InitTarget& t, torch::Tensor& v) {
    if (t.name == "head.bias") return void(v.zero_());
    base(t, v);
  };
}

// ------------------------------------------------------------ one process

TEST(DeferredInit, ConstructsShapesWithoutMemory) {
  ASSERT_TRUE(memory::installed());
  const int64_t held0 = memory::stats().current, rss0 = vm_rss(), alive0 = deferred_blocks_alive();
  torch::nn::Sequential seq{nullptr};
  int64_t deferred_bytes = 0;
  {
    DeferredInit d;
    seq = torch::nn::Sequential();
    for (int i = 0; i < 8; i++) seq->push_back(torch::nn::Linear(1024, 1024));  // 32 MiB + biases
    deferred_bytes = d.bytes();
    EXPECT_EQ(d.tensors(), 16);
  }
  EXPECT_EQ(deferred_bytes, 8 * (1024 * 1024 + 1024) * 4);
  EXPECT_LT(memory::stats().current - held0, 64 * 1024) << "deferred tensors hold no counted bytes";
  EXPECT_LT(vm_rss() - rss0, 12ll << 20) << "resident: about one tensor (4 MiB), not the model (32 MiB)";
  for (auto& p : seq->parameters()) EXPECT_TRUE(is_deferred(p));
  EXPECT_EQ(seq->parameters()[0].sizes().vec(), (std::vector<int64_t>{1024, 1024}));
  EXPECT_EQ(deferred_blocks_alive() - alive0, 16);

  // Outside the scope this thread allocates normally.
  auto t = torch::ones({1000});
  EXPECT_FALSE(is_deferred(t));

  initialize(*seq, default_param_init(7));
  for (auto& p : seq->parameters()) EXPECT_FALSE(is_deferred(p));
  EXPECT_EQ(deferred_blocks_alive(), alive0);
  const double bound = 1.0 / std::sqrt(1024.0);
  auto w = seq->parameters()[0];
  EXPECT_LE(w.abs().max().item<double>(), bound);
  EXPECT_GT(w.abs().max().item<double>(), 0.9 * bound) << "U(-1/sqrt(in), 1/sqrt(in)), not zeros";
}

TEST(ParamInit, ValuesDependOnSeedAndNameOnly) {
  auto make = [](uint64_t seed) {
    torch::nn::Sequential s(torch::nn::Linear(5, 3), torch::nn::Embedding(4, 3), torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})));
    initialize(*s, default_param_init(seed));
    return s;
  };
  torch::manual_seed(1);
  auto x = make(42);
  torch::manual_seed(2);  // the global generator plays no part
  auto y = make(42);
  auto z = make(43);
  auto px = x->named_parameters(), py = y->named_parameters(), pz = z->named_parameters();
  for (auto& k : px.keys()) {
    EXPECT_TRUE(px[k].equal(py[k])) << k;
    if (k.find("2.") != 0) EXPECT_FALSE(px[k].equal(pz[k])) << k << " must change with the seed";
  }
  // The stream is the name's: recomputing from init_generator gives the same values.
  auto emb = torch::empty({4, 3});
  emb.normal_(0.0, 1.0, init_generator(42, "1.weight"));
  EXPECT_TRUE(emb.equal(px["1.weight"]));
  EXPECT_TRUE(px["2.weight"].equal(torch::ones({3})));
  EXPECT_TRUE(px["2.bias"].equal(torch::zeros({3})));
  EXPECT_FALSE(px["0.weight"].view(-1).narrow(0, 0, 3).equal(px["0.bias"])) << "each name has its own stream";
}

TEST(ParamInit, UnknownModuleTypesAreNamed) {
  struct GateImpl : torch::nn::Module {
    GateImpl() { g = register_parameter("g", torch::ones({4})); }
    torch::Tensor g;
  };
  struct NetImpl : torch::nn::Module {
    NetImpl() {
      register_module("lin", torch::nn::Linear(2, 2));
      register_module("gate", std::make_shared<GateImpl>());
    }
  };
  NetImpl net;
  try {
    initialize(net, default_param_init(1));
    FAIL() << "expected fsdp::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'gate.g'"), std::string::npos) << m;
    EXPECT_NE(m.find("Fix:"), std::string::npos) << m;
  }
}

// ------------------------------------------------------------ in ranks

// Deferred + param_init equals eager + initialize, bitwise, at N = 3 (uneven
// shards, tensors smaller than N, a tied weight, BatchNorm buffers); no
// deferred block survives the wrap.
TEST(ShardedConstruction, SameStateAsEagerWithTiesBuffersAndTinyTensors) {
  FSDP_IN_RANKS(3);
  auto comm = make_communicator_from_env();
  const int64_t alive0 = deferred_blocks_alive();
  Tiny deferred{nullptr};
  {
    DeferredInit d;
    deferred = Tiny();
  }
  // a and b are units of their own; the tied weight's owners (emb, head) stay in the root.
  const auto policy = WrapPolicy::predicate(
      [](const std::string& name, const torch::nn::Module&, int64_t) { return name == "a" || name == "b"; });
  FsdpOptions o;
  o.wrap = policy;
  o.param_init = tiny_init(99);
  auto a = fully_shard(deferred, comm, o);
  EXPECT_EQ(deferred_blocks_alive(), alive0) << "every deferred tensor got memory of its own";

  Tiny eager;
  initialize(*eager, tiny_init(99));
  FsdpOptions e;
  e.wrap = policy;
  auto b = fully_shard(eager, comm, e);
  auto fa = a->full_state(-1), fb = b->full_state(-1);
  ASSERT_EQ(fa.size(), fb.size());
  for (size_t i = 0; i < fa.size(); i++) {
    EXPECT_EQ(fa[i].first, fb[i].first);
    EXPECT_TRUE(fa[i].second.equal(fb[i].second)) << fa[i].first;
  }
  // BatchNorm's buffers came from the init: zeros, ones, 0.
  for (auto& [k, v] : fa) {
    if (k == "bn.running_var") EXPECT_TRUE(v.equal(torch::ones({7})));
    if (k == "bn.running_mean") EXPECT_TRUE(v.equal(torch::zeros({7})));
  }
  // And it trains like the eager one.
  auto idx = torch::tensor({1, 5, 7, 2}, torch::kLong);
  auto la = a.forward(idx).pow(2).mean(), lb = b.forward(idx).pow(2).mean();
  EXPECT_EQ(la.item<float>(), lb.item<float>());
}

TEST(ShardedConstruction, RanksWhoseInitDisagreesAreNamed) {
  FSDP_IN_RANKS(2);
  auto comm = make_communicator_from_env();
  Tiny net{nullptr};
  {
    DeferredInit d;
    net = Tiny();
  }
  FsdpOptions o;
  // The classic mistake: the global generator, seeded differently per rank.
  torch::manual_seed(comm->rank());
  o.param_init = [](const InitTarget&, torch::Tensor& v) { v.normal_(); };
  try {
    fully_shard(net, comm, o);
    FAIL() << "expected fsdp::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("different values on different ranks"), std::string::npos) << m;
    EXPECT_NE(m.find("init_generator"), std::string::npos) << m;
  }
}

TEST(ShardedConstruction, DeferredWithoutInitIsAnError) {
  FSDP_IN_RANKS(1);
  auto comm = make_communicator_from_env();
  Tiny net{nullptr};
  {
    DeferredInit d;
    net = Tiny();
  }
  try {
    fully_shard(net, comm, FsdpOptions{});
    FAIL() << "expected fsdp::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("DeferredInit"), std::string::npos) << m;
    EXPECT_NE(m.find("param_init"), std::string::npos) << m;
  }
}

// ------------------------------------------------------------ the gpt trainer

const std::vector<std::string> kSmall = {"--dim", "64", "--layers", "2", "--heads", "2", "--seq", "32", "--batch", "2"};
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// `gpt --steps 0 --save F`: bitwise the same file at N = 1..4, eager and
// sharded; and the values are docs/GPT_MINI.md's: by name from the seed.
TEST(ShardedConstruction, InitialWeightsIndependentOfWorldSizeAndConstruction) {
  const std::string d = temp_dir("worlds"), text = write_text(d);
  std::string reference;
  for (int n = 1; n <= 4; n++)
    for (std::string c : {"sharded", "eager"}) {
      const std::string f = d + "/w" + std::to_string(n) + c + ".safetensors";
      auto r = gpt_run(n, with(kSmall, {"--text", text, "--steps", "0", "--construct", c, "--save", f}));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const std::string bytes = slurp(f);
      ASSERT_GT(bytes.size(), 100000u);
      if (reference.empty()) reference = bytes;
      EXPECT_TRUE(bytes == reference) << "N=" << n << " " << c << " differs from N=1 sharded";
    }
  ckpt::SafetensorsReader r(d + "/w1sharded.safetensors");
  auto tok = torch::empty({256, 64});
  tok.normal_(0.0, 1.0, init_generator(1337, "tok.weight"));  // gpt's default --seed
  EXPECT_TRUE(r.read_all("tok.weight").equal(tok));
  auto fc = torch::empty({256, 64});
  fc.uniform_(-1.0 / 8, 1.0 / 8, init_generator(1337, "blocks.1.fc.weight"));
  EXPECT_TRUE(r.read_all("blocks.1.fc.weight").equal(fc));
  EXPECT_TRUE(r.read_all("blocks.0.ln2.weight").equal(torch::ones({64})));
  fs::remove_all(d);
}

// The counting allocator's high-water mark through construction, at N = 3:
// sharded <= P/N + 2 P_block + 1 MiB; eager holds the whole model.
TEST(ShardedConstruction, ConstructionPeakIsShardsPlusAboutOneUnit) {
  const std::string d = temp_dir("peak"), text = write_text(d);
  const std::vector<std::string> cfg = {"--dim", "128", "--layers", "6", "--heads", "4", "--seq", "32", "--batch", "1"};
  const int64_t V = 256, T = 32, D = 128, L = 6;
  const int64_t block = 12 * D * D + 13 * D, root = V * D + T * D + 2 * D + V * D + V;
  const int64_t P = (L * block + root) * 4, P_block = std::max(block, root) * 4;
  for (std::string c : {"sharded", "eager"}) {
    auto r = gpt_run(3, with(cfg, {"--text", text, "--steps", "1", "--construct", c, "--rank-memory"}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto lines = lines_with(r.output, "memory: plan peak");
    ASSERT_EQ(lines.size(), 3u) << r.output;
    for (auto& line : lines) {
      const auto f = parse_kv(line);
      if (c == "sharded") {
        EXPECT_LE(f["construction"], P / 3 + 2 * P_block + (1 << 20)) << line;
      } else {
        EXPECT_GE(f["construction"], P) << line;
      }
      EXPECT_GT(f["vmhwm"], 0) << line;
    }
  }
  fs::remove_all(d);
}

// The planner's process budget holds: `fsdp plan --budget-rss` names the
// --max-memory the tensors get; a run at N = 3 under it stays inside the
// budget on every rank, and each rank's VmHWM is broken into its parts
// (they add up; the unexplained rest is small; the fixed part is within the
// planner's estimate; comm buffers were used: staging at N > 2).
TEST(ProcessMemory, EveryRanksPeakIsBrokenIntoItsPartsAndThePlannersBudgetHolds) {
  const std::string d = temp_dir("rss"), text = write_text(d);
  const std::vector<std::string> shape = {"--dim", "128", "--layers", "6", "--heads", "4", "--seq", "32", "--batch", "1"};
  constexpr long long MiB = 1 << 20, budget = 256 * MiB;
  std::vector<std::string> plan = {bin_path("fsdp"), "plan", "--world", "3", "--strategy", "full", "--budget-rss",
                                   "256MiB", "--json"};
  plan.insert(plan.end(), shape.begin(), shape.end());
  auto p = run_command(plan);
  ASSERT_EQ(p.exit_code, 0) << p.output;
  const auto j = nlohmann::json::parse(p.output);
  ASSERT_TRUE(j["recommendation"]["fits"].get<bool>()) << p.output;
  const long long limit = j["process_budget"]["tensors"].get<long long>();
  const long long planned_fixed = j["process_budget"]["fixed"].get<long long>();
  ASSERT_GT(limit, 0) << p.output;

  auto r = gpt_run(3, with(shape, {"--text", text, "--steps", "2", "--max-memory", std::to_string(limit),
                                   "--rank-memory"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = lines_with(r.output, "memory: plan peak");
  ASSERT_EQ(lines.size(), 3u) << r.output;
  for (auto& line : lines) {
    const auto f = parse_kv(line);
    EXPECT_LE(f["vmhwm"], budget) << "the process passed the budget the planner answered for: " << line;
    EXPECT_EQ(f["vmhwm"], f["at_start"] + f["code_since"] + f["shared"] + f["tensors"] + f["comm"] + f["cache"] +
                              f["malloc_used"] + f["malloc_free"] + f["unexplained"] + f["elsewhere"])
        << "the parts add up to VmHWM: " << line;
    EXPECT_GT(f["at_start"], 16 * MiB) << "libtorch's code and data are resident at start: " << line;
    EXPECT_GT(f["tensors"], 0) << line;
    EXPECT_LE(f["tensors"] + f["comm"] + f["cache"], limit + 64 * 4096) << "the allocator stays in its limit: " << line;
    // The copying path stages reduce-scatter pieces at N = 3; host-shared
    // units (the default here) sum where the gradients lie and stage nothing.
    if (f["shared"] > 0)
      EXPECT_LT(f["comm_high"], 64 << 10) << "host-shared units stage no reduce-scatter pieces: " << line;
    else
      EXPECT_GT(f["comm_high"], 0) << "N = 3 stages reduce-scatter pieces on the communication thread: " << line;
    EXPECT_LE(std::llabs(f["unexplained"]), 16 * MiB) << "the unexplained rest should be small: " << line;
    EXPECT_LE(f["fixed"], planned_fixed) << "the planner's fixed part covers the run's: " << line;
  }
  fs::remove_all(d);
}

// --init with sharded construction: each rank reads its slices only (the
// ranks' bytes add up to the file's tensors once), and the weights are the
// file's; a file of another shape is one clear error before step 1.
TEST(ShardedConstruction, InitReadsOnlyEachRanksSlices) {
  const std::string d = temp_dir("init"), text = write_text(d);
  const std::string src = d + "/src.safetensors", back = d + "/back.safetensors";
  auto r0 = gpt_run(1, with(kSmall, {"--text", text, "--steps", "0", "--seed", "5", "--save", src}));
  ASSERT_EQ(r0.exit_code, 0) << r0.output;
  auto r = gpt_run(3, with(kSmall, {"--text", text, "--steps", "0", "--init", src, "--save", back}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int64_t D = 64, V = 256, T = 32;
  const int64_t P = (2 * (12 * D * D + 13 * D) + V * D + T * D + 2 * D + V * D + V) * 4;
  auto lines = lines_with(r.output, "bytes_read=");
  ASSERT_EQ(lines.size(), 3u) << r.output;
  int64_t sum = 0;
  for (auto& l : lines) {
    const int64_t b = parse_kv(l)["bytes_read"];
    EXPECT_LT(b, P / 2) << "a rank read more than its third: " << l;
    sum += b;
  }
  EXPECT_EQ(sum, P) << "together the ranks read every tensor exactly once";
  EXPECT_TRUE(slurp(back) == slurp(src)) << "the weights are the file's";

  // A file of another model: named, before anything trains.
  const std::string other = d + "/other.safetensors";
  auto r1 = gpt_run(1, {"--dim", "32", "--layers", "2", "--heads", "2", "--seq", "32", "--text", text, "--steps", "0",
                        "--save", other});
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto bad = gpt_run(2, with(kSmall, {"--text", text, "--steps", "2", "--init", other}));
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("shape"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("'tok.weight': checkpoint has shape [256, 32], this model expects [256, 64]"),
            std::string::npos)
      << bad.output;
  EXPECT_TRUE(lines_with(bad.output, "step     1").empty()) << bad.output;
  fs::remove_all(d);
}

// --max-memory covers construction; a run the planner can tell will not fit
// is refused before anything is built, naming the term and what fits.
TEST(ShardedConstruction, BudgetRefusesWhatCannotFitBeforeStepOne) {
  const std::string d = temp_dir("budget"), text = write_text(d);
  const std::vector<std::string> cfg = {"--dim", "128", "--layers", "6", "--heads", "4", "--seq", "32", "--batch", "1"};
  // P = 1.28 M parameters = 4.9 MiB fp32; at N = 2 FULL_SHARD's plan is far below 12 MiB.
  auto eager = gpt_run(2, with(cfg, {"--text", text, "--steps", "1", "--construct", "eager", "--max-memory", "4MiB"}));
  EXPECT_NE(eager.exit_code, 0) << eager.output;
  EXPECT_NE(eager.output.find("eager construction"), std::string::npos) << eager.output;
  EXPECT_NE(eager.output.find("--construct sharded"), std::string::npos) << eager.output;

  auto one = gpt_run(1, with(cfg, {"--text", text, "--steps", "1", "--strategy", "none", "--max-memory", "12MiB"}));
  EXPECT_NE(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("the planner's peak per rank at N=1"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("largest term"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("ranks or more with --strategy full"), std::string::npos) << one.output;
  EXPECT_TRUE(lines_with(one.output, "step ").empty()) << "refused before step 1:\n" << one.output;

  auto ok = gpt_run(2, with(cfg, {"--text", text, "--steps", "1", "--max-memory", "24MiB", "--rank-memory"}));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  const auto peaks = lines_with(ok.output, "memory: plan peak");
  ASSERT_EQ(peaks.size(), 2u) << "one --rank-memory line per rank:\n" << ok.output;
  for (auto& line : peaks) EXPECT_LE(parse_kv(line)["from_start"], 24ll << 20) << line;
  fs::remove_all(d);
}

// load_full into a deferred model: a damaged file is one error on every rank
// and no shard changed; the sound file loads each rank's slices.
TEST(ShardedConstruction, LoadFullIntoADeferredModelIsAllOrNothing) {
  FSDP_IN_RANKS(2);
  auto comm = make_communicator_from_env();
  auto build = [&](uint64_t seed) {
    Tiny net{nullptr};
    {
      DeferredInit d;
      net = Tiny();
    }
    FsdpOptions o;
    o.wrap = WrapPolicy::predicate([](const std::string& n, const torch::nn::Module&, int64_t) { return n == "a"; });
    o.param_init = tiny_init(seed);
    return fully_shard(net, comm, o);
  };
  auto src = build(1);
  const std::string dir = fs::temp_directory_path() / ("fsdp_construct_load_" + std::to_string(::getppid()));
  if (comm->rank() == 0) fs::create_directories(dir);
  comm->barrier()->wait();
  const std::string good = dir + "/good.safetensors", cut = dir + "/cut.safetensors";
  save_full(*src, good);
  if (comm->rank() == 0) {
    const std::string bytes = slurp(good);
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 40);  // the last tensor loses bytes
  }
  comm->barrier()->wait();

  auto dst = build(2);
  auto before = dst->full_state(-1);
  EXPECT_THROW(load_full(*dst, cut), Error);
  auto after = dst->full_state(-1);
  for (size_t i = 0; i < before.size(); i++) EXPECT_TRUE(before[i].second.equal(after[i].second)) << before[i].first;

  const int64_t bytes = load_full(*dst, good);
  EXPECT_GT(bytes, 0);
  auto loaded = dst->full_state(-1), want = src->full_state(-1);
  for (size_t i = 0; i < want.size(); i++) EXPECT_TRUE(loaded[i].second.equal(want[i].second)) << want[i].first;
  comm->barrier()->wait();
  if (comm->rank() == 0) fs::remove_all(dir);
}

}  // namespace FSDP_TEST_ID
