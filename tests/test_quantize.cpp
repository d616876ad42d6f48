// fsdp-cpp tests: the quantized formats of the slow tier and error feedback
// (src/comm/quantize.*): round trips within each format's bound per block,
// zeros, the refusal of NaN and infinities, determinism, the exact wire
// bytes, the int4 packing, and error feedback against its absence.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "comm/quantize.h"
#include "fsdp/errors.h"

namespace FSDP_TEST_ID {

using fsdp::comm::dequantize;
using fsdp::comm::dequantize_into;
using fsdp::comm::ErrorFeedback;
using fsdp::comm::QuantFormat;
using fsdp::comm::QuantKind;
using fsdp::comm::quantize;
using fsdp::comm::wire_bytes;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

std::vector<QuantFormat> formats(int64_t block) {
  std::vector<QuantFormat> out;
  for (QuantKind k : {QuantKind::INT8, QuantKind::INT4, QuantKind::FP8_E4M3})
    for (c10::ScalarType s : {c10::kFloat, c10::kBFloat16}) out.push_back({k, block, s});
  return out;
}

// Values whose magnitude varies from block to block (and inside one): the
// scales span many binades; a few exact zeros.
torch::Tensor varied(int64_t n, int seed) {
  torch::manual_seed(seed);
  auto x = torch::randn({n}) * torch::exp(torch::randn({n}) * 3);
  if (n > 3) x.index_put_({torch::arange(0, n, 5)}, 0.0f);
  return x;
}

// The stored scales of `bytes`, as fp32.
torch::Tensor scales_in(const torch::Tensor& bytes, const QuantFormat& f, int64_t n) {
  const int64_t nb = fsdp::comm::scale_count(f, n);
  const int64_t ss = f.scale_dtype == c10::kFloat ? 4 : 2;
  return bytes.slice(0, 0, nb * ss).clone().view(f.scale_dtype).to(torch::kFloat);
}

// Each element's own block scale, [n].
torch::Tensor per_element(const torch::Tensor& s, const QuantFormat& f, int64_t n) {
  return s.repeat_interleave(f.block).slice(0, 0, n);
}

// The largest violation of the format's bound (<= 0 when it holds), with
// fp32's roundings of x / s and q * s allowed for.
double worst_excess(const torch::Tensor& x, const torch::Tensor& decoded, const torch::Tensor& s,
                    const QuantFormat& f) {
  auto err = (x.to(torch::kDouble) - decoded.to(torch::kDouble)).abs();
  auto sd = s.to(torch::kDouble), ax = x.to(torch::kDouble).abs();
  torch::Tensor bound = f.kind == QuantKind::FP8_E4M3 ? ax / 16 + sd / 1024 : sd / 2;
  bound = bound + sd * 1e-5 + ax * 1e-6;
  return (err - bound).max().item<double>();
}

// ---------------------------------------------------------------- formats

TEST(QuantFormats, WireBytesAreExact) {
  for (int64_t n : {0, 1, 2, 7, 255, 256, 257, 1000, 65536, 65537})
    for (int64_t block : {1, 7, 256, 65536})
      for (const QuantFormat& f : formats(block)) {
        const int64_t scales = (n + block - 1) / block;
        const int64_t ss = f.scale_dtype == c10::kFloat ? 4 : 2;
        const int64_t payload = f.kind == QuantKind::INT4 ? (n + 1) / 2 : n;
        EXPECT_EQ(wire_bytes(f, n), scales * ss + payload) << f.describe() << " n=" << n;
        EXPECT_EQ(quantize(varied(n, 1), f).numel(), wire_bytes(f, n)) << f.describe() << " n=" << n;
      }
  // int8 with fp32 scales per 256: n + n/64 bytes, about 0.254 x fp32's.
  EXPECT_EQ(wire_bytes({QuantKind::INT8, 256, c10::kFloat}, 1 << 20), (1 << 20) + (1 << 12) * 4);
  EXPECT_EQ(wire_bytes({QuantKind::INT4, 256, c10::kBFloat16}, 1 << 20), (1 << 19) + (1 << 12) * 2);
}

TEST(QuantFormats, RoundTripWithinTheBoundOfEachFormat) {
  for (int64_t block : {1, 7, 256, 65536})
    for (int64_t n : {int64_t(1), int64_t(6), int64_t(7), int64_t(300), int64_t(7 * 256 + 3), int64_t(65536 + 77)})
      for (const QuantFormat& f : formats(block)) {
        const std::string what = f.describe() + " n=" + std::to_string(n);
        auto x = varied(n, static_cast<int>(n + block));
        auto bytes = quantize(x, f);
        auto decoded = dequantize(bytes, f, n);
        auto s = scales_in(bytes, f, n);
        // The scale is the block's amax / qmax (bf16: rounded up to a bf16).
        auto padded = torch::constant_pad_nd(x, {0, s.numel() * block - n}, 0).view({s.numel(), block});
        auto want = padded.abs().amax(1) / static_cast<float>(f.qmax());
        if (f.scale_dtype == c10::kFloat) {
          EXPECT_TRUE(torch::equal(s, want)) << what;
        } else {
          EXPECT_TRUE((s >= want).all().item<bool>()) << what;
          EXPECT_TRUE((s.to(torch::kBFloat16).to(torch::kFloat) == s).all().item<bool>()) << what;
          EXPECT_LE((s / want.clamp_min(1e-30)).max().item<float>(), 1.0f + 1.0f / 128) << what;
        }
        EXPECT_LE(worst_excess(x, decoded, per_element(s, f, n), f), 0.0) << what;
        // Every q lies in the symmetric range.
        auto payload = bytes.slice(0, wire_bytes(f, n) - fsdp::comm::payload_bytes(f, n));
        if (f.kind == QuantKind::INT8) {
          EXPECT_FALSE((payload.view(torch::kChar) == -128).any().item<bool>()) << what;
        }
        if (f.kind == QuantKind::INT4) {
          EXPECT_FALSE((torch::bitwise_and(payload, 0xF) == 8).any().item<bool>()) << what;
          EXPECT_FALSE((torch::bitwise_right_shift(payload, 4) == 8).any().item<bool>()) << what;
        }
      }
}

// Element 2i in the low nibble, 2i+1 in the high one, two's complement; an
// odd count leaves the last high nibble zero.
TEST(QuantFormats, Int4PacksTwoPerByteLowNibbleFirst) {
  QuantFormat f{QuantKind::INT4, 8, c10::kFloat};
  auto x = torch::tensor({7.0f, -7.0f, 1.0f, -1.0f, 0.0f, 3.0f, -2.0f});
  auto bytes = quantize(x, f);
  ASSERT_EQ(bytes.numel(), 4 + 4);
  EXPECT_EQ(scales_in(bytes, f, 7).item<float>(), 1.0f);
  auto p = bytes.slice(0, 4);
  const std::vector<int> want = {0x97, 0xF1, 0x30, 0x0E};  // (-7,7) (-1,1) (3,0) (0,-2)
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p[i].item<int>(), want[i]) << "byte " << i;
  EXPECT_TRUE(torch::equal(dequantize(bytes, f, 7), x));
}

