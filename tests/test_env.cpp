// fsdp-cpp tests: the Env (src/common/env.h), the library's one door to the
// file system, and the fault-injecting Env the crash tests stand on
// (tests/support/fault_injection_env.h).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/file_io.h"
#include "common/env.h"
#include "fault_injection_env.h"
#include "fsdp/hf.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {
namespace fs = std::filesystem;
using fsdp::detail::Env;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_text(const std::string& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

TEST(Env, ANewFileIsNeverOneThatExistsNorReachedThroughALink) {
  const std::string d = temp_dir("env-excl");
  write_text(d + "/victim", "keep me");
  fs::create_symlink(d + "/victim", d + "/link");
  const std::string e = error_of([&] { Env::posix().create(d + "/link"); });
  EXPECT_NE(e.find("expected no file there"), std::string::npos) << e;
  EXPECT_NE(e.find(d + "/link"), std::string::npos) << e;
  EXPECT_EQ(slurp(d + "/victim"), "keep me");
  EXPECT_NE(error_of([&] { Env::posix().create(d + "/victim"); }), "");
  EXPECT_EQ(slurp(d + "/victim"), "keep me");
  // A durable write replaces a planted link by a file of its own; the
  // link's target is untouched.
  fs::create_symlink(d + "/victim", d + "/out.tmp");
  ckpt::detail::atomic_write_file(d + "/out", "new");
  EXPECT_EQ(slurp(d + "/out"), "new");
  EXPECT_EQ(slurp(d + "/victim"), "keep me");
}

TEST(Env, AFifoOrAFolderWhereAFileIsExpectedIsRefusedAtOnceNamingIt) {
  const std::string d = temp_dir("env-fifo");
  ASSERT_EQ(::mkfifo((d + "/config.json").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { Env::posix().open(d + "/config.json"); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_NE(e.find("expected a regular file, found a FIFO"), std::string::npos) << e;
  EXPECT_NE(e.find(d + "/config.json"), std::string::npos) << e;
  // Where a Hugging Face directory's config.json is a FIFO, reading the
  // directory fails at once instead of hanging.
  write_text(d + "/model.safetensors", std::string(8, '\0'));
  const std::string hf = error_of([&] { ckpt::read_hf_directory(d); });
  EXPECT_NE(hf.find("FIFO"), std::string::npos) << hf;
  fs::create_directory(d + "/dir");
  const std::string de = error_of([&] { ckpt::detail::read_small_file(d + "/dir", 100); });
  EXPECT_NE(de.find("expected a regular file, found a directory"), std::string::npos) << de;
}

// same_file: one file or folder under two names (a link, "dir/."), never
// two files with the same bytes, never an absent path.
TEST(Env, SameFileIsTheSameInodeThroughLinksAndNeverAnAbsentPath) {
  const std::string d = temp_dir("env-same");
  write_text(d + "/a", "x");
  write_text(d + "/b", "x");
  fs::create_symlink(d + "/a", d + "/link");
  fs::create_directory(d + "/dir");
  Env& e = Env::posix();
  EXPECT_TRUE(e.same_file(d + "/a", d + "/link"));
  EXPECT_TRUE(e.same_file(d + "/dir", d + "/dir/."));
  EXPECT_FALSE(e.same_file(d + "/a", d + "/b"));
  EXPECT_FALSE(e.same_file(d + "/a", d + "/absent"));
  EXPECT_FALSE(e.same_file(d + "/absent", d + "/absent"));
  // The fault-injecting Env answers as the file system does.
  FaultInjectionEnv fi(d);
  EXPECT_TRUE(fi.same_file(d + "/a", d + "/link"));
  EXPECT_FALSE(fi.same_file(d + "/a", d + "/b"));
}

TEST(Env, TemporaryFoldersHaveNamesNobodyCouldPredict) {
  const std::string d = temp_dir("env-mkdtemp");
  const std::string a = ckpt::detail::make_temp_dir(d + "/export"), b = ckpt::detail::make_temp_dir(d + "/export");
  EXPECT_NE(a, b);
  for (auto& p : {a, b}) {
    EXPECT_TRUE(fs::is_directory(p)) << p;
    EXPECT_TRUE(ckpt::detail::is_temp_dir_of(ckpt::detail::base_name(p), "export")) << p;
  }
  EXPECT_FALSE(ckpt::detail::is_temp_dir_of(".export.fsdp-tmp", "export"));
}

TEST(Env, ProcReadersGoThroughIt) {
  char buf[256];
  EXPECT_GT(fsdp::detail::env().read_proc("/proc/self/statm", buf, sizeof buf), 0);
  EXPECT_EQ(fsdp::detail::env().read_proc("/proc/no-such-file", buf, sizeof buf), -1);
  EXPECT_NE(fsdp::detail::read_proc_text("/proc/self/status").find("VmRSS"), std::string::npos);
}

// The crash model itself: what a power cut keeps and drops.
TEST(FaultInjectionEnv, APowerCutKeepsOnlyWhatWasSynced) {
  const std::string d = temp_dir("env-fault");
  write_text(d + "/old", "old");
  FaultInjectionEnv env(d);
  {
    fsdp::detail::ScopedEnv use(env);
    auto& e = fsdp::detail::env();
    {  // data synced, name not: gone
      auto f = e.create(d + "/a");
      f->append("aaa", 3);
      f->sync();
    }
    {  // name synced, data not: empty
      auto f = e.create(d + "/b");
      f->append("bbb", 3);
    }
    e.make_dir(d + "/sub");
    e.sync_dir(d);  // a, b, sub durable names
    {  // data synced, then more not synced: the synced bytes
      auto f = e.create(d + "/c");
      f->append("ccc", 3);
      f->sync();
      f->append("ddd", 3);
    }
    e.rename(d + "/c", d + "/sub/c");  // c's name: only in sub, whose sync comes below
    e.remove_file(d + "/old");         // the removal, never synced: old comes back
    {
      auto f = e.create(d + "/sub/e");
      f->append("eee", 3);
      f->sync();
    }
    e.sync_dir(d + "/sub");
    EXPECT_EQ(env.mutations(), 17);
  }
  env.power_cut();
  EXPECT_EQ(slurp(d + "/a"), "aaa");
  EXPECT_EQ(slurp(d + "/b"), "");
  EXPECT_EQ(slurp(d + "/old"), "old");
  EXPECT_FALSE(fs::exists(d + "/c"));
  EXPECT_EQ(slurp(d + "/sub/c"), "ccc");
  EXPECT_EQ(slurp(d + "/sub/e"), "eee");
}

TEST(FaultInjectionEnv, ACrashStopsTheWriterAtTheKthMutatingCall) {
  const std::string d = temp_dir("env-crash");
  FaultInjectionEnv env(d);
  env.crash_at(3);
  fsdp::detail::ScopedEnv use(env);
  auto& e = fsdp::detail::env();
  e.make_dir(d + "/x");       // 1
  e.sync_dir(d);              // 2
  EXPECT_THROW(e.make_dir(d + "/y"), SimulatedCrash);  // 3: not made
  EXPECT_TRUE(env.crashed());
  EXPECT_FALSE(fs::exists(d + "/y"));
  EXPECT_THROW(e.remove_tree(d + "/x"), SimulatedCrash);  // everything after, too
  EXPECT_TRUE(fs::exists(d + "/x"));
}

}  // namespace FSDP_TEST_ID
}  // namespace fsdp::testing
