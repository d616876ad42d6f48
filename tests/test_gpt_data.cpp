// GPT-mini data: the batch order of docs/GPT_MINI.md, `fsdp prepare`, bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "fsdp/errors.h"
#include "gpt/data.h"
#include "test_util.h"

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;
using namespace gpt::data;

// A fresh folder per test under the system temp dir.
using fsdp::testing::temp_dir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

Tokens iota_tokens(int64_t n, int64_t vocab = 65536) {
  Tokens t(n);
  for (int64_t i = 0; i < n; i++) t[i] = uint16_t(i % vocab);
  return t;
}

// Runs f and returns the fsdp::Error message it throws ("" when it does not).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const fsdp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(GptData, OrderFollowsTheFormula) {
  const int64_t len = 1000;
  Order o{/*T=*/7, /*B=*/3, /*K=*/2, /*N=*/4};
  for (int64_t s = 0; s < 5; s++)
    for (int64_t k = 0; k < o.K; k++)
      for (int64_t r = 0; r < o.N; r++)
        for (int64_t b = 0; b < o.B; b++) {
          const int64_t j = ((s * o.K + k) * o.N + r) * o.B + b;
          ASSERT_EQ(row_index(o, s, k, r, b), j);
          ASSERT_EQ(row_offset(o, len, j), (j * o.T) % (len - o.T - 1));
        }
  // Rows hold the tokens at the offset, targets are shifted by one.
  Tokens t = iota_tokens(len);
  Batch bt = batch(t, o, /*s=*/3, /*k=*/1, /*r=*/2);
  ASSERT_EQ(bt.x.sizes(), (std::vector<int64_t>{3, 7}));
  ASSERT_EQ(bt.y.sizes(), (std::vector<int64_t>{3, 7}));
  for (int64_t b = 0; b < o.B; b++) {
    const int64_t off = row_offset(o, len, row_index(o, 3, 1, 2, b));
    for (int64_t i = 0; i < o.T; i++) {
      EXPECT_EQ(bt.x[b][i].item<int64_t>(), off + i);
      EXPECT_EQ(bt.y[b][i].item<int64_t>(), off + i + 1);
    }
  }
}

TEST(GptData, OffsetsStayInsideTheStream) {
  // The last possible row ends exactly at the last token: o + T < len.
  for (bool shuffle : {false, true}) {
    Order o{5, 2, 1, 1, shuffle, 7};
    const int64_t len = 12;  // modulus len - T - 1 = 6
    for (int64_t j = 0; j < 200; j++) {
      const int64_t off = row_offset(o, len, j);
      ASSERT_GE(off, 0);
      ASSERT_LE(off + o.T, len - 1);
    }
  }
}

// N ranks with micro-batch B see exactly the rows of one process with batch
// N*B: per (step, micro-step), rank r's rows are rows r*B .. r*B+B-1 of it.
TEST(GptData, RanksTogetherSeeWhatOneProcessSees) {
  Tokens t = iota_tokens(5000);
  for (bool shuffle : {false, true}) {
    for (int64_t N : {1, 2, 3, 4}) {
      const int64_t B = 2, K = 3, T = 16;
      Order ranks{T, B, K, N, shuffle, 11};
      Order one{T, N * B, K, 1, shuffle, 11};
      for (int64_t s = 0; s < 4; s++)
        for (int64_t k = 0; k < K; k++) {
          std::vector<torch::Tensor> xs, ys;
          for (int64_t r = 0; r < N; r++) {
            Batch b = batch(t, ranks, s, k, r);
            xs.push_back(b.x);
            ys.push_back(b.y);
          }
          Batch ref = batch(t, one, s, k, 0);
          ASSERT_TRUE(torch::equal(torch::cat(xs), ref.x)) << "N=" << N << " s=" << s << " k=" << k;
          ASSERT_TRUE(torch::equal(torch::cat(ys), ref.y)) << "N=" << N << " s=" << s << " k=" << k;
        }
    }
  }
}

