// fsdp-cpp tests: crash consistency of the four writers (the sharded save,
// the background save, the HF export, `fsdp ckpt convert` both ways), proven
// by enumeration rather than argued.
//
// For each writer: one clean run through a FaultInjectionEnv counts its K
// mutating calls (tests/support/fault_injection_env.h); then for every
// k = 1..K the writer runs again from the same start, crashes at its k-th
// mutating call, and the power is cut (what was not synced is lost, data and
// directory entries). After each: loading yields the previous complete
// checkpoint or the new one, bit for bit, never a mix, never an error, and
// never nothing where there was one before; a clean run of the same writer
// then succeeds over what the crash left. A power cut right after a clean
// run must keep the new one. One process, world size 1: deterministic.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "checkpoint/file_io.h"
#include "fault_injection_env.h"
#include "fsdp/checkpoint.h"
#include "fsdp/fsdp.h"
#include "fsdp/hf.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {
namespace fs = std::filesystem;
using Tensors = std::map<std::string, torch::Tensor>;

// Tensors whose values say which save they belong to.
Tensors values(int seed) {
  torch::manual_seed(seed);
  return {{"b", torch::randn({5})}, {"s", torch::randn({2, 2})}, {"w", torch::randn({4, 3})}};
}

std::string describe(const Tensors& got, const std::map<std::string, Tensors>& candidates) {
  std::string s = "loaded values match none of:";
  for (auto& [name, c] : candidates) s += " " + name;
  s += "; tensors:";
  for (auto& [k, v] : got) s += " " + k;
  return s;
}

// Which candidate `got` equals, bit for bit ("" when none).
std::string which(const Tensors& got, const std::map<std::string, Tensors>& candidates) {
  for (auto& [name, c] : candidates) {
    bool same = c.size() == got.size();
    for (auto& [k, v] : c) {
      auto it = got.find(k);
      same = same && it != got.end() && it->second.sizes() == v.sizes() && torch::equal(it->second, v);
    }
    if (same) return name;
  }
  return "";
}

// Replaces what is under `dir` with a copy of `from`'s contents ("" : empty).
void restore(const std::string& dir, const std::string& from) {
  for (auto& e : fs::directory_iterator(dir)) fs::remove_all(e.path());
  if (!from.empty()) fs::copy(from, dir, fs::copy_options::recursive);
}

// The enumeration. `start` puts the folder in the state before the write,
// `write` runs the writer, `check(k)` judges what a crash at k left after the
// power cut (k = 0: no crash); a clean write follows each. `swap`: whether
// the file system swaps two paths atomically (RENAME_EXCHANGE). Returns K.
int64_t enumerate(const std::string& dir, const std::function<void()>& start, const std::function<void()>& write,
                  const std::function<void(int64_t)>& check, bool swap = true) {
  FaultInjectionEnv env(dir);
  env.set_exchange_supported(swap);
  start();
  env.reset();
  {
    fsdp::detail::ScopedEnv use(env);
    write();
  }
  const int64_t K = env.mutations();
  EXPECT_GT(K, 0);
  env.power_cut();  // right after a clean run: the new one stays
  check(0);
  for (int64_t k = 1; k <= K && !::testing::Test::HasFailure(); ++k) {
    start();
    env.reset();
    env.crash_at(k);
    bool crashed = false;
    {
      fsdp::detail::ScopedEnv use(env);
      try {
        write();
      } catch (const SimulatedCrash&) {
        crashed = true;
      }
    }
    EXPECT_TRUE(crashed) << "the writer made fewer than " << k << " mutating calls this time (K = " << K << ")";
    env.power_cut();
    SCOPED_TRACE("crash at mutating call " + std::to_string(k) + " of " + std::to_string(K));
    check(k);
    // The next run of the writer recovers from what the crash left.
    write();
    check(0);
  }
  return K;
}

// ---------------------------------------------------------------------------
// Sharded saves (save_sharded, BackgroundSave) and convert --from-hf: loaded
// with load_sharded at world size 1.

std::vector<ckpt::Slice> slices(const Tensors& t) {
  std::vector<ckpt::Slice> out;
  for (auto& [name, v] : t) out.push_back({name, v.sizes().vec(), torch::kFloat32, 0, v.numel(), v.reshape(-1)});
  return out;
}