TEST(QuantFormats, ZerosDecodeToExactZeros) {
  for (const QuantFormat& f : formats(7)) {
    auto zero = torch::zeros({20});
    auto bytes = quantize(zero, f);
    EXPECT_TRUE((scales_in(bytes, f, 20) == 0).all().item<bool>()) << f.describe();
    EXPECT_TRUE(torch::equal(dequantize(bytes, f, 20), zero)) << f.describe();
    // A zero block among others: its scale 0, its elements exactly 0.
    auto x = varied(21, 3);
    x.slice(0, 7, 14).zero_();
    auto mixed = quantize(x, f);
    EXPECT_EQ(scales_in(mixed, f, 21)[1].item<float>(), 0.0f) << f.describe();
    EXPECT_TRUE(torch::equal(dequantize(mixed, f, 21).slice(0, 7, 14), torch::zeros({7}))) << f.describe();
  }
  // Nothing at all: no bytes.
  EXPECT_EQ(quantize(torch::empty({0}), QuantFormat{}).numel(), 0);
  EXPECT_EQ(dequantize(torch::empty({0}, torch::kByte), QuantFormat{}, 0).numel(), 0);
}

// Values so small that amax / 127 underflows fp32: the smallest positive
// scale, and the bound still holds.
TEST(QuantFormats, SubnormalBlocksKeepAPositiveScale) {
  for (const QuantFormat& f : formats(4)) {
    auto x = torch::tensor({1e-45f, -2e-45f, 0.0f, 3e-45f, 1.0f, 0.5f, 0.25f, -1.0f});
    auto bytes = quantize(x, f);
    auto s = scales_in(bytes, f, 8);
    EXPECT_GT(s[0].item<float>(), 0.0f) << f.describe();
    EXPECT_LE(worst_excess(x, dequantize(bytes, f, 8), per_element(s, f, 8), f), 0.0) << f.describe();
  }
}

