// fsdp-cpp: block-scaled quantized formats and error feedback (see quantize.h).
//
// Every step is a tensor operation (no loop over elements here), so a CUDA
// tensor is quantized where it lies. A tensor is viewed as [blocks, B]
// (padded with zeros to whole blocks only when its last block is short and
// there is more than one: a tensor under one block is one block of its own
// size), its maxima give the scales, and the payload is the rounded
// quotient. Decoding multiplies block by block, the short tail apart.
#include "comm/quantize.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "comm/checks.h"
#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

int64_t scale_size(const QuantFormat& f) { return static_cast<int64_t>(c10::elementSize(f.scale_dtype)); }

// The smallest positive scale of the scale dtype (fp32's and bf16's
// smallest subnormals: bf16 keeps fp32's exponent, 7 mantissa bits).
float tiny_scale(const QuantFormat& f) {
  return f.scale_dtype == c10::kBFloat16 ? std::ldexp(1.0f, -133) : std::numeric_limits<float>::denorm_min();
}

// x as fp32 blocks: [blocks, B], zero-padded to whole blocks; a tensor of
// one block is [1, n].
at::Tensor blocks_of(const at::Tensor& x, const QuantFormat& f) {
  const int64_t n = x.numel(), nb = scale_count(f, n);
  at::Tensor flat = x.reshape({-1}).to(at::kFloat);
  if (nb == 1) return flat.view({1, n});
  if (nb * f.block != n) flat = at::constant_pad_nd(flat, {0, nb * f.block - n}, 0);
  return flat.view({nb, f.block});
}

// Positive fp32 values rounded up to the next bf16 (exactly representable
// after): the top 16 bits of an fp32 are its bf16, so adding 0xFFFF to the
// bits and clearing the low 16 rounds toward +infinity.
at::Tensor round_up_to_bf16(const at::Tensor& s) {
  at::Tensor bits = s.contiguous().view(at::kInt);
  return at::bitwise_and(bits + 0xFFFF, static_cast<int32_t>(0xFFFF0000u)).view(at::kFloat);
}

[[noreturn]] void refuse_non_finite(const at::Tensor& x, const QuantFormat& f) {
  at::Tensor flat = x.reshape({-1}).to(at::kFloat);
  const int64_t i = at::logical_not(at::isfinite(flat)).nonzero().select(1, 0)[0].item<int64_t>();
  const float v = flat[i].item<float>();
  const char* what = std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  throw Error(detail::cat("quantize (", f.describe(), "): element ", i, " of ", x.numel(), " (block ", i / f.block,
                          ", its element ", i % f.block, ") is ", what,
                          "; expected finite values: a quantized collective carries finite values only (an infinity "
                          "would turn its whole block into NaN). A NaN or an infinity in a gradient or a parameter "
                          "usually means training diverged: check the loss before this step (lower the learning "
                          "rate, clip gradients, scale the loss), or turn compression off for this tensor"));
}

// [blocks] fp32 scales, the stored values exactly (bf16 ones rounded up).
at::Tensor scales_of(const at::Tensor& amax, const QuantFormat& f) {
  at::Tensor s = (amax / f.qmax()).clamp_min(tiny_scale(f));
  if (f.scale_dtype == c10::kBFloat16) s = round_up_to_bf16(s);
  return at::where(amax > 0, s, at::zeros_like(s));
}

// The decoded fp32 values [n] of the payload, before scaling.
at::Tensor payload_values(const at::Tensor& payload, const QuantFormat& f, int64_t n) {
  switch (f.kind) {
    case QuantKind::INT8:
      return payload.view(at::kChar).to(at::kFloat);
    case QuantKind::INT4: {
      // Nibbles back to [-8, 7]: (v ^ 8) - 8 sign-extends four bits.
      at::Tensor p = payload.to(at::kShort);
      at::Tensor lo = at::bitwise_and(p, 0xF), hi = at::bitwise_right_shift(p, 4);
      at::Tensor both = at::stack({lo, hi}, 1).reshape({-1}).slice(0, 0, n);
      return (at::bitwise_xor(both, 8) - 8).to(at::kFloat);
    }
    case QuantKind::FP8_E4M3:
      return payload.view(at::kFloat8_e4m3fn).to(at::kFloat);
  }
  FSDP_CHECK(false, "unknown QuantKind ", static_cast<int>(f.kind));
  return {};
}

}  // namespace

