// fsdp-cpp tests: Hugging Face checkpoints in and out (include/fsdp/hf.h),
// against transformers and PyTorch's DCP reader (tests/python/hf_llama.py),
// with the ranks as processes (tests/workers/hf_scenarios.cpp).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <tuple>

#include "checkpoint/range_reader.h"
#include "fsdp/fsdp.h"
#include "fsdp/hf.h"
#include "llama/model.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

const std::string kScript = source_path("tests/python/hf_llama.py");

// The value of `key=` in `line` (a float); fails the test when absent.
double value_of(const std::string& line, const std::string& key) {
  const auto at = line.find(key + "=");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no " << key << "= in: " << line;
    return 1e30;
  }
  return std::stod(line.substr(at + key.size() + 1));
}

// Drops the safetensors files of `dir` from the page cache (synced first)
// and says whether they are now cold and can be read with O_DIRECT, so a
// load must read them around the cache. false: the kernel kept a page, or
// the file system refuses O_DIRECT (then loads read through the cache).
bool make_cold(const std::string& dir) {
  for (auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const std::string path = e.path().string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const size_t size = fs::file_size(path);
    void* m = size ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
    bool cold = m != MAP_FAILED;
    if (m && m != MAP_FAILED) {
      std::vector<unsigned char> in((size + 4095) / 4096);
      cold = ::mincore(m, size, in.data()) == 0 &&
             std::none_of(in.begin(), in.end(), [](unsigned char r) { return r & 1; });
      ::munmap(m, size);
    }
    ::close(fd);
    const int direct = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (direct < 0 || !cold) {
      if (direct >= 0) ::close(direct);
      return false;
    }
    ::close(direct);
  }
  return true;
}

bool have_transformers() {
  static const bool ok = run_command({torch_python(), "-c", "import transformers, safetensors"}, {}, 300).exit_code == 0;
  return ok;
}

// One random Llama per suite, made by transformers (bf16, 14 files), and its
// reference logits; removed at the end.
class HfLlama : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!have_transformers()) return;
    root_ = new std::string(temp_dir("hf-llama"));
    auto r = run_command({torch_python(), kScript, "make", dir(), ref()}, {}, 600);
    made_ = r.exit_code == 0 && r.output.find("MADE") != std::string::npos;
    if (!made_) std::fprintf(stderr, "hf_llama.py make failed:\n%s\n", r.output.c_str());
  }
  static void TearDownTestSuite() {
    if (root_) fs::remove_all(*root_);
    delete root_;
    root_ = nullptr;
  }
  void SetUp() override {
    if (!have_transformers()) GTEST_SKIP() << torch_python() << " has no transformers (make test installs it)";
    ASSERT_TRUE(made_) << "transformers could not make the checkpoint (see stderr)";
  }
  static std::string dir() { return *root_ + "/llama"; }
  static std::string ref() { return *root_ + "/ref.safetensors"; }
  static std::string* root_;
  static bool made_;
};
std::string* HfLlama::root_ = nullptr;
bool HfLlama::made_ = false;

// Each rank reads exactly the bytes of its slices (bf16: 2 per element) and
// the headers of the files; the logits equal transformers' to fp32 rounding;
// no rank held the whole model. N=2 keeps every master in the counting
// allocator (FSDP_SHARE_HOST=off), whose high-water mark holds the rank's
// shard and less than the model; N=3 (where this host lets its ranks map
// each other's memory) keeps them in host-shared units, one copy per host
// outside the allocator, of which each rank touched its slices: more than
// its shard (whole pages), less than the model.
TEST_F(HfLlama, LoadsATransformersCheckpointAtOneTwoAndThreeRanks) {
  for (int n : {1, 2, 3}) {
    // N=1 reads the files transformers just wrote, from the page cache; N=2
    // and 3 start from files dropped from it (those small files come back
    // with their headers' readahead: HfDirectIo below reads cold data).
    if (n > 1) make_cold(dir());
    const bool host_shared = n == 3 && cma_available();
    auto r = run_ranks(n, "hf_load", {dir(), ref()}, n == 2 ? std::vector<std::string>{"FSDP_SHARE_HOST=off"}
                                                             : std::vector<std::string>{});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto loads = lines_with(r.output, "HFLOAD ");
    ASSERT_EQ(loads.size(), size_t(n)) << r.output;
    int64_t elements = 0, model_bytes = 0;
    for (auto& l : loads) {
      const Fields f(l);
      // Exactly the slices; a read around the page cache rounds out to 4 KiB.
      EXPECT_GE(f["data_bytes"], 2 * f["elements"]) << l;
      EXPECT_LE(f["data_bytes"], 2 * f["elements"] + 8190 * f["direct_reads"])
          << "bytes beyond the slices at N=" << n << ": " << l;
      EXPECT_LE(f["header_bytes"], f["dir_header_bytes"]) << l;
      EXPECT_EQ(f["bytes_read"], f["data_bytes"] + f["header_bytes"]) << l;
      EXPECT_GT(f["files"], 3) << "the checkpoint should span several files: " << l;
      if (n > 1) {
        const int64_t shard = 4 * f["elements"];  // its fp32 masters
        EXPECT_EQ(f["shared_per_host"] > 0, host_shared) << "N=" << n << ": " << l;
        if (host_shared) {
          EXPECT_GE(f["shared_per_host"], f["model_bytes"]) << "the host's copy is the whole model: " << l;
          EXPECT_GE(f["shared_rss"], shard) << "the rank's masters should be resident in host-shared memory: " << l;
          EXPECT_LT(f["peak"] + f["shared_rss"], f["model_bytes"]) << "a rank held the whole model at N=" << n
                                                                   << ": " << l;
        } else {
          EXPECT_GE(f["peak"], shard) << "the counting allocator should hold the rank's masters: " << l;
          EXPECT_LT(f["peak"], f["model_bytes"]) << "a rank held the whole model at N=" << n << ": " << l;
        }
      }
      elements += f["elements"];
      model_bytes = f["model_bytes"];
    }
    EXPECT_EQ(elements * 4, model_bytes) << "the ranks' slices should cover the model once (N=" << n << ")";
    const auto logits = lines_with(r.output, "LOGITS ");
    ASSERT_EQ(logits.size(), 1u) << r.output;
    std::printf("N=%d %s\n", n, logits[0].c_str());
    EXPECT_LT(value_of(logits[0], "max_abs_diff"), 2e-5) << "N=" << n;
  }
}