TEST(QuantFormats, NonFiniteIsRefusedNamingTheElement) {
  for (const QuantFormat& f : formats(256)) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      auto x = varied(1000, 4);
      x[613] = bad;
      try {
        quantize(x, f);
        FAIL() << f.describe() << ": a non-finite value must be refused";
      } catch (const fsdp::Error& e) {
        const std::string m = e.what();
        EXPECT_TRUE(contains(m, "element 613 of 1000 (block 2, its element 101) is " +
                                    std::string(std::isnan(bad) ? "nan" : (bad > 0 ? "inf" : "-inf"))))
            << m;
        EXPECT_TRUE(contains(m, "expected finite values")) << m;
        EXPECT_TRUE(contains(m, "turn compression off for this tensor")) << m;
        EXPECT_TRUE(contains(m, f.describe())) << m;
      }
    }
  }
}

TEST(QuantFormats, SameInputSameBytes) {
  for (const QuantFormat& f : formats(256)) {
    auto x = varied(5000, 5);
    auto a = quantize(x, f), b = quantize(x.clone(), f);
    EXPECT_TRUE(torch::equal(a, b)) << f.describe();
    // A non-contiguous view and a bf16 copy of bf16 values: the same bytes
    // as their contiguous fp32 form.
    auto wide = torch::stack({x, x}, 1);
    EXPECT_TRUE(torch::equal(quantize(wide.select(1, 1), f), a)) << f.describe();
    auto xb = x.to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(quantize(xb, f), quantize(xb.to(torch::kFloat), f))) << f.describe();
    // A tensor that requires grad (a parameter): the same bytes, no graph.
    auto p = x.clone().requires_grad_(true);
    auto pb = quantize(p, f);
    EXPECT_FALSE(pb.requires_grad()) << f.describe();
    EXPECT_TRUE(torch::equal(pb, a)) << f.describe();
  }
}

// Decoding into bf16 rounds the fp32 decoded value once; bytes at an odd
// offset of a larger buffer decode the same as on their own.
TEST(QuantFormats, DecodesIntoBf16AndFromAnyOffset) {
  for (const QuantFormat& f : formats(7)) {
    auto x = varied(100, 6);
    auto bytes = quantize(x, f);
    auto ref = dequantize(bytes, f, 100);
    auto bf = torch::empty({100}, torch::kBFloat16);
    dequantize_into(bytes, f, bf);
    EXPECT_TRUE(torch::equal(bf, ref.to(torch::kBFloat16))) << f.describe();
    auto buffer = torch::zeros({bytes.numel() + 3}, torch::kByte);
    buffer.slice(0, 3).copy_(bytes);
    EXPECT_TRUE(torch::equal(dequantize(buffer.slice(0, 3), f, 100), ref)) << f.describe();
  }
}