// What a load of `root` finds: {"", {}} when there is no checkpoint.
std::pair<bool, Tensors> load_root(const std::string& root, bool with_optim, std::string* error) {
  auto comm = make_local_communicator();
  const Tensors shape = values(0);
  Tensors model, optim;
  for (auto& [k, v] : shape) model[k] = torch::zeros_like(v);
  if (with_optim)
    for (auto& [k, v] : shape) optim[k + "/m"] = torch::zeros_like(v);
  auto ms = slices(model), os = slices(optim);
  try {
    auto r = ckpt::load_sharded(*comm, root, ms, os);
    if (!r.found) return {false, {}};
  } catch (const std::exception& e) {
    *error = e.what();
    return {false, {}};
  }
  Tensors all = model;
  for (auto& [k, v] : optim) all[k] = v;
  return {true, all};
}

Tensors with_optim(const Tensors& model, int seed) {
  Tensors all = model;
  const Tensors o = values(seed + 1000);
  for (auto& [k, v] : o) all[k + "/m"] = v;
  return all;
}

// The previous checkpoint (step 1, seed 1) or the new one (`step`, seed 2)
// after every crash of `save`; K.
int64_t enumerate_sharded_save(const std::string& tag, int64_t step, int keep_last,
                               const std::function<void(const std::string&, int64_t, const Tensors&, const Tensors&,
                                                        const ckpt::SaveOptions&)>& save,
                               bool swap = true) {
  const std::string dir = temp_dir("crash-" + tag), base = temp_dir("crash-" + tag + "-base");
  const std::string root = dir + "/ckpt";
  ckpt::SaveOptions so;
  so.keep_last = keep_last;
  const Tensors m1 = values(1), m2 = values(2), o1 = values(1001), o2 = values(1002);
  save(base + "/ckpt", 1, m1, o1, so);  // the previous checkpoint
  const std::map<std::string, Tensors> both = {{"previous", with_optim(m1, 1)}, {"new", with_optim(m2, 2)}};
  return enumerate(
      dir, [&] { restore(dir, base); }, [&] { save(root, step, m2, o2, so); },
      [&](int64_t k) {
        std::string error;
        auto [found, got] = load_root(root, true, &error);
        ASSERT_TRUE(found) << "the previous checkpoint is lost" << (error.empty() ? "" : ": " + error);
        const std::string w = which(got, both);
        EXPECT_NE(w, "") << describe(got, both);
        if (k == 0) EXPECT_EQ(w, "new") << "a power cut after the save returned lost it";
      },
      swap);
}

void save_now(const std::string& root, int64_t step, const Tensors& m, const Tensors& o, const ckpt::SaveOptions& so) {
  auto comm = make_local_communicator();
  Tensors opt;
  for (auto& [k, v] : o) opt[k + "/m"] = v;
  ckpt::save_sharded(*comm, root, step, slices(m), slices(opt), {{"step", step}}, so);
}

void save_in_background(const std::string& root, int64_t step, const Tensors& m, const Tensors& o,
                        const ckpt::SaveOptions& so) {
  Tensors opt;
  for (auto& [k, v] : o) opt[k + "/m"] = v;
  ckpt::BackgroundSave bg(make_local_communicator(), root, step, slices(m), slices(opt), {{"step", step}}, so);
  bg.wait();
}

TEST(CrashConsistency, ShardedSaveOfANewStepKeepsThePreviousOrTheNew) {
  const int64_t K = enumerate_sharded_save("new-step", 2, 0, save_now);
  EXPECT_GT(K, 20);
  std::printf("sharded save, new step: %lld crash points\n", static_cast<long long>(K));
}

TEST(CrashConsistency, ShardedSaveWithKeepLastOneKeepsThePreviousOrTheNew) {
  const int64_t K = enumerate_sharded_save("keep-last", 2, 1, save_now);
  std::printf("sharded save, keep_last 1: %lld crash points\n", static_cast<long long>(K));
}

TEST(CrashConsistency, ShardedSaveOfTheSameStepAgainKeepsThePreviousOrTheNew) {
  const int64_t K = enumerate_sharded_save("same-step", 1, 0, save_now);
  std::printf("sharded save, same step again: %lld crash points\n", static_cast<long long>(K));
}

TEST(CrashConsistency, ShardedSaveOfTheSameStepAgainWithoutAnAtomicSwap) {
  const int64_t K = enumerate_sharded_save("same-step-no-swap", 1, 0, save_now, /*swap=*/false);
  std::printf("sharded save, same step again, no RENAME_EXCHANGE: %lld crash points\n", static_cast<long long>(K));
}

TEST(CrashConsistency, BackgroundSaveKeepsThePreviousOrTheNew) {
  const int64_t K = enumerate_sharded_save("background", 2, 1, save_in_background);
  std::printf("background save: %lld crash points\n", static_cast<long long>(K));
}

// ---------------------------------------------------------------------------
// The HF export (save_hf) and convert --to-hf: loaded with load_hf.