const char* to_string(QuantKind k) {
  switch (k) {
    case QuantKind::INT8:
      return "int8";
    case QuantKind::INT4:
      return "int4";
    case QuantKind::FP8_E4M3:
      return "fp8_e4m3";
  }
  return "?";
}

void QuantFormat::validate() const {
  FSDP_USER_CHECK(kind == QuantKind::INT8 || kind == QuantKind::INT4 || kind == QuantKind::FP8_E4M3,
                  "QuantFormat: kind = ", static_cast<int>(kind), "; expected int8, int4 or fp8_e4m3 (QuantKind)");
  FSDP_USER_CHECK(block >= 1, "QuantFormat: block = ", block,
                  "; expected at least 1 element per scale: pass a block size >= 1 (256 is the usual choice)");
  FSDP_USER_CHECK(scale_dtype == c10::kFloat || scale_dtype == c10::kBFloat16, "QuantFormat: scale dtype ",
                  dtype_name(scale_dtype), "; expected fp32 or bf16: pass c10::kFloat or c10::kBFloat16");
}

std::string QuantFormat::describe() const {
  return detail::cat(to_string(kind), " block ", block, " ", scale_dtype == c10::kBFloat16 ? "bf16" : "fp32",
                     " scales");
}

double QuantFormat::qmax() const {
  switch (kind) {
    case QuantKind::INT8:
      return 127;
    case QuantKind::INT4:
      return 7;
    case QuantKind::FP8_E4M3:
      return 448;
  }
  return 1;
}

int64_t scale_count(const QuantFormat& f, int64_t n) { return (n + f.block - 1) / f.block; }

int64_t payload_bytes(const QuantFormat& f, int64_t n) { return f.kind == QuantKind::INT4 ? (n + 1) / 2 : n; }

int64_t wire_bytes(const QuantFormat& f, int64_t n) {
  return scale_count(f, n) * scale_size(f) + payload_bytes(f, n);
}

at::Tensor quantize(const at::Tensor& x, const QuantFormat& f) {
  at::NoGradGuard no_grad;  // a parameter's bytes need no autograd graph
  f.validate();
  FSDP_USER_CHECK(at::isFloatingType(x.scalar_type()), "quantize (", f.describe(), "): a tensor of ",
                  dtype_name(x.scalar_type()), "; expected a floating dtype (fp32, bf16, fp16, fp64)");
  const int64_t n = x.numel();
  at::Tensor out = at::empty({wire_bytes(f, n)}, x.options().dtype(at::kByte));
  if (n == 0) return out;
  at::Tensor blocks = blocks_of(x, f);
  // NaN and infinities reach the block maxima: one check over the scales.
  at::Tensor amax = blocks.abs().amax(1);
  if (!at::isfinite(amax).all().item<bool>()) refuse_non_finite(x, f);
  at::Tensor s = scales_of(amax, f);  // [blocks]
  at::Tensor sc = s.unsqueeze(1);
  // A zero block divides 0 by 0: its quotients are NaN, replaced by 0.
  at::Tensor v = at::where(sc > 0, blocks / sc, at::zeros_like(blocks)).clamp_(-f.qmax(), f.qmax());
  v = v.reshape({-1}).slice(0, 0, n);
  at::Tensor payload;
  switch (f.kind) {
    case QuantKind::INT8:
      payload = v.round().to(at::kChar).view(at::kByte);
      break;
    case QuantKind::INT4: {
      at::Tensor q = v.round().to(at::kShort);
      if (n % 2) q = at::constant_pad_nd(q, {0, 1}, 0);
      q = at::bitwise_and(q, 0xF).view({-1, 2});
      payload = at::bitwise_or(q.select(1, 0), at::bitwise_left_shift(q.select(1, 1), 4)).to(at::kByte);
      break;
    }
    case QuantKind::FP8_E4M3:
      payload = v.to(at::kFloat8_e4m3fn).view(at::kByte);
      break;
  }
  const int64_t sb = scale_count(f, n) * scale_size(f);
  out.slice(0, 0, sb).copy_(s.to(f.scale_dtype).view(at::kByte));
  out.slice(0, sb).copy_(payload);
  return out;
}

