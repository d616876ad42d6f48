// fsdp-cpp: block-scaled quantized formats for the bytes of the slow tier, and error feedback.
// defines: QuantKind, QuantFormat, scale_count, payload_bytes, wire_bytes, quantize, dequantize,
//          dequantize_into, ErrorFeedback
//
// A tensor of n elements is cut into blocks of B elements (the last one may
// be short); each block gets one scale, symmetric around zero:
//   int8      scale = amax / 127, q = round(x / scale) in [-127, 127], one byte each
//   int4      scale = amax / 7,   q = round(x / scale) in [-7, 7], two per byte
//             (element 2i in the low nibble, 2i+1 in the high one, two's complement)
//   fp8 e4m3  scale = amax / 448, q = (x / scale) as float8 e4m3fn (round to nearest even)
// amax is the block's largest |x|. round() is to nearest even. A block of
// zeros has scale 0 and decodes to exact zeros. Decoding is q * scale in fp32.
//
// Bounds (per element, against its block's stored scale s):
//   int8, int4   |x - decoded| <= s / 2, plus fp32's rounding of x / s and q * s
//   fp8 e4m3     |x - decoded| <= |x| / 16 + s / 1024 (3 mantissa bits; the second
//                term is the e4m3 subnormals' half step), plus the same rounding
// A bf16 scale is amax / qmax rounded up to the next bf16, so no element
// needs a q beyond the range and the bounds hold with the stored scale.
// A nonzero block whose amax / qmax is below the smallest positive value
// of the scale dtype gets that value (the bound then holds trivially).
//
// The bytes of one quantized tensor (what travels): the scales first,
// scale_count(n) of them in the scale dtype (so they are aligned where the
// buffer is), then the payload. wire_bytes(format, n) is their exact size:
//   ceil(n / B) x sizeof(scale) + (int4 ? ceil(n / 2) : n)
//
// Non-finite input is refused: a NaN or an infinity anywhere in a tensor
// makes quantize throw fsdp::Error naming the first such element, its block
// and what to do. (An infinity would make its block's scale infinite and
// every other element of the block NaN, so passing it through is not clean.)
// The check reads the block maxima, which NaN and infinities reach; it costs
// one small host read of a bool per call (a synchronisation on a GPU).
//
// Everything is written with libtorch tensor operations, so a CUDA tensor
// is quantized on its device; the bytes come back on the input's device.
// Deterministic: the same input and format give the same bytes, every time.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>

namespace fsdp::comm {

enum class QuantKind { INT8, INT4, FP8_E4M3 };

const char* to_string(QuantKind k);  // "int8", "int4", "fp8_e4m3"

// How a tensor is quantized; validate() before use (quantize does).
struct QuantFormat {
  QuantKind kind = QuantKind::INT8;
  int64_t block = 256;                        // elements per scale, >= 1
  c10::ScalarType scale_dtype = c10::kFloat;  // kFloat or kBFloat16

  // Throws fsdp::Error naming the field, its value and what is accepted.
  void validate() const;
  // "int8 block 256 fp32 scales": for messages and logs.
  std::string describe() const;
  // The largest |q| (127, 7, 448).
  double qmax() const;
};

// Scales for n elements: ceil(n / block).
int64_t scale_count(const QuantFormat& f, int64_t n);
// Payload bytes for n elements: n (int8, e4m3) or ceil(n / 2) (int4).
int64_t payload_bytes(const QuantFormat& f, int64_t n);
// The exact bytes of n quantized elements: scales + payload (above).
int64_t wire_bytes(const QuantFormat& f, int64_t n);

// The quantized bytes of `x` (any floating dtype, contiguous or not; read as
// fp32): a uint8 tensor of wire_bytes(f, x.numel()) on x's device. Throws
// fsdp::Error on a NaN or an infinity (above) and on a bad format.
at::Tensor quantize(const at::Tensor& x, const QuantFormat& f);

// Decodes `bytes` (uint8, wire_bytes(f, numel) of them, as quantize wrote
// them; any offset, any device) into `out` (numel elements, contiguous,
// fp32, bf16 or fp16: decoded in fp32, rounded once). Throws fsdp::Error
// when the sizes disagree.
void dequantize_into(const at::Tensor& bytes, const QuantFormat& f, const at::Tensor& out);
// The same into a new fp32 tensor of `numel` elements on bytes' device.
at::Tensor dequantize(const at::Tensor& bytes, const QuantFormat& f, int64_t numel);

// Error feedback: what quantization dropped from a buffer's last send is
// added to its next one, so over K steps what was sent sums to what should
// have been sent minus one step's residual, instead of drifting by K
// roundings. One fp32 residual per named buffer, on the gradient's device.
//   auto g = ef.compensate("unit3", grad);       // grad + residual
//   auto bytes = quantize(g, f);  ... send ...
//   ef.remember("unit3", g, dequantize(bytes, f, g.numel()));
// Not thread-safe; one per communicator thread (or per engine).
class ErrorFeedback {
 public:
  // grad (read as fp32) plus the buffer's residual, as a new fp32 tensor of
  // grad's shape; the residual is zero the first time. Throws fsdp::Error
  // when the buffer's residual has another number of elements.
  at::Tensor compensate(const std::string& buffer, const at::Tensor& grad) const;
  // The buffer's residual becomes sent - decoded (both fp32 after a cast,
  // the same number of elements).
  void remember(const std::string& buffer, const at::Tensor& sent, const at::Tensor& decoded);

  // The residuals by buffer name (fp32, flat): what a checkpoint saves.
  const std::map<std::string, at::Tensor>& state() const { return residual_; }
  // Replaces every residual (a checkpoint's); each must be floating.
  void load(const std::map<std::string, at::Tensor>& state);
  void clear() { residual_.clear(); }
  // Bytes the residuals hold (the memory ledger's).
  int64_t bytes() const;

 private:
  std::map<std::string, at::Tensor> residual_;
};

}  // namespace fsdp::comm