// Fine-tuned 10 steps at N=2 and exported (fp32, 16 KiB files): transformers
// loads the export and its logits equal ours; DCP's HF reader loads it too;
// our own load of it gives the trained model back exactly.
TEST_F(HfLlama, FineTunedExportLoadsInTransformersAndDcp) {
  const std::string out = *root_ + "/export", ours = *root_ + "/ours.safetensors";
  auto r = run_ranks(2, "hf_finetune", {dir(), out, ours, "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto exports = lines_with(r.output, "EXPORT ");
  ASSERT_EQ(exports.size(), 2u) << r.output;
  int64_t written = 0;
  for (auto& l : exports) {
    EXPECT_GT(Fields(l)["bytes_written"], 0) << "every rank writes files: " << l;
    written += Fields(l)["bytes_written"];
  }
  EXPECT_GT(written, Fields(exports[0])["total_bytes"]);  // tensors + headers
  const auto reload = lines_with(r.output, "RELOAD ");
  ASSERT_EQ(reload.size(), 1u) << r.output;
  EXPECT_EQ(value_of(reload[0], "max_abs_diff"), 0.0) << reload[0];
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
  EXPECT_TRUE(ckpt::verify_hf_directory(out).empty());
  for (auto& e : fs::directory_iterator(*root_))
    EXPECT_EQ(e.path().filename().string().find(".fsdp-tmp"), std::string::npos) << "left behind: " << e.path();
  auto py = run_command({torch_python(), kScript, "check", out, ours}, {}, 600);
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const auto tf = lines_with(py.output, "TRANSFORMERS ");
  const auto dcp = lines_with(py.output, "DCP ");
  ASSERT_EQ(tf.size(), 1u) << py.output;
  ASSERT_EQ(dcp.size(), 1u) << py.output;
  std::printf("%s\n%s\n", tf[0].c_str(), dcp[0].c_str());
  EXPECT_LT(value_of(tf[0], "max_abs_diff"), 2e-5);
  EXPECT_EQ(value_of(dcp[0], "max_abs_diff"), 0.0);
  EXPECT_EQ(value_of(dcp[0], "tensors"), 3 * 9 + 3);
}

// The example program as docs/GUIDE.md chapter 9 runs it: fsdp prepare's
// tokens (ASCII, below this checkpoint's 151 ids), three ranks load
// transformers' checkpoint, train and export; each load line gives its
// reads, libtorch's resident start and the peak above it, and the masters'
// place (host-shared where this host allows it); the export verifies.
TEST_F(HfLlama, TheExampleProgramLoadsFineTunesAndExports) {
  const std::string text = *root_ + "/text.txt", data = *root_ + "/data", out = *root_ + "/example-export";
  {
    std::ofstream t(text);
    for (int i = 0; i < 200; ++i) t << "Sentence " << i << " of the example's text, plain ASCII.\n";
  }
  auto r = run_command({bin_path("fsdp"), "prepare", "--text", text, "--out", data});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command({bin_path("fsdp"), "run", "-n", "3", "--", bin_path("llama"), "--hf", dir(), "--data",
                   data + "/train.bin", "--steps", "3", "--seq", "16", "--batch", "2", "--lr", "1e-3", "--export", out},
                  {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto loads = lines_with(r.output, "] load: rank ");
  ASSERT_EQ(loads.size(), 3u) << r.output;
  int64_t read = 0;
  for (auto& l : loads) {
    const Fields f(l);
    read += f["bytes_read"];
    EXPECT_GT(f["start_rss"], 0) << l;
    EXPECT_GE(f["peak_rss"], f["start_rss"]) << l;
    EXPECT_LT(f["peak_rss"] - f["start_rss"], f["model_bytes"] + (64 << 20)) << "the load's own memory: " << l;
    EXPECT_EQ(l.find("+ host-shared ") != std::string::npos, cma_available()) << l;
  }
  EXPECT_GE(read, Fields(loads[0])["model_bytes"] / 2) << "the ranks together read every bf16 byte";
  EXPECT_EQ(lines_with(r.output, "[rank 0] step ").size(), 3u) << r.output;
  EXPECT_EQ(lines_with(r.output, "exported 30 tensors").size(), 1u) << r.output;
  EXPECT_TRUE(ckpt::verify_hf_directory(out).empty());
  fs::remove_all(out);
  fs::remove_all(data);
  fs::remove(text);
}

// Tied embeddings (no lm_head in the files) and Llama 3's rotary frequencies.
class HfLlamaTied : public HfLlama {
 protected:
  static void SetUpTestSuite() {
    if (!have_transformers()) return;
    tied_root_ = new std::string(temp_dir("hf-llama-tied"));
    auto r = run_command({torch_python(), kScript, "make", *tied_root_ + "/llama", *tied_root_ + "/ref.safetensors",
                          "--tied", "--rope", "llama3"},
                         {}, 600);
    tied_made_ = r.exit_code == 0 && r.output.find("MADE") != std::string::npos;
    if (!tied_made_) std::fprintf(stderr, "hf_llama.py make --tied failed:\n%s\n", r.output.c_str());
  }
  static void TearDownTestSuite() {
    if (tied_root_) fs::remove_all(*tied_root_);
    delete tied_root_;
    tied_root_ = nullptr;
  }
  void SetUp() override {
    if (!have_transformers()) GTEST_SKIP() << torch_python() << " has no transformers (make test installs it)";
    ASSERT_TRUE(tied_made_) << "transformers could not make the checkpoint (see stderr)";
  }
  static std::string* tied_root_;
  static bool tied_made_;
};
std::string* HfLlamaTied::tied_root_ = nullptr;
bool HfLlamaTied::tied_made_ = false;

TEST_F(HfLlamaTied, TiedEmbeddingsAndLlama3RotaryLoadAtTwoRanks) {
  auto r = run_ranks(2, "hf_load", {*tied_root_ + "/llama", *tied_root_ + "/ref.safetensors", "grad-op"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto logits = lines_with(r.output, "LOGITS ");
  ASSERT_EQ(logits.size(), 1u) << r.output;
  std::printf("tied, llama3 rope, SHARD_GRAD_OP N=2: %s\n", logits[0].c_str());
  EXPECT_LT(value_of(logits[0], "max_abs_diff"), 2e-5);
}

// ---------------------------------------------------------------------------
// Bad input: one clear message each, nothing loaded (in one process). The
// checkpoint is ours (save_hf of a random Llama of the same shape as
// hf_llama.py's, bf16 in 16 KiB files), so these run without transformers.

llama::Config small_llama() {
  llama::Config c;
  c.vocab = 151, c.hidden = 64, c.intermediate = 120, c.layers = 3, c.heads = 4, c.kv_heads = 2, c.head_dim = 16;
  c.max_positions = 128;
  return c;
}

class HfBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    bad_ = temp_dir("hf-bad");
    cfg_ = small_llama();
    torch::manual_seed(11);
    llama::LlamaForCausalLM net(cfg_);
    auto model = fully_shard(net.ptr(), make_local_communicator(), FsdpOptions{});
    HfSaveOptions so;
    so.max_shard_size = 16 << 10;
    so.config = cfg_.to_hf();
    so.fsync = false;
    save_hf(*model, bad_, so);
    for (auto& e : fs::directory_iterator(bad_))
      if (e.path().extension() == ".safetensors") files_.push_back(e.path().filename().string());
    std::sort(files_.begin(), files_.end());
    ASSERT_GT(files_.size(), 3u);
  }
  void TearDown() override { fs::remove_all(bad_); }
  // Loads bad_ into a model whose values are known; returns the error, and
  // checks that no value changed.
  std::string load_error(const llama::Config& cfg, bool check_config = true) {
    torch::manual_seed(5);
    llama::LlamaForCausalLM net(cfg);
    auto model = fully_shard(net.ptr(), make_local_communicator(), FsdpOptions{});
    const auto before = model->full_state(0);
    HfLoadOptions lo;
    if (check_config) lo.expect_config = cfg.hf_identity();
    std::string what;
    try {
      load_hf(*model, bad_, lo);
      ADD_FAILURE() << "load_hf succeeded";
    } catch (const Error& e) {
      what = e.what();
    }
    const auto after = model->full_state(0);
    for (size_t i = 0; i < before.size(); ++i)
      EXPECT_TRUE(torch::equal(before[i].second, after[i].second)) << before[i].first << " changed: " << what;
    return what;
  }
  std::string index_path() const { return bad_ + "/model.safetensors.index.json"; }
  std::string bad_;
  llama::Config cfg_;
  std::vector<std::string> files_;  // the .safetensors files, sorted
};

TEST_F(HfBadInput, TheCheckpointItselfLoads) {
  torch::manual_seed(5);
  llama::LlamaForCausalLM net(cfg_);
  auto model = fully_shard(net.ptr(), make_local_communicator(), FsdpOptions{});
  HfLoadOptions lo;
  lo.expect_config = cfg_.hf_identity();
  const auto r = load_hf(*model, bad_, lo);
  EXPECT_EQ(r.files, int(files_.size()));
  EXPECT_EQ(r.elements, cfg_.num_params());
  EXPECT_GE(r.bytes_read - r.header_bytes, 2 * cfg_.num_params());
  EXPECT_LE(r.bytes_read - r.header_bytes, 2 * cfg_.num_params() + 8190 * r.direct_reads);
}

TEST_F(HfBadInput, AFileTheIndexNamesIsMissing) {
  fs::remove(bad_ + "/" + files_[2]);
  const auto e = load_error(cfg_);
  EXPECT_NE(e.find("files the index names that are missing (1): '" + files_[2] + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("Nothing was loaded"), std::string::npos) << e;
}

TEST_F(HfBadInput, ATruncatedFile) {
  const std::string f = bad_ + "/" + files_[1];
  fs::resize_file(f, fs::file_size(f) - 100);
  const auto e = load_error(cfg_);
  EXPECT_NE(e.find("files that cannot be read (truncated or damaged) (1)"), std::string::npos) << e;
  EXPECT_NE(e.find(files_[1]), std::string::npos) << e;
  EXPECT_NE(e.find("truncated file?"), std::string::npos) << e;
}

TEST_F(HfBadInput, ADtypeThatIsNotFloatingPointAndAShapeMismatch) {
  // A tensor rewritten as I16 (same bytes) in its file's header.
  std::string victim;
  for (auto& e : fs::directory_iterator(bad_)) {
    const std::string s = slurp(e.path().string());
    if (s.find("\"model.norm.weight\"") != std::string::npos && e.path().extension() == ".safetensors")
      victim = e.path().string();
  }
  ASSERT_FALSE(victim.empty());
  std::string s = slurp(victim);
  const auto at = s.find("\"model.norm.weight\":{");
  ASSERT_NE(at, std::string::npos) << s.substr(0, 200);
  s.replace(s.find("\"BF16\"", at), 6, "\"I16\" ");  // same header length; I16 has BF16's size
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << s;
  llama::Config wider = cfg_;
  wider.intermediate += 8;  // every MLP weight mismatches
  const auto e = load_error(wider, /*check_config=*/false);
  EXPECT_NE(e.find("not floating point"), std::string::npos) << e;
  EXPECT_NE(e.find("'model.norm.weight' is I16"), std::string::npos) << e;
  EXPECT_NE(e.find("tensors of another shape (9)"), std::string::npos) << e;
  EXPECT_NE(e.find("'model.layers.0.mlp.gate_proj.weight': the model has [128, 64], the checkpoint "
                   "'model.layers.0.mlp.gate_proj.weight' [120, 64]"), std::string::npos) << e;
}

TEST_F(HfBadInput, AnIndexThatNamesATensorTwice) {
  std::string s = slurp(index_path());
  const std::string entry = "\"lm_head.weight\": ";  // the first name: its line ends with a comma
  const auto at = s.find(entry);
  ASSERT_NE(at, std::string::npos) << s;
  const auto eol = s.find('\n', at);
  s.insert(eol + 1, s.substr(at - 4, eol - at + 5));  // the same line again
  std::ofstream(index_path(), std::ios::trunc) << s;
  const auto e = load_error(cfg_);
  EXPECT_NE(e.find("tensors the index names twice (1): 'lm_head.weight'"), std::string::npos) << e;
}

TEST_F(HfBadInput, AConfigThatDoesNotMatchTheModel) {
  llama::Config deeper = cfg_;
  deeper.layers += 1;
  deeper.kv_heads = 4;
  const auto e = load_error(deeper);
  EXPECT_NE(e.find("config.json does not describe this model (2 differences): num_hidden_layers = 3, this model has "
                   "4; num_key_value_heads = 2, this model has 4"),
            std::string::npos)
      << e;
}

// The index's values of the wrong type or out of bounds: one error naming
// the index and the key, what was expected and what is there (never a raw
// JSON library exception, never a size computed from them that overflows).
TEST_F(HfBadInput, IndexValuesOfTheWrongTypeOrOutOfBoundsNameTheIndexAndTheKey) {
  const std::string original = slurp(index_path());
  const std::string f0 = files_[0];
  const std::string sums = "metadata.fsdp_checksums", entry = sums + ".files[\"" + f0 + "\"]";
  using J = nlohmann::json;
  auto chk = [&](J& j) -> J& { return j["metadata"]["fsdp_checksums"]; };
  auto ent = [&](J& j) -> J& { return j["metadata"]["fsdp_checksums"]["files"][f0]; };
  const std::vector<std::pair<std::function<void(J&)>, std::string>> cases = {
      {[&](J& j) { chk(j)["chunk_bytes"] = 0; },
       sums + ".chunk_bytes: expected bytes per chunk, an integer in [1, 1073741824], found 0 (a number)"},
      {[&](J& j) { chk(j)["chunk_bytes"] = -4096; }, sums + ".chunk_bytes: expected bytes per chunk, an integer in "
                                                            "[1, 1073741824], found -4096 (a number)"},
      {[&](J& j) { chk(j)["chunk_bytes"] = int64_t(1) << 40; },
       sums + ".chunk_bytes: expected bytes per chunk, an integer in [1, 1073741824], found 1099511627776"},
      {[&](J& j) { chk(j)["chunk_bytes"] = "4096"; },
       sums + ".chunk_bytes: expected bytes per chunk, an integer in [1, 1073741824], found \"4096\" (a string)"},
      {[&](J& j) { chk(j).erase("chunk_bytes"); },
       sums + ".chunk_bytes: expected bytes per chunk, found nothing (the key is absent)"},
      {[&](J& j) { ent(j)["bytes"] = -5; },
       entry + ".bytes: expected the file's size, an integer in [0, 1125899906842624], found -5 (a number)"},
      {[&](J& j) { ent(j)["bytes"] = INT64_MAX; },  // bytes + chunk_bytes - 1 would overflow
       entry + ".bytes: expected the file's size, an integer in [0, 1125899906842624], found 9223372036854775807"},
      {[&](J& j) { ent(j)["bytes"] = J::array({1}); }, entry + ".bytes: expected the file's size, an integer in "
                                                               "[0, 1125899906842624], found [1] (an array)"},
      {[&](J& j) { ent(j)["bytes"] = 5 * ckpt::SafetensorsWriter::kChunkBytes; },
       entry + ".chunk_crc32c: expected 5 checksums (5242880 bytes in chunks of 1048576), found [\""},
      {[&](J& j) { ent(j)["crc32c"] = 5; },
       entry + ".crc32c: expected a CRC32C of 8 hex digits (a string), found 5 (a number)"},
      {[&](J& j) { ent(j)["chunk_crc32c"] = "abc"; },
       entry + ".chunk_crc32c: expected an array of CRC32Cs (strings of 8 hex digits), found \"abc\" (a string)"},
      {[&](J& j) { ent(j)["chunk_crc32c"][0] = 7; },
       entry + ".chunk_crc32c[0]: expected a CRC32C of 8 hex digits (a string), found 7 (a number)"},
      {[&](J& j) { ent(j) = "x"; },
       entry + ": expected an object (bytes, crc32c, chunk_crc32c), found \"x\" (a string)"},
      {[&](J& j) { chk(j)["files"] = 3; },
       sums + ".files: expected an object (file name -> checksums), found 3 (a number)"},
      {[&](J& j) { chk(j) = J::array({1}); }, sums + ": expected an object, found [1] (an array)"},
      {[&](J& j) { j["metadata"] = "x"; }, "metadata: expected an object (total_size, ...), found \"x\" (a string)"},
  };
  for (auto& [edit, want] : cases) {
    J j = J::parse(original);
    edit(j);
    std::ofstream(index_path(), std::ios::trunc) << j.dump(1);
    std::string e;
    try {
      ckpt::read_hf_directory(bad_);
    } catch (const Error& x) {
      e = x.what();
    }
    EXPECT_NE(e.find("HF index '" + index_path() + "': " + want), std::string::npos) << want << "\n" << e;
    EXPECT_NE(e.find("copy the directory again"), std::string::npos) << e;
  }
  // A weight_map value that is not a file name; through load_hf, which
  // loads nothing.
  J j = J::parse(original);
  j["weight_map"]["lm_head.weight"] = 5;
  std::ofstream(index_path(), std::ios::trunc) << j.dump(1);
  const auto e = load_error(cfg_);
  EXPECT_NE(e.find("weight_map entries of model.safetensors.index.json that are not a file name of this directory "
                   "(expected a string without '/') (1): 'lm_head.weight': found 5 (a number)"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
  // The same through load_hf for a bound, and the loading side agrees.
  j = J::parse(original);
  chk(j)["chunk_bytes"] = 0;
  std::ofstream(index_path(), std::ios::trunc) << j.dump(1);
  const auto e2 = load_error(cfg_);
  EXPECT_NE(e2.find(sums + ".chunk_bytes: expected bytes per chunk"), std::string::npos) << e2;
}

// config.json of the wrong type, or with a value of another type than the
// model's: named, nothing loaded.
TEST_F(HfBadInput, AConfigOfTheWrongTypeNamesTheFileAndTheKey) {
  const std::string cfg_path = bad_ + "/config.json";
  auto j = nlohmann::json::parse(slurp(cfg_path));
  j["num_hidden_layers"] = "3";
  std::ofstream(cfg_path, std::ios::trunc) << j.dump(1);
  auto e = load_error(cfg_);
  EXPECT_NE(e.find("'" + bad_ + "': its config.json does not describe this model (1 difference): num_hidden_layers = "
                   "\"3\", this model has 3"),
            std::string::npos)
      << e;
  std::ofstream(cfg_path, std::ios::trunc) << "[1, 2]";
  e = load_error(cfg_);
  EXPECT_NE(e.find("config '" + cfg_path + "' is not a JSON object"), std::string::npos) << e;
}

// A FIFO where config.json or a file the index names should be: refused at
// once (never a rank waiting for a writer), naming the path; nothing loaded.
TEST_F(HfBadInput, AFifoAsConfigOrAsAFileIsRefusedAtOnce) {
  for (const std::string name : {files_[1], std::string("config.json")}) {
    const std::string p = bad_ + "/" + name, keep = bad_ + "/kept";
    fs::rename(p, keep);
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
    const auto t0 = std::chrono::steady_clock::now();
    const auto e = load_error(cfg_);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0) << name;
    EXPECT_NE(e.find("'" + p + "': expected a regular file, found a FIFO (named pipe)"), std::string::npos) << e;
    fs::remove(p);
    fs::rename(keep, p);
  }
}

// The example's reader of a Llama config.json (examples/llama): a value of
// the wrong type is an fsdp::Error naming config.json, the key and the type
// expected (never the JSON library's own exception, never a silent default).
TEST(HfLlamaConfig, AValueOfTheWrongTypeNamesConfigJsonAndTheKey) {
  const nlohmann::json good = small_llama().to_hf();
  EXPECT_EQ(llama::Config::from_hf(good).hf_identity(), small_llama().hf_identity());
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases = {
      {"rms_norm_eps", "x", "\"rms_norm_eps\": expected a number, found \"x\" (string)"},
      {"num_key_value_heads", "2", "\"num_key_value_heads\": expected an integer, found \"2\" (string)"},
      {"head_dim", 16.5, "\"head_dim\": expected an integer, found 16.5 (number)"},
      {"tie_word_embeddings", 1, "\"tie_word_embeddings\": expected true or false, found 1 (number)"},
      {"hidden_act", 3, "\"hidden_act\": expected a string, found 3 (number)"},
      {"rope_parameters/rope_theta", "1e4", "\"rope_parameters.rope_theta\": expected a number, found \"1e4\" (string)"},
  };
  for (auto& [key, value, want] : cases) {
    nlohmann::json j = good;
    j[nlohmann::json::json_pointer("/" + key)] = value;
    std::string e;
    try {
      llama::Config::from_hf(j);
    } catch (const Error& x) {
      e = x.what();
    }
    EXPECT_NE(e.find("llama: config.json: " + want), std::string::npos) << key << ": " << e;
  }
}

// Offline, with `fsdp ckpt`: the HF directory as a sharded checkpoint of 3
// ranks and back (bf16 -> fp32 -> bf16: every tensor bitwise), inspected and
// verified.
TEST_F(HfBadInput, FsdpCkptConvertsToAShardedCheckpointAndBack) {
  const std::string root = bad_ + "-sharded", back = bad_ + "-back";
  auto r = run_command({bin_path("fsdp"), "ckpt", "convert", bad_, "--from-hf", "--world", "3", "--to", root});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command({bin_path("fsdp"), "ckpt", "convert", root, "--to-hf", back, "--dtype", "bf16",
                   "--max-shard-size", "20KiB"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The source's config.json went through the sharded checkpoint and back.
  EXPECT_EQ(nlohmann::json::parse(slurp(back + "/config.json")), nlohmann::json::parse(slurp(bad_ + "/config.json")));
  const auto a = ckpt::read_hf_directory(bad_), b = ckpt::read_hf_directory(back);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (auto& [name, t] : a.tensors) {
    auto x = a.files[size_t(t.file)].reader->read_all(name);
    auto& u = b.tensors.at(name);
    EXPECT_TRUE(torch::equal(x, b.files[size_t(u.file)].reader->read_all(name))) << name;
  }
  r = run_command({bin_path("fsdp"), "ckpt", "verify", back});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("size and checksums"), std::string::npos) << r.output;
  r = run_command({bin_path("fsdp"), "ckpt", "inspect", bad_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(std::to_string(files_.size()) + " files, 30 tensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.layers.2.mlp.down_proj.weight"), std::string::npos) << r.output;
  // A flipped byte in the export is found by verify.
  const std::string victim = back + "/" + b.files[0].name;
  std::string bytes = slurp(victim);
  bytes[bytes.size() - 3] ^= 0x40;
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  r = run_command({bin_path("fsdp"), "ckpt", "verify", back});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("checksum mismatch"), std::string::npos) << r.output;
  fs::remove_all(root);
  fs::remove_all(back);
}

// An export into the directory it copies its config from, under another
// name of the same directory (a symbolic link): refused, the directory as it
// was.
TEST_F(HfBadInput, AnExportIntoTheDirectoryItCopiesFromIsRefused) {
  const std::string link = bad_ + "-link";
  fs::create_directory_symlink(bad_, link);
  const std::string index_before = slurp(index_path());
  llama::LlamaForCausalLM net(cfg_);
  auto model = fully_shard(net.ptr(), make_local_communicator(), FsdpOptions{});
  HfSaveOptions so;
  so.copy_from = bad_;
  so.fsync = false;
  std::string e;
  try {
    save_hf(*model, link, so);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("is the directory it copies from (HfSaveOptions::copy_from)"), std::string::npos) << e;
  EXPECT_EQ(slurp(index_path()), index_before);
  fs::remove(link);
}

// save_hf reading JSON of the wrong type: a destination whose index says
// "format": 5 is not one of its exports (left as it is); a config.json to
// copy that is not an object is named. Never the JSON library's exception.
TEST_F(HfBadInput, SaveHfNamesJsonOfTheWrongType) {
  llama::LlamaForCausalLM net(cfg_);
  auto model = fully_shard(net.ptr(), make_local_communicator(), FsdpOptions{});
  auto save_error = [&](const std::string& dir, const HfSaveOptions& so) {
    try {
      save_hf(*model, dir, so);
    } catch (const Error& x) {
      return std::string(x.what());
    }
    return std::string();
  };
  auto j = nlohmann::json::parse(slurp(index_path()));
  j["metadata"]["format"] = 5;
  std::ofstream(index_path(), std::ios::trunc) << j.dump(1);
  const std::string index_before = slurp(index_path());
  HfSaveOptions so;
  so.fsync = false;
  auto e = save_error(bad_, so);
  EXPECT_NE(e.find("exists and is not an export written by save_hf; it is left as it is"), std::string::npos) << e;
  EXPECT_EQ(slurp(index_path()), index_before);
  // copy_from's config.json an array.
  const std::string src = bad_ + "-from", out = bad_ + "-out";
  fs::create_directory(src);
  std::ofstream(src + "/config.json") << "[1, 2]";
  so.copy_from = src;
  e = save_error(out, so);
  EXPECT_NE(e.find("save_hf: the config ('" + src + "/config.json') must be a JSON object of config.json's keys, "
                   "found [1,2] (array); nothing was exported"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(out));
  // The failed export left no temporary behind.
  for (auto& x : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_NE(x.path().filename().string().rfind("." + fs::path(out).filename().string() + ".fsdp-tmp-", 0), 0u)
        << "a temporary left: " << x.path();
  fs::remove_all(src);
}

// `fsdp ckpt convert --to-hf` of a checkpoint that holds no config.json:
// refused before anything is written, saying to pass --config; with
// --config FILE the export has that file, byte for byte, and loads.
TEST_F(HfBadInput, ConvertToHfWritesTheConfigGivenAndRefusesWithoutOne) {
  const std::string src = bad_ + "-nocfg", root = bad_ + "-nocfg-sharded", out = bad_ + "-nocfg-back";
  fs::copy(bad_, src);
  fs::remove(src + "/config.json");
  auto r = run_command({bin_path("fsdp"), "ckpt", "convert", src, "--from-hf", "--world", "2", "--to", root});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command({bin_path("fsdp"), "ckpt", "convert", root, "--to-hf", out});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("holds no config.json"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("nothing was written. Pass the model's config.json with --config FILE"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out));
  for (auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_NE(e.path().filename().string().rfind("." + fs::path(out).filename().string() + ".fsdp-tmp-", 0), 0u)
        << "a temporary left: " << e.path();
  // A config given as a file is written as it is (its bytes).
  const std::string given = src + "/given-config.json";
  const std::string text = nlohmann::json(cfg_.to_hf()).dump(3) + "\n";
  std::ofstream(given) << text;
  r = run_command({bin_path("fsdp"), "ckpt", "convert", root, "--to-hf", out, "--config", given});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(out + "/config.json"), text);
  torch::manual_seed(5);
  llama::LlamaForCausalLM net(cfg_);
  auto model = fully_shard(net.ptr(), make_local_communicator(), FsdpOptions{});
  HfLoadOptions lo;
  lo.expect_config = cfg_.hf_identity();
  EXPECT_NO_THROW(load_hf(*model, out, lo));
  // A --config that is not a JSON object: refused, nothing written.
  const std::string out2 = out + "2";
  std::ofstream(given, std::ios::trunc) << "[1]";
  r = run_command({bin_path("fsdp"), "ckpt", "convert", root, "--to-hf", out2, "--config", given});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--config '" + given + "' is not a JSON object"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out2));
  for (auto& p : {src, root, out}) fs::remove_all(p);
}

// ---------------------------------------------------------------------------
// Every rank loads the same export (tests/workers/hf_scenarios.cpp,
// hf_load_dirs: rank r loads DIR_r). Where one rank's copy differs in a
// file's header, in the index, or holds a FIFO, every rank fails at once
// with a message naming what differs; nothing is loaded.

class HfRanksSeeOneExport : public ::testing::Test {
 protected:
  void SetUp() override {
    d_ = temp_dir("hf-one-export");
    torch::manual_seed(3);
    auto two = std::make_shared<TwoModule>();
    auto model = fully_shard(two, make_local_communicator(), FsdpOptions{});
    HfSaveOptions so;
    so.dtype = torch::kFloat32;
    so.max_shard_size = 64;  // a file per tensor
    so.fsync = false;
    so.config = nlohmann::json{{"model_type", "two"}};
    save_hf(*model, a(), so);
    for (auto& e : fs::directory_iterator(a()))
      if (e.path().extension() == ".safetensors") files_.push_back(e.path().filename().string());
    std::sort(files_.begin(), files_.end());
    ASSERT_EQ(files_.size(), 2u);
    fs::copy(a(), b());
  }
  std::string a() const { return d_ + "/a"; }
  std::string b() const { return d_ + "/b"; }
  // Each rank's line of the run; fails the test when one is missing.
  std::vector<std::string> run(const std::vector<std::string>& dirs) {
    auto r = run_ranks(static_cast<int>(dirs.size()), "hf_load_dirs", dirs);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<std::string> out;
    for (size_t k = 0; k < dirs.size(); ++k) {
      const auto loaded = lines_with(r.output, "LOADED rank=" + std::to_string(k));
      const auto failed = lines_with(r.output, "LOADFAIL rank=" + std::to_string(k) + " ");
      EXPECT_EQ(loaded.size() + failed.size(), 1u) << r.output;
      out.push_back(!failed.empty() ? failed[0] : !loaded.empty() ? loaded[0] : "");
    }
    return out;
  }
  struct TwoModule : torch::nn::Module {
    TwoModule() {
      register_parameter("w", torch::randn({6, 5}));
      register_parameter("b", torch::randn({7}));
    }
    torch::Tensor forward(const torch::Tensor& x) { return x; }
  };
  std::string d_;
  std::vector<std::string> files_;
};

TEST_F(HfRanksSeeOneExport, TheSameFilesLoadOnEveryRank) {
  for (auto& line : run({a(), b()})) EXPECT_NE(line.find("LOADED rank="), std::string::npos) << line;
}

// Rank 2's copy of one file has another header (the same size, one byte of
// its metadata changed): every rank names that file and which ranks read
// which header.
TEST_F(HfRanksSeeOneExport, AFileWhoseHeaderDiffersOnOneRankFailsEveryRankNamingIt) {
  const std::string c = d_ + "/c", victim = c + "/" + files_[1];
  fs::copy(a(), c);
  std::string bytes = slurp(victim);
  const auto at = bytes.find("\"format\":\"pt\"");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 13, "\"format\":\"np\"");
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  const auto lines = run({a(), b(), c});
  for (size_t k = 0; k < lines.size(); ++k) {
    const auto& l = lines[k];
    EXPECT_NE(l.find("LOADFAIL rank="), std::string::npos) << l;
    EXPECT_NE(l.find("the ranks did not read the same files: the header of '" + files_[1] + "' (rank(s) 0, 1 read "
                     "CRC32C "),
              std::string::npos)
        << l;
    EXPECT_NE(l.find("; rank(s) 2 read CRC32C "), std::string::npos) << l;
    EXPECT_NE(l.find("The export changed while the ranks were reading it"), std::string::npos) << l;
    EXPECT_NE(l.find("Nothing was loaded"), std::string::npos) << l;
    EXPECT_EQ(l.find(files_[0]), std::string::npos) << "only the file that differs is named: " << l;
  }
}

// Rank 1's index has one more byte: every rank names the index.
TEST_F(HfRanksSeeOneExport, AnIndexThatDiffersOnOneRankFailsEveryRankNamingIt) {
  std::ofstream(b() + "/model.safetensors.index.json", std::ios::app) << "\n";
  for (auto& l : run({a(), b()})) {
    EXPECT_NE(l.find("LOADFAIL rank="), std::string::npos) << l;
    EXPECT_NE(l.find("the ranks did not read the same files: the index model.safetensors.index.json (rank(s) 0 read "
                     "CRC32C "),
              std::string::npos)
        << l;
    EXPECT_NE(l.find("; rank(s) 1 read CRC32C "), std::string::npos) << l;
    EXPECT_EQ(l.find("the header of"), std::string::npos) << l;
  }
}

// Rank 1 finds a FIFO where a file should be: it refuses it at once, naming
// the path, and rank 0 fails with it (neither waits for a writer).
TEST_F(HfRanksSeeOneExport, AFifoOnOneRankFailsEveryRankAtOnce) {
  const std::string p = b() + "/" + files_[0];
  fs::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  const auto lines = run({a(), b()});
  EXPECT_NE(lines[1].find("'" + p + "': expected a regular file, found a FIFO (named pipe)"), std::string::npos)
      << lines[1];
  EXPECT_NE(lines[0].find("failed on rank(s) 1 (see their messages); nothing was loaded"), std::string::npos)
      << lines[0];
  for (auto& l : lines) EXPECT_LT(value_of(l, "seconds"), 30.0) << l;
}

// ---------------------------------------------------------------------------
// Reading around the page cache (checkpoint/range_reader.h): cold bytes with
// O_DIRECT, cached ones from the cache, the same bytes either way.

// Every range of a cold file, any offset and length, read with and without
// the cache, equals the file's bytes; a range past the end is truncation.
TEST(HfDirectIo, RangeReaderReadsAnyRangeColdOrCached) {
  const std::string d = temp_dir("hf-range");
  const std::string path = d + "/bytes.safetensors";
  const int64_t size = 3 * 1024 * 1024 + 1234;
  std::string bytes(static_cast<size_t>(size), '\0');
  for (int64_t i = 0; i < size; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((i * 2654435761u) >> 13);
  std::ofstream(path, std::ios::binary).write(bytes.data(), size);
  if (!make_cold(d)) {
    fs::remove_all(d);
    GTEST_SKIP() << "the test folder's files cannot be made cold or read with O_DIRECT here";
  }
  std::mt19937_64 rng(3);
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 1}, {1, 4095}, {4095, 2}, {size - 1, 1}, {size - 5000, 5000}};
  for (int i = 0; i < 60; ++i) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 70000), at = static_cast<int64_t>(rng() % (size - n));
    ranges.push_back({at, n});
  }
  ckpt::detail::AlignedBuffer buf;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ckpt::detail::RangeReader r(fd, path, size, /*direct=*/true);
  int64_t asked = 0;
  for (auto [at, n] : ranges) {
    const char* p = r.read(at, n, buf);
    ASSERT_EQ(std::string(p, static_cast<size_t>(n)), bytes.substr(static_cast<size_t>(at), static_cast<size_t>(n)))
        << "read(" << at << ", " << n << ")";
    std::string into(static_cast<size_t>(n), '\0');
    r.read_to(at, n, into.data(), buf);
    ASSERT_EQ(into, bytes.substr(static_cast<size_t>(at), static_cast<size_t>(n))) << "read_to(" << at << ", " << n << ")";
    asked += 2 * n;
  }
  EXPECT_GT(r.direct_reads(), 0) << "a cold file should be read around the page cache";
  EXPECT_GE(r.bytes_read(), asked);
  EXPECT_LE(r.bytes_read(), asked + 8190 * r.direct_reads());
  // Read through the cache, the file is cached: no read goes around it.
  std::ifstream(path, std::ios::binary).read(bytes.data(), size);
  ckpt::detail::RangeReader warm(fd, path, size, true);
  for (auto [at, n] : ranges) warm.read(at, n, buf);
  EXPECT_EQ(warm.direct_reads(), 0);
  // Asked for less, it never goes around the cache.
  ASSERT_TRUE(make_cold(d));
  ckpt::detail::RangeReader buffered(fd, path, size, /*direct=*/false);
  for (auto [at, n] : ranges) ASSERT_EQ(std::string(buffered.read(at, n, buf), static_cast<size_t>(n)),
                                        bytes.substr(static_cast<size_t>(at), static_cast<size_t>(n)));
  EXPECT_EQ(buffered.direct_reads(), 0);
  // A file shorter than its header said: truncation, on either path.
  for (bool direct : {true, false}) {
    ASSERT_TRUE(make_cold(d));
    ckpt::detail::RangeReader longer(fd, path, size + 100000, direct);
    try {
      longer.read(size - 10, 20000, buf);
      ADD_FAILURE() << "a read past the end succeeded (direct " << direct << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is truncated: needed bytes [" + std::to_string(size - 10)),
                std::string::npos)
          << e.what();
    }
  }
  // The path replaced by another file meanwhile: still the file opened.
  fs::rename(path, d + "/old.safetensors");
  std::ofstream(path, std::ios::binary) << "another file";
  ASSERT_TRUE(make_cold(d));
  ckpt::detail::RangeReader same(fd, path, size, true);
  EXPECT_EQ(std::string(same.read(size - 5000, 5000, buf), 5000), bytes.substr(static_cast<size_t>(size - 5000)));
  EXPECT_GT(same.direct_reads(), 0);
  ::close(fd);
  fs::remove_all(d);
}

struct WideImpl : torch::nn::Module {
  WideImpl() {
    w = register_parameter("w", torch::zeros({300, 257}));
    b = register_parameter("b", torch::zeros({1001}));
    s = register_parameter("s", torch::zeros({3, 5}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::Tensor w, b, s;
};

// A checkpoint whose data lies past its header's readahead, cold: load_hf
// reads it around the page cache, and the model gets the same values, bit
// for bit, as through the cache; cached, it reads from the cache.
TEST(HfDirectIo, ColdCheckpointLoadsAroundThePageCacheWithTheSameValues) {
  const std::string d = temp_dir("hf-cold");
  torch::manual_seed(8);
  const std::map<std::string, torch::Tensor> hf = {
      {"w", torch::randn({300, 257})}, {"b", torch::randn({1001})}, {"s", torch::randn({3, 5})}};
  std::vector<ckpt::TensorSpec> specs;
  for (auto& [n, t] : hf) specs.push_back({n, t.sizes().vec(), torch::kBFloat16});
  ckpt::write_full_safetensors(d + "/model.safetensors", specs,
                               [&](const ckpt::TensorSpec& s) { return hf.at(s.name).to(torch::kBFloat16); });
  if (!make_cold(d)) {
    fs::remove_all(d);
    GTEST_SKIP() << "the test folder's files cannot be made cold or read with O_DIRECT here";
  }
  auto sharded = [] { return fully_shard(std::make_shared<WideImpl>(), make_local_communicator(), FsdpOptions{}); };
  auto around = sharded(), through = sharded();
  HfLoadOptions lo;
  lo.buffer_bytes = 40000;  // several reads per tensor, at offsets no multiple of 4 KiB
  const int64_t want = 2 * (300 * 257 + 1001 + 15);
  const auto cold = load_hf(*around, d, lo);
  EXPECT_GT(cold.direct_reads, 0);
  EXPECT_GE(cold.bytes_read - cold.header_bytes, want);
  EXPECT_LE(cold.bytes_read - cold.header_bytes, want + 8190 * cold.direct_reads);
  lo.direct_io = false;
  ASSERT_TRUE(make_cold(d));
  const auto buffered = load_hf(*through, d, lo);
  EXPECT_EQ(buffered.direct_reads, 0);
  EXPECT_EQ(buffered.bytes_read - buffered.header_bytes, want);
  const auto a = around->full_state(0), b = through->full_state(0);
  ASSERT_EQ(a.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
    EXPECT_TRUE(torch::equal(a[i].second, hf.at(a[i].first).to(torch::kBFloat16).to(torch::kFloat32))) << a[i].first;
  }
  // Cached now (the buffered load read it all): the default reads from the cache.
  lo.direct_io = true;
  const auto warm = load_hf(*around, d, lo);
  EXPECT_EQ(warm.direct_reads, 0);
  EXPECT_EQ(warm.bytes_read, buffered.bytes_read);
  fs::remove_all(d);
}

// ---------------------------------------------------------------------------
// The name map both ways, without transformers: a model with a fused qkv and
// a transposed projection under other names, loaded from separate q, k, v,
// then exported back to the same tensors.

// F32 read straight into the masters, F64 and F16 converted, in reads of
// the default size and of an odd size whose pieces start mid-page (the
// pages a read makes present are those wholly inside it): every value
// exact.
TEST(HfDtypes, F32F64AndF16LoadExactlyInReadsOfAnySize) {
  const std::string d = temp_dir("hf-dtypes");
  torch::manual_seed(9);
  const std::map<std::string, std::pair<torch::Tensor, torch::ScalarType>> hf = {
      {"w", {torch::randn({300, 257}), torch::kFloat32}},
      {"b", {torch::randn({1001}, torch::kFloat64), torch::kFloat64}},
      {"s", {torch::randn({3, 5}), torch::kFloat16}}};
  std::vector<ckpt::TensorSpec> specs;
  for (auto& [n, t] : hf) specs.push_back({n, t.first.sizes().vec(), t.second});
  ckpt::write_full_safetensors(d + "/model.safetensors", specs,
                               [&](const ckpt::TensorSpec& s) { return hf.at(s.name).first.to(s.dtype); });
  for (const int64_t buffer : {int64_t(1) << 20, int64_t(9002)}) {
    auto model = fully_shard(std::make_shared<WideImpl>(), make_local_communicator(), FsdpOptions{});
    HfLoadOptions lo;
    lo.buffer_bytes = buffer;
    const auto r = load_hf(*model, d, lo);
    EXPECT_EQ(r.elements, 300 * 257 + 1001 + 15);
    EXPECT_EQ(r.bytes_read - r.header_bytes, 4 * 300 * 257 + 8 * 1001 + 2 * 15);
    const auto got = model->full_state(0);
    ASSERT_EQ(got.size(), 3u);
    for (auto& [n, v] : got) {
      const auto& [t, dtype] = hf.at(n);
      EXPECT_TRUE(torch::equal(v, t.to(dtype).to(torch::kFloat32))) << n << " in reads of " << buffer << " bytes";
    }
  }
  fs::remove_all(d);
}

struct FusedImpl : torch::nn::Module {
  FusedImpl() {
    qkv = register_parameter("qkv", torch::zeros({12, 4}));    // q [4,4] k [4,4] v [4,4] stacked
    proj = register_parameter("proj", torch::zeros({4, 6}));   // the checkpoint holds [6, 4]
    scale = register_parameter("scale", torch::zeros({4}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::Tensor qkv, proj, scale;
};

TEST(HfNameMap, FusedTransposedAndRenamedTensorsLoadAndExportBack) {
  const std::string d = temp_dir("hf-map");
  std::map<std::string, torch::Tensor> hf = {
      {"attn.q.weight", torch::randn({4, 4})}, {"attn.k.weight", torch::randn({4, 4})},
      {"attn.v.weight", torch::randn({4, 4})}, {"attn.out.weight", torch::randn({6, 4})},
      {"ln.gain", torch::randn({4})}};
  std::vector<ckpt::TensorSpec> specs;
  for (auto& [n, t] : hf) specs.push_back({n, t.sizes().vec(), torch::kFloat16});
  fs::create_directories(d + "/in");
  ckpt::write_full_safetensors(d + "/in/model.safetensors", specs,
                               [&](const ckpt::TensorSpec& s) { return hf.at(s.name).to(torch::kFloat16); });
  HfNameMap names;
  names.rules = {{"qkv", {{"attn.q.weight", false, 0, 4}, {"attn.k.weight", false, 0, 4}, {"attn.v.weight", false, 0, 4}}},
                 {"proj", {{"attn.out.weight", true}}},
                 {"(s)cale", {{"ln.gain"}}}};
  auto net = std::make_shared<FusedImpl>();
  auto model = fully_shard(net, make_local_communicator(), FsdpOptions{});
  HfLoadOptions lo;
  lo.names = names;
  const auto r = load_hf(*model, d + "/in", lo);
  EXPECT_EQ(r.elements, 12 * 4 + 24 + 4);
  std::map<std::string, torch::Tensor> got;
  for (auto& [n, t] : model->full_state(0)) got[n] = t;
  auto h = [&](const char* n) { return hf.at(n).to(torch::kFloat16).to(torch::kFloat32); };
  EXPECT_TRUE(torch::equal(got["qkv"], torch::cat({h("attn.q.weight"), h("attn.k.weight"), h("attn.v.weight")})));
  EXPECT_TRUE(torch::equal(got["proj"], h("attn.out.weight").t()));
  EXPECT_TRUE(torch::equal(got["scale"], h("ln.gain")));
  // Back out under the HF names (fp16: the values came from fp16, exactly).
  HfSaveOptions so;
  so.names = names;
  so.dtype = torch::kFloat16;
  so.fsync = false;
  save_hf(*model, d + "/out", so);
  const auto back = ckpt::read_hf_directory(d + "/out");
  ASSERT_EQ(back.tensors.size(), hf.size());
  for (auto& [n, t] : hf) {
    const auto& e = back.tensors.at(n);
    auto& f = back.files[static_cast<size_t>(e.file)];
    auto v = f.reader->read_all(n);
    EXPECT_TRUE(torch::equal(v, t.to(torch::kFloat16))) << n;
  }
  EXPECT_TRUE(ckpt::verify_hf_directory(d + "/out").empty());
  // Exporting again replaces the export; a directory save_hf did not write is refused.
  save_hf(*model, d + "/out", so);
  try {
    save_hf(*model, d + "/in", so);
    ADD_FAILURE() << "save_hf replaced a directory it did not write";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not an export written by save_hf"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(d + "/in/model.safetensors"));
  fs::remove_all(d);
}

// The same kind of map at 2 and 3 ranks, where the ranks' slices start and
// end inside rows: of the transposed proj (a column range of each of the
// file's rows) and of the fused qkv; in reads of the default size and of
// 1030 bytes. The shards hold exactly the mapped bf16 values, and the
// export (fp32, under the HF names) holds them back.
TEST(HfNameMap, FusedAndTransposedTensorsLoadAndExportAtTwoAndThreeRanks) {
  const std::string d = temp_dir("hf-map-ranks");
  torch::manual_seed(10);
  const int64_t H = 37, P = 211;  // as the hf_mapped scenario
  const std::map<std::string, torch::Tensor> hf = {
      {"attn.q.weight", torch::randn({H, H})}, {"attn.k.weight", torch::randn({H, H})},
      {"attn.v.weight", torch::randn({H, H})}, {"attn.out.weight", torch::randn({P, H})},
      {"ln.gain", torch::randn({H})}};
  std::vector<ckpt::TensorSpec> specs;
  for (auto& [n, t] : hf) specs.push_back({n, t.sizes().vec(), torch::kBFloat16});
  fs::create_directories(d + "/in");
  ckpt::write_full_safetensors(d + "/in/model.safetensors", specs,
                               [&](const ckpt::TensorSpec& s) { return hf.at(s.name).to(torch::kBFloat16); });
  for (int n : {2, 3})
    for (const char* buffer : {"1048576", "1030"}) {
      const std::string out = d + "/out-" + std::to_string(n) + "-" + buffer;
      auto r = run_ranks(n, "hf_mapped", {d + "/in", out, buffer});
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const auto lines = lines_with(r.output, "MAPPED ");
      ASSERT_EQ(lines.size(), 1u) << r.output;
      EXPECT_NE(lines[0].find("loaded_equal=1"), std::string::npos) << "N=" << n << ", reads of " << buffer << ": "
                                                                    << lines[0];
      EXPECT_NE(lines[0].find("exported_equal=1"), std::string::npos) << "N=" << n << ", reads of " << buffer << ": "
                                                                      << lines[0];
    }
  fs::remove_all(d);
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