void dequantize_into(const at::Tensor& bytes, const QuantFormat& f, const at::Tensor& out) {
  at::NoGradGuard no_grad;
  f.validate();
  const int64_t n = out.numel();
  FSDP_USER_CHECK(bytes.scalar_type() == at::kByte && bytes.dim() == 1 && bytes.numel() == wire_bytes(f, n),
                  "dequantize (", f.describe(), "): ", bytes.numel(), " bytes of ", dtype_name(bytes.scalar_type()),
                  " (", bytes.dim(), "-d); expected 1-d uint8 of wire_bytes = ", wire_bytes(f, n), " for ", n,
                  " elements: pass the bytes quantize made for a tensor of out's size, with the same format");
  FSDP_USER_CHECK(out.is_contiguous() && (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16 ||
                                          out.scalar_type() == at::kHalf),
                  "dequantize (", f.describe(), "): out is ", dtype_name(out.scalar_type()),
                  out.is_contiguous() ? "" : ", not contiguous", "; expected a contiguous fp32, bf16 or fp16 tensor");
  if (n == 0) return;
  at::Tensor b = bytes.to(out.device());
  const int64_t nb = scale_count(f, n), ss = scale_size(f), sb = nb * ss;
  // The scales are read in place where they are aligned (a buffer of
  // several tensors' bytes may place them anywhere), else from a copy.
  at::Tensor scale_bytes = b.slice(0, 0, sb);
  if (scale_bytes.storage_offset() % ss != 0) scale_bytes = scale_bytes.clone();
  at::Tensor s = scale_bytes.view(f.scale_dtype).to(at::kFloat);
  at::Tensor q = payload_values(b.slice(0, sb), f, n);
  at::Tensor result = out.scalar_type() == at::kFloat ? out.view({-1}) : at::empty({n}, q.options());
  // Whole blocks at once, the short last block apart.
  const int64_t whole = n / f.block;
  if (whole > 0) {
    at::Tensor dst = result.slice(0, 0, whole * f.block).view({whole, f.block});
    at::mul_out(dst, q.slice(0, 0, whole * f.block).view({whole, f.block}), s.slice(0, 0, whole).unsqueeze(1));
  }
  if (whole < nb) {
    at::Tensor dst = result.slice(0, whole * f.block);
    at::mul_out(dst, q.slice(0, whole * f.block), s.slice(0, whole));
  }
  if (out.scalar_type() != at::kFloat) out.view({-1}).copy_(result);
}

at::Tensor dequantize(const at::Tensor& bytes, const QuantFormat& f, int64_t numel) {
  at::Tensor out = at::empty({numel}, bytes.options().dtype(at::kFloat));
  dequantize_into(bytes, f, out);
  return out;
}

// ------------------------------------------------------------ error feedback

at::Tensor ErrorFeedback::compensate(const std::string& buffer, const at::Tensor& grad) const {
  at::Tensor g = grad.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  auto it = residual_.find(buffer);
  if (it == residual_.end()) return g;
  FSDP_USER_CHECK(it->second.numel() == g.numel(), "error feedback: buffer '", buffer, "' has a residual of ",
                  it->second.numel(), " elements, its gradient now ", g.numel(),
                  "; expected the same buffer every step: clear() the residuals when the buffers change (after "
                  "resharding, load() the checkpoint's residuals of the new layout)");
  g.view({-1}).add_(it->second.to(g.device()));
  return g;
}

void ErrorFeedback::remember(const std::string& buffer, const at::Tensor& sent, const at::Tensor& decoded) {
  FSDP_USER_CHECK(sent.numel() == decoded.numel(), "error feedback: buffer '", buffer, "': ", sent.numel(),
                  " elements sent, ", decoded.numel(),
                  " decoded; expected the decoded form of what was sent: pass dequantize(quantize(sent))");
  residual_[buffer] = (sent.reshape({-1}).to(at::kFloat) - decoded.reshape({-1}).to(at::kFloat)).contiguous();
}

void ErrorFeedback::load(const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, at::Tensor> next;
  for (const auto& [name, t] : state) {
    FSDP_USER_CHECK(at::isFloatingType(t.scalar_type()), "error feedback: the residual of '", name, "' is ",
                    dtype_name(t.scalar_type()), "; expected a floating tensor (fp32 as state() gives it)");
    next[name] = t.reshape({-1}).to(at::kFloat, false, /*copy=*/true).contiguous();
  }
  residual_ = std::move(next);
}

int64_t ErrorFeedback::bytes() const {
  int64_t total = 0;
  for (const auto& [name, t] : residual_) total += t.numel() * static_cast<int64_t>(t.element_size());
  return total;
}

}  // namespace fsdp::comm