TEST(QuantFormats, BadFormatsAndSizesAreRefused) {
  auto x = torch::ones({10});
  try {
    quantize(x, QuantFormat{QuantKind::INT8, 0, c10::kFloat});
    FAIL() << "block 0 must be refused";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "block = 0; expected at least 1 element per scale")) << e.what();
  }
  try {
    quantize(x, QuantFormat{QuantKind::INT8, 16, c10::kHalf});
    FAIL() << "fp16 scales must be refused";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "expected fp32 or bf16")) << e.what();
  }
  QuantFormat f;
  auto bytes = quantize(x, f);
  try {
    dequantize(bytes, f, 11);
    FAIL() << "a size that disagrees with the bytes must be refused";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "expected 1-d uint8 of wire_bytes = 15 for 11 elements")) << e.what();
  }
}

// ---------------------------------------------------------------- error feedback
// A constant gradient: one element of 1.0 per block of 256 sets the int8
// scale to 1/127, and the others, 0.001, round to q = 0 (0.127 of a step).
// Without feedback they are never sent: after K steps the sum sent is 0
// where K x 0.001 should have been (a bias that grows with K). With
// feedback, the sum sent differs from the true sum by exactly the residual
// (up to fp32 roundings), which stays within half a step.
TEST(QuantErrorFeedback, SentSumTracksTheTrueSumWithinOneResidual) {
  const QuantFormat f{QuantKind::INT8, 256, c10::kFloat};
  const int K = 200;
  auto g = torch::full({512}, 0.001f);
  g[0] = 1.0f;
  g[256] = -1.0f;
  const double half_step = 1.0 / 127 / 2;
  ErrorFeedback ef;
  auto with = torch::zeros({512}, torch::kDouble), without = torch::zeros({512}, torch::kDouble);
  for (int k = 0; k < K; ++k) {
    auto sent = ef.compensate("unit", g);
    auto decoded = dequantize(quantize(sent, f), f, 512);
    ef.remember("unit", sent, decoded);
    with += decoded.to(torch::kDouble);
    without += dequantize(quantize(g, f), f, 512).to(torch::kDouble);
  }
  auto truth = g.to(torch::kDouble) * K;
  auto small = torch::ones({512}, torch::kBool);
  small[0] = false;
  small[256] = false;
  // Without feedback the small elements were never sent.
  EXPECT_NEAR((truth - without).index({small}).min().item<double>(), K * 0.001, 1e-6);
  EXPECT_GT(K * 0.001, 10 * half_step);
  // With feedback: off by the residual, and that within half a step.
  auto residual = ef.state().at("unit").to(torch::kDouble);
  EXPECT_LE((with - truth + residual).abs().max().item<double>(), 1e-5);
  EXPECT_LE((with - truth).abs().max().item<double>(), half_step * (1 + 1e-4));
  EXPECT_EQ(ef.bytes(), 512 * 4);
}

// The residuals are tensors: saved and loaded (torch's own serialisation
// here), the next step compensates exactly as the uninterrupted one.
TEST(QuantErrorFeedback, ResidualsSurviveASaveAndLoad) {
  const QuantFormat f{QuantKind::INT4, 64, c10::kBFloat16};
  ErrorFeedback ef;
  auto g = varied(1000, 7);
  for (int k = 0; k < 3; ++k) {
    auto sent = ef.compensate("a", g);
    ef.remember("a", sent, dequantize(quantize(sent, f), f, 1000));
  }
  std::vector<torch::Tensor> saved;
  for (const auto& [name, t] : ef.state()) saved.push_back(t);
  std::stringstream file;
  torch::save(saved, file);
  std::vector<torch::Tensor> loaded;
  torch::load(loaded, file);
  ErrorFeedback resumed;
  resumed.load({{"a", loaded.at(0)}});
  EXPECT_TRUE(torch::equal(resumed.compensate("a", g), ef.compensate("a", g)));
  // A buffer of another size is refused, not silently broadcast.
  try {
    resumed.compensate("a", torch::ones({999}));
    FAIL() << "a residual of another size must be refused";
  } catch (const fsdp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "has a residual of 1000 elements, its gradient now 999")) << e.what();
  }
  resumed.clear();
  EXPECT_EQ(resumed.bytes(), 0);
  EXPECT_TRUE(torch::equal(resumed.compensate("a", g), g));
}

}  // namespace FSDP_TEST_ID