TEST(GptData, ShuffledOrderDependsOnTheSeedOnly) {
  Tokens t = iota_tokens(100000);
  Order a{32, 4, 1, 1, true, 1}, a2 = a, b = a, det = a;
  b.seed = 2;
  det.shuffle = false;
  EXPECT_TRUE(torch::equal(batch(t, a, 5, 0, 0).x, batch(t, a2, 5, 0, 0).x));
  EXPECT_FALSE(torch::equal(batch(t, a, 5, 0, 0).x, batch(t, b, 5, 0, 0).x));
  EXPECT_FALSE(torch::equal(batch(t, a, 5, 0, 0).x, batch(t, det, 5, 0, 0).x));
}

TEST(GptData, EvalBatchesAreFixedAndDisjointAcrossRanks) {
  Tokens t = iota_tokens(100000);
  Order o{8, 2, 4, 2, true, 3};  // K and shuffle do not apply to validation
  Batch r0 = eval_batch(t, o, 1, 0), r1 = eval_batch(t, o, 1, 1);
  // j = (e*N + r)*B + b -> rows 4,5 (rank 0) and 6,7 (rank 1), offsets j*T.
  EXPECT_EQ(r0.x[0][0].item<int64_t>(), 4 * 8);
  EXPECT_EQ(r1.x[1][0].item<int64_t>(), 7 * 8);
}

TEST(GptData, EncodeDecodeRoundTripsEveryByte) {
  std::string all;
  for (int c = 0; c < 256; c++) all.push_back(char(c));
  Tokens t = encode(all);
  for (int c = 0; c < 256; c++) ASSERT_EQ(t[c], c);
  EXPECT_EQ(decode(t), all);
}

TEST(GptData, SplitIsNanoGptNinetyTen) {
  Split s = split(iota_tokens(1001));
  EXPECT_EQ(s.train.size(), 900u);  // int(1001 * 0.9)
  EXPECT_EQ(s.val.size(), 101u);
  EXPECT_EQ(s.val.front(), 900);
}