struct SmallImpl : torch::nn::Module {
  explicit SmallImpl(const Tensors& v) {
    for (auto& [k, t] : v) register_parameter(k, t.clone());
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
};

// The model's values loaded from the HF directory `dir`; found = false when
// there is no `dir`.
std::pair<bool, Tensors> load_hf_dir(const std::string& dir, std::string* error) {
  if (!fs::exists(dir)) return {false, {}};
  Tensors zeros;
  for (auto& [k, v] : values(0)) zeros[k] = torch::zeros_like(v);
  auto model = fully_shard(std::make_shared<SmallImpl>(zeros), make_local_communicator(), FsdpOptions{});
  try {
    load_hf(*model, dir);
  } catch (const std::exception& e) {
    *error = e.what();
    return {false, {}};
  }
  Tensors got;
  for (auto& [k, v] : model->full_state(0)) got[k] = v.reshape(zeros.at(k).sizes());
  return {true, got};
}

void enumerate_hf_export(const std::string& tag, bool replacing, bool swap = true) {
  const std::string dir = temp_dir("crash-" + tag), base = temp_dir("crash-" + tag + "-base");
  const std::string out = dir + "/export";
  const Tensors m1 = values(1), m2 = values(2);
  HfSaveOptions so;
  so.dtype = torch::kFloat32;
  so.max_shard_size = 64;  // a file per tensor
  so.config = nlohmann::json{{"model_type", "small"}};
  auto model1 = fully_shard(std::make_shared<SmallImpl>(m1), make_local_communicator(), FsdpOptions{});
  auto model2 = fully_shard(std::make_shared<SmallImpl>(m2), make_local_communicator(), FsdpOptions{});
  if (replacing) save_hf(*model1, base + "/export", so);
  const std::map<std::string, Tensors> both = {{"previous", m1}, {"new", m2}};
  const int64_t K = enumerate(
      dir, [&] { restore(dir, base); }, [&] { save_hf(*model2, out, so); },
      [&](int64_t k) {
        std::string error;
        auto [found, got] = load_hf_dir(out, &error);
        if (!found) {
          EXPECT_TRUE(error.empty()) << "a torn export: " << error;
          EXPECT_FALSE(replacing) << "the previous export is lost";
          EXPECT_NE(k, 0) << "a power cut after the export returned lost it";
          return;
        }
        const std::string w = which(got, both);
        EXPECT_NE(w, "") << describe(got, both);
        if (!replacing) EXPECT_EQ(w, "new");
        if (k == 0) EXPECT_EQ(w, "new") << "a power cut after the export returned lost it";
      },
      swap);
  EXPECT_GT(K, 20);
  std::printf("HF export (%s%s): %lld crash points\n", replacing ? "replacing one" : "new directory",
              swap ? "" : ", no RENAME_EXCHANGE", static_cast<long long>(K));
}

TEST(CrashConsistency, HfExportIntoANewDirectoryIsAbsentOrComplete) { enumerate_hf_export("hf-new", false); }

TEST(CrashConsistency, HfExportOverAPreviousOneKeepsThePreviousOrTheNew) { enumerate_hf_export("hf-replace", true); }

TEST(CrashConsistency, HfExportOverAPreviousOneWithoutAnAtomicSwap) {
  enumerate_hf_export("hf-replace-no-swap", true, /*swap=*/false);
}

// A kill (not a power cut: what the process did stays done) between the two
// renames of a publish without an atomic swap: DEST is absent, the previous
// one waits beside it under a name no cleanup of temporaries takes, and the
// next publish that completes removes it.
TEST(CrashConsistency, AKillBetweenTheTwoRenamesLeavesThePreviousAsideUntilTheNextPublish) {
  const std::string dir = temp_dir("crash-aside");
  const std::string dest = dir + "/export";
  auto folder_with = [](const std::string& path, const std::string& text) {
    fs::create_directories(path);
    std::ofstream(path + "/a") << text;
  };
  auto text_of = [](const std::string& path) {
    std::ifstream f(path + "/a");
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  auto asides = [&] {
    std::vector<std::string> out;
    for (auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind(".export.fsdp-old-", 0) == 0) out.push_back(e.path().string());
    return out;
  };
  // The crash point between the two renames: the first k after which DEST
  // is gone.
  bool between = false;
  for (int64_t k = 1; k <= 8 && !between; ++k) {
    for (auto& e : fs::directory_iterator(dir)) fs::remove_all(e.path());
    folder_with(dest, "previous");
    const std::string tmp = ckpt::detail::make_temp_dir(dest, false);
    std::ofstream(tmp + "/a") << "new";
    FaultInjectionEnv env(dir);
    env.set_exchange_supported(false);
    env.crash_at(k);
    bool crashed = false;
    {
      fsdp::detail::ScopedEnv use(env);
      try {
        ckpt::detail::publish_dir(tmp, dest, true);
      } catch (const SimulatedCrash&) {
        crashed = true;
      }
    }
    ASSERT_TRUE(crashed) << "the publish ended before its crash point " << k;
    between = !fs::exists(dest);
  }
  ASSERT_TRUE(between) << "no crash point left DEST absent";
  EXPECT_FALSE(fs::exists(dest));
  const auto left = asides();
  ASSERT_EQ(left.size(), 1u) << "the previous one is not beside DEST";
  EXPECT_EQ(text_of(left[0]), "previous");
  // A cleanup of the temporaries (what every writer does first) leaves it.
  for (auto& e : fs::directory_iterator(dir))
    if (ckpt::detail::is_temp_dir_of(e.path().filename().string(), "export")) fs::remove_all(e.path());
  ASSERT_EQ(asides().size(), 1u);
  // The next publish completes, and removes it.
  const std::string tmp2 = ckpt::detail::make_temp_dir(dest, false);
  std::ofstream(tmp2 + "/a") << "newer";
  ckpt::detail::publish_dir(tmp2, dest, false);
  EXPECT_EQ(text_of(dest), "newer");
  EXPECT_TRUE(asides().empty());
  fs::remove_all(dir);
}

TEST(CrashConsistency, ConvertToHfIsAbsentOrComplete) {
  const std::string dir = temp_dir("crash-to-hf"), src = temp_dir("crash-to-hf-src");
  const std::string out = dir + "/hf", config = src + "/config.json";
  const Tensors m = values(2);
  save_now(src + "/ckpt", 3, m, values(1002), {});
  const std::string config_text = "{\"model_type\": \"small\"}\n";
  std::ofstream(config) << config_text;
  const std::map<std::string, Tensors> only = {{"new", m}};
  const int64_t K = enumerate(
      dir, [&] { restore(dir, ""); }, [&] { ckpt::convert_to_hf(src + "/ckpt", out, torch::kFloat32, 64, config); },
      [&](int64_t k) {
        std::string error;
        auto [found, got] = load_hf_dir(out, &error);
        EXPECT_TRUE(error.empty()) << "a torn conversion: " << error;
        if (found) {
          EXPECT_EQ(which(got, only), "new") << describe(got, only);
          EXPECT_TRUE(ckpt::verify_hf_directory(out).empty());
          EXPECT_EQ(slurp(out + "/config.json"), config_text) << "an export without its config.json";
        }
        if (k == 0) EXPECT_TRUE(found) << "a power cut after the conversion returned lost it";
        if (k > 0 && found) restore(dir, "");  // the next clean run needs OUT absent
      });
  EXPECT_GT(K, 20);
  std::printf("convert --to-hf: %lld crash points\n", static_cast<long long>(K));
}

TEST(CrashConsistency, ConvertFromHfKeepsThePreviousOrTheNew) {
  const std::string dir = temp_dir("crash-from-hf"), hf = temp_dir("crash-from-hf-src"),
                    base = temp_dir("crash-from-hf-base");
  const std::string root = dir + "/ckpt";
  const Tensors m1 = values(1), m2 = values(2);
  {
    auto model = fully_shard(std::make_shared<SmallImpl>(m2), make_local_communicator(), FsdpOptions{});
    HfSaveOptions so;
    so.dtype = torch::kFloat32;
    save_hf(*model, hf + "/in", so);
  }
  save_now(base + "/ckpt", 0, m1, values(1001), {});  // a previous step 0 there
  const std::map<std::string, Tensors> both = {{"previous", m1}, {"new", m2}};
  const int64_t K = enumerate(
      dir, [&] { restore(dir, base); }, [&] { ckpt::convert_from_hf(hf + "/in", 2, root); },
      [&](int64_t k) {
        std::string error;
        auto [found, got] = load_root(root, false, &error);
        ASSERT_TRUE(found) << "the previous checkpoint is lost" << (error.empty() ? "" : ": " + error);
        const std::string w = which(got, both);
        EXPECT_NE(w, "") << describe(got, both);
        if (k == 0) EXPECT_EQ(w, "new") << "a power cut after the conversion returned lost it";
      });
  EXPECT_GT(K, 20);
  std::printf("convert --from-hf: %lld crash points\n", static_cast<long long>(K));
}

}  // namespace FSDP_TEST_ID
}  // namespace fsdp::testing
