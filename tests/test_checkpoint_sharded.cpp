// fsdp-cpp tests: sharded checkpoints with N ranks as threads — round trips,
// resharding, `latest` / keep_last, and every fault leaving destinations
// untouched on every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "checkpoint/crc32c.h"
#include "fsdp/checkpoint.h"
#include "test_checkpoint_util.h"
#include "test_util.h"

namespace fsdp::ckpt {
namespace FSDP_TEST_ID {
using testing::fsdp_slices;
using testing::make_param_set;
using testing::Param;
using testing::run_threads;

// Removed when the test ends (fsdp::testing::temp_dir).
std::string tmpdir(const std::string& tag) { return fsdp::testing::temp_dir("ckpt-" + tag); }
using fsdp::testing::slurp;
void spit(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

// Adam-like optimizer state: two tensors per parameter, other values.
std::vector<Param> optim_of(const std::vector<Param>& model) {
  std::vector<Param> out;
  for (auto& p : model) {
    out.push_back({p.name + "/exp_avg", p.full * 2 + 1});
    out.push_back({p.name + "/exp_avg_sq", p.full * p.full});
  }
  return out;
}

void save_at(const std::string& root, int world, int64_t step, const std::vector<Param>& model, int keep_last = 0) {
  auto optim = optim_of(model);
  auto errs = run_threads(world, [&](Communicator& c) {
    SaveOptions o;
    o.keep_last = keep_last;
    o.strategy = "FULL_SHARD";
    save_sharded(c, root, step, fsdp_slices(model, c.rank(), c.world_size()),
                 fsdp_slices(optim, c.rank(), c.world_size()), {{"step", step}, {"data_pos", step * 10}}, o);
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(errs[r], "") << "rank " << r;
}

// Loads at `world` into zeroed FSDP-layout destinations; checks values.
void load_and_check(const std::string& path, int world, int64_t want_step, const std::vector<Param>& model) {
  auto optim = optim_of(model);
  auto errs = run_threads(world, [&](Communicator& c) {
    auto ms = fsdp_slices(model, c.rank(), world, true);
    auto os = fsdp_slices(optim, c.rank(), world, true);
    auto r = load_sharded(c, path, ms, os);
    EXPECT_TRUE(r.found);
    EXPECT_EQ(r.step, want_step);
    EXPECT_EQ(r.train_state["data_pos"], want_step * 10);
    testing::expect_slices_equal(ms, model);
    testing::expect_slices_equal(os, optim);
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(errs[r], "") << "rank " << r;
}

// Loads expecting failure on every rank; destinations must stay zero.
std::vector<std::string> load_expect_fail(const std::string& path, int world, const std::vector<Param>& model,
                                          const std::vector<Param>& optim, LoadOptions opts = {}) {
  auto errs = run_threads(world, [&](Communicator& c) {
    auto ms = fsdp_slices(model, c.rank(), world, true);
    auto os = fsdp_slices(optim, c.rank(), world, true);
    try {
      load_sharded(c, path, ms, os, opts);
    } catch (...) {
      for (auto& s : ms) EXPECT_EQ(s.data.count_nonzero().item<int64_t>(), 0) << "touched " << s.name;
      for (auto& s : os) EXPECT_EQ(s.data.count_nonzero().item<int64_t>(), 0) << "touched " << s.name;
      throw;
    }
  });
  for (int r = 0; r < world; ++r) EXPECT_NE(errs[r], "") << "rank " << r << " did not fail";
  return errs;
}

bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  for (auto& s : v)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

class CheckpointRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointRoundTrip, SameWorldSize) {
  int n = GetParam();
  auto root = tmpdir("rt" + std::to_string(n));
  auto model = make_param_set();
  save_at(root, n, 7, model);
  load_and_check(root, n, 7, model);
  load_and_check(root + "/step-000007", n, 7, model);  // a checkpoint dir works too
  auto info = read_info(root);
  EXPECT_EQ(info.world_size, n);
  EXPECT_EQ(info.strategy, "FULL_SHARD");
  EXPECT_EQ(info.step, 7);
  EXPECT_TRUE(verify_checkpoint(root).empty());
}
INSTANTIATE_TEST_SUITE_P(WorldSizes, CheckpointRoundTrip, ::testing::Values(1, 2, 3, 4));

TEST(CheckpointSharded, Reshard4To3To1To2) {
  auto base = tmpdir("reshard");
  auto model = make_param_set();
  save_at(base + "/a", 4, 1, model);
  load_and_check(base + "/a", 3, 1, model);
  // Chain: what 3 ranks loaded, they save; 1 rank loads that, and so on.
  int chain[] = {4, 3, 1, 2};
  std::string prev = base + "/a";
  for (int i = 1; i < 4; ++i) {
    int w = chain[i];
    std::string next = base + "/c" + std::to_string(i);
    auto optim = optim_of(model);
    auto errs = run_threads(w, [&](Communicator& c) {
      auto ms = fsdp_slices(model, c.rank(), w, true);
      auto os = fsdp_slices(optim, c.rank(), w, true);
      auto r = load_sharded(c, prev, ms, os);
      save_sharded(c, next, r.step + 1, ms, os, r.train_state);
    });
    for (auto& e : errs) ASSERT_EQ(e, "");
    prev = next;
  }
  auto optim = optim_of(model);
  auto errs = run_threads(2, [&](Communicator& c) {
    auto ms = fsdp_slices(model, c.rank(), 2, true);
    auto os = fsdp_slices(optim, c.rank(), 2, true);
    auto r = load_sharded(c, prev, ms, os);
    EXPECT_EQ(r.saved_world_size, 2);
    EXPECT_EQ(r.step, 4);
    testing::expect_slices_equal(ms, model);
    testing::expect_slices_equal(os, optim);
  });
  for (auto& e : errs) ASSERT_EQ(e, "");
}

TEST(CheckpointSharded, ReshardReadsOnlyOverlappingBytes) {
  auto root = tmpdir("partial");
  // One big tensor: at 4 ranks each reads ~1/4 of the file (plus chunk rounding).
  std::vector<Param> model = {{"big", torch::arange(0, 4 << 20, torch::kFloat32)}};
  auto errs = run_threads(1, [&](Communicator& c) {
    save_sharded(c, root, 1, fsdp_slices(model, 0, 1), {}, nlohmann::json::object());
  });
  ASSERT_EQ(errs[0], "");
  std::vector<int64_t> bytes(4);
  errs = run_threads(4, [&](Communicator& c) {
    auto ms = fsdp_slices(model, c.rank(), 4, true);
    std::vector<Slice> none;
    bytes[c.rank()] = load_sharded(c, root, ms, none).bytes_read;
    testing::expect_slices_equal(ms, model);
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(errs[r], "");
    EXPECT_LE(bytes[r], (4 << 20) + 3 * (1 << 20)) << "rank " << r << " read more than its quarter";
  }
}

TEST(CheckpointSharded, LatestAndKeepLast) {
  auto root = tmpdir("keep");
  auto model = make_param_set();
  for (int s = 1; s <= 5; ++s) save_at(root, 2, s, model, /*keep_last=*/2);
  EXPECT_EQ(slurp(root + "/latest"), "step-000005\n");
  EXPECT_FALSE(std::ifstream(root + "/step-000003/metadata.json").good());
  EXPECT_TRUE(std::ifstream(root + "/step-000004/metadata.json").good());
  load_and_check(root, 3, 5, model);
  // Saving the same step again replaces it.
  save_at(root, 2, 5, make_param_set(torch::kFloat32, 1), 2);
  load_and_check(root, 2, 5, make_param_set(torch::kFloat32, 1));
}

TEST(CheckpointSharded, EmptyRootIsNoneAndMissingPathIsAnError) {
  auto root = tmpdir("none");
  auto model = make_param_set();
  auto errs = run_threads(2, [&](Communicator& c) {
    auto ms = fsdp_slices(model, c.rank(), 2, true);
    std::vector<Slice> os;
    auto r = load_sharded(c, root, ms, os);
    EXPECT_FALSE(r.found);
  });
  for (auto& e : errs) EXPECT_EQ(e, "");
  errs = load_expect_fail(root + "/does-not-exist", 2, model, {});
  EXPECT_TRUE(any_contains(errs, "does not exist"));
}

TEST(CheckpointSharded, InterruptedSaveLeavesPreviousLoadable) {
  auto root = tmpdir("interrupted");
  auto model = make_param_set();
  save_at(root, 2, 3, model);
  // What a kill after step 2 / step 4 of the write path leaves behind.
  std::system(("mkdir -p " + root + "/.tmp-step-000004 && cp " + root + "/step-000003/rank-00000-of-00002.safetensors " +
               root + "/.tmp-step-000004/").c_str());
  load_and_check(root, 2, 3, model);
  std::system(("cp -r " + root + "/step-000003 " + root + "/step-000004").c_str());
  std::string note;
  EXPECT_EQ(resolve_checkpoint(root, &note), root + "/step-000003");  // latest still rules
  // `latest` damaged or pointing nowhere: the newest complete dir.
  spit(root + "/latest", "step-000009\n");
  EXPECT_EQ(resolve_checkpoint(root, &note), root + "/step-000004");
  EXPECT_NE(note.find("not a complete checkpoint"), std::string::npos);
  // The next save cleans the leftovers.
  save_at(root, 2, 5, model);
  EXPECT_FALSE(std::ifstream(root + "/.tmp-step-000004/rank-00000-of-00002.safetensors").good());
}

TEST(CheckpointSharded, FlippedByteIsDetectedAndNothingLoaded) {
  auto root = tmpdir("flip");
  auto model = make_param_set();
  save_at(root, 2, 1, model);
  std::string f = root + "/step-000001/rank-00001-of-00002.safetensors";
  std::string bytes = slurp(f);
  bytes[bytes.size() - 3] ^= 0x10;  // in the data of the last tensor
  spit(f, bytes);
  // Named directly (a root falls back to an older checkpoint, and with none
  // left says every one is damaged: tests/test_resume_fallback.cpp).
  auto errs = load_expect_fail(root + "/step-000001", 3, model, optim_of(model));
  EXPECT_TRUE(any_contains(errs, "checksum mismatch")) << errs[0];
  EXPECT_TRUE(any_contains(errs, "rank-00001-of-00002.safetensors"));
  EXPECT_TRUE(any_contains(errs, "failed on rank(s)")) << "ranks that read clean bytes must say who failed";
  // Through the root: the one checkpoint is damaged, and every rank says so.
  errs = load_expect_fail(root, 3, model, optim_of(model));
  for (auto& e : errs) EXPECT_NE(e.find("every one is damaged: step-000001"), std::string::npos) << e;
  EXPECT_FALSE(verify_checkpoint(root).empty());
  // A flipped byte in the header.
  bytes = slurp(f);
  bytes[bytes.size() - 3] ^= 0x10;
  bytes[20] ^= 0x01;
  spit(f, bytes);
  errs = load_expect_fail(root, 2, model, optim_of(model));
  EXPECT_TRUE(any_contains(errs, "checksum mismatch")) << errs[0];
}

TEST(CheckpointSharded, TruncatedFile) {
  auto root = tmpdir("trunc");
  auto model = make_param_set();
  save_at(root, 2, 1, model);
  std::string f = root + "/step-000001/rank-00000-of-00002.safetensors";
  std::string bytes = slurp(f);
  spit(f, bytes.substr(0, bytes.size() - 100));
  auto errs = load_expect_fail(root, 2, model, optim_of(model));
  EXPECT_TRUE(any_contains(errs, "truncated")) << errs[0];
  auto faults = verify_checkpoint(root);
  ASSERT_FALSE(faults.empty());
  EXPECT_NE(faults[0].find("truncated"), std::string::npos);
}

TEST(CheckpointSharded, MetadataDamageAndWrongVersion) {
  auto root = tmpdir("meta");
  auto model = make_param_set();
  save_at(root, 2, 1, model);
  std::string mp = root + "/step-000001/metadata.json";
  std::string orig = slurp(mp);
  std::string s = orig;
  auto pos = s.find("\"shape\": [\n    13");
  if (pos == std::string::npos) pos = s.find("13");
  s[s.find("13", pos)] = '2';  // a digit: still valid JSON
  spit(mp, s);
  auto errs = load_expect_fail(root, 2, model, {});
  EXPECT_TRUE(any_contains(errs, "metadata.json': checksum mismatch")) << errs[0];

  s = orig;
  s.replace(s.find("\"format_version\": 1"), 19, "\"format_version\": 7");
  spit(mp, s);
  errs = load_expect_fail(root, 2, model, {});
  EXPECT_TRUE(any_contains(errs, "format version 7 is not supported")) << errs[0];

  spit(mp, orig.substr(0, orig.size() / 2));
  errs = load_expect_fail(root, 2, model, {});
  EXPECT_TRUE(any_contains(errs, "not a valid JSON object")) << errs[0];
}

// Integers read from metadata.json that become ints (rank, world size, file
// index, format version) are range-checked: 2^32 + 1 must not wrap to 1. Each
// case re-signs the damaged JSON, so it is the range check that answers.
TEST(CheckpointSharded, MetadataIntegersOutOfRangeAreRejected) {
  auto root = tmpdir("meta_range");
  auto model = make_param_set();
  save_at(root, 2, 1, model);
  const std::string mp = root + "/step-000001/metadata.json";
  const auto orig = nlohmann::json::parse(slurp(mp));
  auto resigned = [](nlohmann::json j) {
    j.erase("checksum");
    std::string body = j.dump();
    j["checksum"] = detail::crc32c_hex(detail::crc32c(body.data(), body.size()));
    return j.dump(1);
  };
  const std::string first_tensor = orig["tensors"]["model"].begin().key();
  const uint64_t wrap1 = (uint64_t(1) << 32) + 1;  // static_cast<int> would give 1
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> damage;
    std::string want;
  };
  std::vector<Case> cases = {
      {"world_size 2^32+2", [&](auto& j) { j["world_size"] = wrap1 + 1; }, "field \"world_size\" expected an integer in [1, "},
      {"world_size -1", [&](auto& j) { j["world_size"] = -1; }, "field \"world_size\" expected an integer in [1, "},
      {"format_version 2^32+1", [&](auto& j) { j["format_version"] = wrap1; }, "field \"format_version\" expected an integer in [0, 2147483647], found 4294967297"},
      {"file rank 2^32+1", [&](auto& j) { j["files"][1]["rank"] = wrap1; }, "files[1]: field \"rank\" expected an integer in [0, "},
      {"file rank >= world", [&](auto& j) { j["files"][1]["rank"] = 2; }, "files[1]: field \"rank\" expected an integer in [0, 1], found 2"},
      {"file rank -1", [&](auto& j) { j["files"][0]["rank"] = -1; }, "files[0]: field \"rank\" expected an integer in [0, "},
      {"piece file 2^32+1", [&](auto& j) { j["tensors"]["model"][first_tensor]["pieces"][0]["file"] = wrap1; },
       "field \"file\" expected an integer in [0, 1], found 4294967297"},
      {"piece file -1", [&](auto& j) { j["tensors"]["model"][first_tensor]["pieces"][0]["file"] = -1; },
       "field \"file\" expected an integer in [0, 1], found -1"},
      {"step 2^64-1", [&](auto& j) { j["step"] = ~uint64_t(0); }, "field \"step\" expected an integer in [0, "},
      {"step -5", [&](auto& j) { j["step"] = -5; }, "field \"step\" expected an integer in [0, "},
      {"bytes 2^64-1", [&](auto& j) { j["files"][0]["bytes"] = ~uint64_t(0); }, "field \"bytes\" expected a 64-bit signed integer"},
  };
  for (auto& c : cases) {
    auto j = orig;
    c.damage(j);
    spit(mp, resigned(j));
    auto errs = load_expect_fail(root, 2, model, {});
    EXPECT_TRUE(any_contains(errs, "metadata.json': ")) << c.what << ": " << errs[0];
    EXPECT_TRUE(any_contains(errs, c.want)) << c.what << ": " << errs[0];
    EXPECT_TRUE(any_contains(errs, "use another checkpoint")) << c.what << ": " << errs[0];
    auto faults = verify_checkpoint(root);
    EXPECT_FALSE(faults.empty()) << c.what;
  }
  spit(mp, resigned(orig));  // the re-signing itself is sound
  load_and_check(root, 2, 1, model);
}

TEST(CheckpointSharded, MismatchedModelsEachGiveTheirMessage) {
  auto root = tmpdir("mismatch");
  auto model = make_param_set();
  save_at(root, 4, 2, model);

  auto missing = model;
  missing.push_back({"extra.weight", torch::ones({4})});
  auto errs = load_expect_fail(root, 3, missing, {});
  EXPECT_TRUE(any_contains(errs, "missing: 'extra.weight'")) << errs[0];
  EXPECT_TRUE(any_contains(errs, "saved at world size 4 with FULL_SHARD; loading at world size 3")) << errs[0];
  EXPECT_TRUE(any_contains(errs, "from another model")) << errs[0];

  auto fewer = model;
  fewer.pop_back();
  errs = load_expect_fail(root, 2, fewer, {});
  EXPECT_TRUE(any_contains(errs, "unexpected model tensor(s)")) << errs[0];
  EXPECT_TRUE(any_contains(errs, "'head.weight'"));
  // Non-strict: the rest loads.
  auto ok = run_threads(2, [&](Communicator& c) {
    auto ms = fsdp_slices(fewer, c.rank(), 2, true);
    std::vector<Slice> os;
    LoadOptions o;
    o.strict = false;
    load_sharded(c, root, ms, os, o);
    testing::expect_slices_equal(ms, fewer);
  });
  for (auto& e : ok) EXPECT_EQ(e, "");

  auto reshaped = model;
  reshaped[1].full = reshaped[1].full.reshape({5, 7});
  errs = load_expect_fail(root, 2, reshaped, {});
  EXPECT_TRUE(any_contains(errs, "'blocks.0.fc.weight': checkpoint has shape [7, 5], this model expects [5, 7]"))
      << errs[0];

  auto bf16 = make_param_set(torch::kBFloat16);
  errs = load_expect_fail(root, 2, bf16, {});
  EXPECT_TRUE(any_contains(errs, "checkpoint has dtype F32, this model expects BF16")) << errs[0];
  auto cast = run_threads(2, [&](Communicator& c) {
    auto ms = fsdp_slices(bf16, c.rank(), 2, true);
    std::vector<Slice> os;
    LoadOptions o;
    o.allow_dtype_cast = true;
    load_sharded(c, root, ms, os, o);
    testing::expect_slices_equal(ms, bf16);  // values were made in f64 then cast: same rounding
  });
  for (auto& e : cast) EXPECT_EQ(e, "");

  // Optimizer section wanted but different names.
  auto errs2 = load_expect_fail(root, 2, model, {{"fc.weight/momentum", torch::ones({3})}});
  EXPECT_TRUE(any_contains(errs2, "optim tensor(s) this model expects are missing")) << errs2[0];
}

TEST(CheckpointSharded, BadSlicesFailBeforeWritingAnything) {
  auto root = tmpdir("badslice");
  auto model = make_param_set();
  auto errs = run_threads(2, [&](Communicator& c) {
    auto ms = fsdp_slices(model, c.rank(), 2);
    if (c.rank() == 1) ms.back().hi -= 1;  // data has one element more than the slice
    save_sharded(c, root, 1, ms, {}, {});
  });
  EXPECT_NE(errs[1].find("expects 32 elements of data, found 33"), std::string::npos) << errs[1];
  EXPECT_NE(errs[0].find("failed on rank(s) 1"), std::string::npos) << errs[0];
  EXPECT_FALSE(std::ifstream(root + "/latest").good());
  // A tensor nobody holds completely.
  errs = run_threads(2, [&](Communicator& c) {
    auto ms = fsdp_slices(model, c.rank(), 2);
    if (c.rank() == 0) ms[0] = Slice{ms[0].name, ms[0].full_shape, ms[0].dtype, ms[0].lo, ms[0].lo, {}};
    save_sharded(c, root, 1, ms, {}, {});
  });
  EXPECT_NE(errs[0].find("held by no rank"), std::string::npos) << errs[0];
  EXPECT_FALSE(std::ifstream(root + "/latest").good());
}

TEST(CheckpointSharded, ConvertToFullAndOfflineReshard) {
  auto base = tmpdir("convert");
  auto model = make_param_set();
  save_at(base + "/src", 3, 6, model);
  convert_to_full(base + "/src", base + "/full.safetensors");
  SafetensorsReader r(base + "/full.safetensors");
  for (auto& p : model) EXPECT_TRUE(torch::equal(r.read_all(p.name), p.full)) << p.name;
  // Full file -> FSDP slices at 2 ranks.
  auto errs = run_threads(2, [&](Communicator& c) {
    auto ms = fsdp_slices(model, c.rank(), 2, true);
    load_full_safetensors(c, base + "/full.safetensors", ms);
    testing::expect_slices_equal(ms, model);
  });
  for (auto& e : errs) EXPECT_EQ(e, "");
  std::string out = reshard_offline(base + "/src", 5, base + "/dst");
  EXPECT_EQ(read_info(out).world_size, 5);
  EXPECT_TRUE(verify_checkpoint(base + "/dst").empty());
  load_and_check(base + "/dst", 2, 6, model);
}

TEST(CheckpointSharded, FullSafetensorsLoadIsAllOrNothing) {
  auto base = tmpdir("fullbad");
  auto model = make_param_set();
  std::vector<TensorSpec> specs;
  for (auto& p : model) specs.push_back({p.name, p.full.sizes().vec(), p.full.scalar_type()});
  size_t k = 0;
  write_full_safetensors(base + "/m.safetensors", specs, [&](const TensorSpec&) { return model[k++].full; });
  auto reshaped = model;
  reshaped.back().full = reshaped.back().full.reshape({11, 3});
  auto errs = run_threads(3, [&](Communicator& c) {
    auto ms = fsdp_slices(reshaped, c.rank(), 3, true);
    try {
      load_full_safetensors(c, base + "/m.safetensors", ms);
    } catch (...) {
      for (auto& s : ms) EXPECT_EQ(s.data.count_nonzero().item<int64_t>(), 0);
      throw;
    }
  });
  for (auto& e : errs) EXPECT_NE(e.find("checkpoint has shape [3, 11], this model expects [11, 3]"), std::string::npos) << e;
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::ckpt