TEST(GptData, PrepareRoundTripsBytes) {
  const std::string d = temp_dir("prepare");
  std::string a, b;
  for (int i = 0; i < 1000; i++) a.push_back(char(i % 256));  // every byte value, NUL and 0xff included
  b = "Ünïcödé text\r\n\tand more\n";
  write_bytes(d + "/a.txt", a);
  write_bytes(d + "/b.txt", b);
  Prepared p = prepare({d + "/a.txt", d + "/b.txt"}, d + "/out/nested");
  const std::string all = a + b;
  EXPECT_EQ(p.train_tokens + p.val_tokens, int64_t(all.size()));
  EXPECT_EQ(p.train_tokens, int64_t(all.size() * 9 / 10));
  EXPECT_EQ(fs::file_size(p.train_path), size_t(2 * p.train_tokens));
  Tokens tr = read_tokens(p.train_path, 256), va = read_tokens(p.val_path, 256);
  EXPECT_EQ(decode(tr) + decode(va), all);
  // Little-endian uint16 on disk: byte 0xff -> ff 00.
  std::ifstream in(p.train_path, std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(uint8_t(raw[2 * 255]), 0xff);
  EXPECT_EQ(uint8_t(raw[2 * 255 + 1]), 0x00);
  fs::remove_all(d);
}

TEST(GptData, WriteReadTokensRoundTripsLargeIds) {
  const std::string d = temp_dir("ids");
  Tokens t = {0, 1, 255, 256, 4097, 65535};
  write_tokens(d + "/t.bin", t);
  EXPECT_EQ(read_tokens(d + "/t.bin"), t);
  fs::remove_all(d);
}

TEST(GptData, FsdpPrepareCommand) {
  const std::string d = temp_dir("cmd");
  write_bytes(d + "/x.txt", std::string(200, 'x') + "\n");
  write_bytes(d + "/y.txt", "yy\n");
  auto r = fsdp::testing::run_command(
      {fsdp::testing::bin_path("fsdp"), "prepare", "--text", d + "/x.txt", d + "/y.txt", "--out", d + "/o"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train.bin"), std::string::npos) << r.output;
  EXPECT_EQ(decode(read_tokens(d + "/o/train.bin")) + decode(read_tokens(d + "/o/val.bin")),
            std::string(200, 'x') + "\nyy\n");
  // Usage errors exit 2 and name the flag.
  r = fsdp::testing::run_command({fsdp::testing::bin_path("fsdp"), "prepare", "--text", d + "/x.txt"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--out"), std::string::npos) << r.output;
  // A missing file is a clear error, not a crash.
  r = fsdp::testing::run_command(
      {fsdp::testing::bin_path("fsdp"), "prepare", "--text", d + "/nope.txt", "--out", d + "/o2"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("nope.txt' does not exist"), std::string::npos) << r.output;
  fs::remove_all(d);
}

// ---------------------------------------------------------------------------
// Bad input: each error names the file or flag, what was found and what to do.

TEST(GptDataErrors, MissingFile) {
  auto m = error_of([] { read_tokens("/nonexistent/dir/train.bin"); });
  EXPECT_NE(m.find("'/nonexistent/dir/train.bin' does not exist"), std::string::npos) << m;
  EXPECT_NE(m.find("fsdp prepare"), std::string::npos) << m;
  m = error_of([] { read_texts({"/nonexistent/a.txt"}); });
  EXPECT_NE(m.find("does not exist"), std::string::npos) << m;
  EXPECT_NE(error_of([] { read_texts({}); }).find("--text"), std::string::npos);
}

TEST(GptDataErrors, EmptyFile) {
  const std::string d = temp_dir("empty");
  write_bytes(d + "/e.bin", "");
  auto m = error_of([&] { read_tokens(d + "/e.bin"); });
  EXPECT_NE(m.find("is empty"), std::string::npos) << m;
  m = error_of([&] { read_texts({d + "/e.bin"}); });
  EXPECT_NE(m.find("is empty"), std::string::npos) << m;
  fs::remove_all(d);
}

TEST(GptDataErrors, OddByteLength) {
  const std::string d = temp_dir("odd");
  write_bytes(d + "/odd.bin", "abc");
  auto m = error_of([&] { read_tokens(d + "/odd.bin"); });
  EXPECT_NE(m.find("has 3 bytes, expected an even count"), std::string::npos) << m;
  EXPECT_NE(m.find("--text"), std::string::npos) << m;
  fs::remove_all(d);
}

TEST(GptDataErrors, TokenIdNotBelowVocab) {
  const std::string d = temp_dir("vocab");
  write_tokens(d + "/t.bin", {1, 2, 300, 4});
  auto m = error_of([&] { read_tokens(d + "/t.bin", 256); });
  EXPECT_NE(m.find("token 2 is 300, expected ids < --vocab 256"), std::string::npos) << m;
  EXPECT_EQ(read_tokens(d + "/t.bin", 301).size(), 4u);
  fs::remove_all(d);
}

TEST(GptDataErrors, SeqLongerThanTheData) {
  Tokens t = iota_tokens(20);
  Order o{/*T=*/19, 1, 1, 1};
  auto m = error_of([&] { batch(t, o, 0, 0, 0); });
  EXPECT_NE(m.find("has 20 tokens, too few for --seq 19"), std::string::npos) << m;
  EXPECT_NE(m.find("lower --seq"), std::string::npos) << m;
  o.T = 18;  // len == T + 2: exactly one row position
  EXPECT_NO_THROW(batch(t, o, 3, 0, 0));
  EXPECT_EQ(batch(t, o, 3, 0, 0).x[0][0].item<int64_t>(), 0);
}

}  // namespace FSDP_TEST_ID
