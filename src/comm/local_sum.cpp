// fsdp-cpp: local reduction kernels (see local_sum.h).
//
// The loops work on GCC/Clang vector types (vector_size), so they are SIMD
// whatever the optimisation level: -O2 of GCC 12 does not vectorise a plain
// loop whose trip count is unknown and whose pointers may alias. Each lane
// does exactly the scalar arithmetic (IEEE add and divide are correctly
// rounded, lane by lane), so results are bit-identical to the scalar tail,
// which handles the last n % W elements. bf16 is widened by a 16-bit shift
// and rounded back to nearest-even, NaN -> 0x7FC0, exactly as c10::BFloat16.
// dst may equal a or b: every lane loads before it stores.
#include "comm/local_sum.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>

#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

// 16-byte vectors: one SSE register on baseline x86-64.
template <class T>
using Vec __attribute__((vector_size(16))) = T;

template <class V>
inline V load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V>
inline void store(void* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// Same-type arithmetic: fp32, fp64, int32, int64.
template <class T>
void add_same(void* dst, const void* a, const void* b, int64_t n, int divisor) {
  using V = Vec<T>;
  constexpr int64_t W = sizeof(V) / sizeof(T);
  auto* d = static_cast<char*>(dst);
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  int64_t i = 0;
  if (divisor == 1) {
    for (; i + W <= n; i += W) {
      const int64_t o = i * int64_t(sizeof(T));
      store(d + o, load<V>(x + o) + load<V>(y + o));
    }
    for (; i < n; ++i) {
      T s = reinterpret_cast<const T*>(x)[i] + reinterpret_cast<const T*>(y)[i];
      std::memcpy(d + i * sizeof(T), &s, sizeof(T));
    }
  } else {
    // Divide (not multiply by 1/N): matches what a reference computes as sum / N.
    const T div = static_cast<T>(divisor);
    for (; i + W <= n; i += W) {
      const int64_t o = i * int64_t(sizeof(T));
      store(d + o, (load<V>(x + o) + load<V>(y + o)) / div);
    }
    for (; i < n; ++i) {
      T s = (reinterpret_cast<const T*>(x)[i] + reinterpret_cast<const T*>(y)[i]) / div;
      std::memcpy(d + i * sizeof(T), &s, sizeof(T));
    }
  }
}

// bf16 on 32-bit lanes: a lane holds two bf16 (element 2k in its low half,
// 2k+1 in its high half on little-endian), so widening is a shift (even) or
// a mask (odd) and narrowing packs two rounded results back into one lane;
// no 16-bit shuffles, which baseline x86-64 lacks.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16 lane packing assumes little-endian");
using U32x4 __attribute__((vector_size(16))) = uint32_t;
using I32x4 __attribute__((vector_size(16))) = int32_t;
using F32x4 __attribute__((vector_size(16))) = float;

inline F32x4 as_f(U32x4 u) {
  F32x4 f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline U32x4 as_u(F32x4 f) {
  U32x4 u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
// fp32 bits -> bf16 bits in the high half of the lane (low half garbage):
// round to nearest even, NaN -> 0x7FC0.
inline U32x4 round_hi(F32x4 f) {
  U32x4 u = as_u(f);
  U32x4 r = u + (((u >> 16) & 1u) + 0x7FFFu);
  U32x4 nan = U32x4(I32x4(f != f));
  return (r & ~nan) | (nan & 0x7FC00000u);
}

template <bool kDivide>
void add_bf16_pairs(char* d, const char* x, const char* y, int64_t lanes, float div) {
  for (int64_t k = 0; k + 4 <= lanes; k += 4) {
    const U32x4 a = load<U32x4>(x + 4 * k), b = load<U32x4>(y + 4 * k);
    F32x4 even = as_f(a << 16) + as_f(b << 16);
    F32x4 odd = as_f(a & 0xFFFF0000u) + as_f(b & 0xFFFF0000u);
    if (kDivide) {
      even = even / div;
      odd = odd / div;
    }
    store(d + 4 * k, (round_hi(even) >> 16) | (round_hi(odd) & 0xFFFF0000u));
  }
}

void add_bf16(void* dst, const void* a, const void* b, int64_t n, int divisor) {
  const float div = static_cast<float>(divisor);
  const int64_t vec = n / 8 * 8;  // 4 lanes x 2 elements
  if (divisor == 1)
    add_bf16_pairs<false>(static_cast<char*>(dst), static_cast<const char*>(a), static_cast<const char*>(b),
                          vec / 2, div);
  else
    add_bf16_pairs<true>(static_cast<char*>(dst), static_cast<const char*>(a), static_cast<const char*>(b),
                         vec / 2, div);
  auto* d = static_cast<c10::BFloat16*>(dst);
  const auto* x = static_cast<const c10::BFloat16*>(a);
  const auto* y = static_cast<const c10::BFloat16*>(b);
  for (int64_t i = vec; i < n; ++i) {
    float s = static_cast<float>(x[i]) + static_cast<float>(y[i]);
    d[i] = c10::BFloat16(divisor == 1 ? s : s / div);
  }
}

// fp16 stays scalar: its conversions need F16C, which baseline x86-64 lacks,
// and FSDP on CPU reduces in fp32 or bf16.
void add_half(void* dst, const void* a, const void* b, int64_t n, int divisor) {
  auto* d = static_cast<c10::Half*>(dst);
  const auto* x = static_cast<const c10::Half*>(a);
  const auto* y = static_cast<const c10::Half*>(b);
  const float div = static_cast<float>(divisor);
  for (int64_t i = 0; i < n; ++i) {
    float s = static_cast<float>(x[i]) + static_cast<float>(y[i]);
    d[i] = c10::Half(divisor == 1 ? s : s / div);
  }
}

// The tile the ordered sums accumulate in: small enough to stay in L1.
constexpr int64_t kTile = 2048;

// bf16 widened in lanes (add_bf16_pairs' layout), summed in fp32 in order,
// rounded once.
void sum_bf16(char* d, const char* const* src, int k, int64_t n, float div, bool divide) {
  F32x4 ev[kTile / 8], od[kTile / 8];
  for (int64_t t = 0; t < n; t += kTile) {
    const int64_t m = std::min(kTile, n - t), vec = m / 8 * 8, lanes = vec / 8;
    for (int q = 0; q < k; ++q) {
      const char* x = src[q] + t * 2;
      for (int64_t l = 0; l < lanes; ++l) {
        const U32x4 a = load<U32x4>(x + 16 * l);
        if (q == 0) {
          ev[l] = as_f(a << 16);
          od[l] = as_f(a & 0xFFFF0000u);
        } else {
          ev[l] += as_f(a << 16);
          od[l] += as_f(a & 0xFFFF0000u);
        }
      }
    }
    for (int64_t l = 0; l < lanes; ++l) {
      F32x4 e = ev[l], o = od[l];
      if (divide) {
        e = e / div;
        o = o / div;
      }
      store(d + t * 2 + 16 * l, (round_hi(e) >> 16) | (round_hi(o) & 0xFFFF0000u));
    }
    for (int64_t i = vec; i < m; ++i) {
      float s = 0;
      for (int q = 0; q < k; ++q) s += static_cast<float>(reinterpret_cast<const c10::BFloat16*>(src[q])[t + i]);
      reinterpret_cast<c10::BFloat16*>(d)[t + i] = c10::BFloat16(divide ? s / div : s);
    }
  }
}

void sum_half(void* dst, const void* const* src, int k, int64_t n, float div, bool divide) {
  for (int64_t i = 0; i < n; ++i) {
    float s = 0;
    for (int q = 0; q < k; ++q) s += static_cast<float>(static_cast<const c10::Half*>(src[q])[i]);
    static_cast<c10::Half*>(dst)[i] = c10::Half(divide ? s / div : s);
  }
}

}  // namespace

void sum_in_rank_order(void* dst, const void* const* src, int k, int64_t n, c10::ScalarType dtype, int divisor) {
  FSDP_CHECK(k >= 1, "sum_in_rank_order needs a source");
  const bool divide = divisor != 1;
  if (dtype == c10::kBFloat16) return sum_bf16(static_cast<char*>(dst), reinterpret_cast<const char* const*>(src), k, n,
                                               static_cast<float>(divisor), divide);
  if (dtype == c10::kHalf) return sum_half(dst, src, k, n, static_cast<float>(divisor), divide);
  // Same-type: dst accumulates tile by tile, ((s0 + s1) + s2) + ..., the
  // last addition divided.
  const int64_t es = c10::elementSize(dtype);
  auto* d = static_cast<char*>(dst);
  for (int64_t t = 0; t < n; t += kTile) {
    const int64_t m = std::min(kTile, n - t), o = t * es;
    const char* s0 = static_cast<const char*>(src[0]) + o;
    if (k == 1) {
      if (d + o != s0) std::memcpy(d + o, s0, m * es);
      if (divide) {
        // x / divisor as a sum with zeros would not be exact for integers; AVG
        // of one rank only happens for floating point.
        FSDP_CHECK(dtype == c10::kFloat || dtype == c10::kDouble, "integer AVG must be rejected at issue time");
        if (dtype == c10::kFloat)
          for (int64_t i = 0; i < m; ++i) reinterpret_cast<float*>(d + o)[i] /= static_cast<float>(divisor);
        else
          for (int64_t i = 0; i < m; ++i) reinterpret_cast<double*>(d + o)[i] /= static_cast<double>(divisor);
      }
      continue;
    }
    for (int q = 1; q < k; ++q)
      add_into(d + o, q == 1 ? s0 : d + o, static_cast<const char*>(src[q]) + o, m, dtype, q == k - 1 ? divisor : 1);
  }
}

void add_into(void* dst, const void* a, const void* b, int64_t n, c10::ScalarType dtype, int divisor) {
  switch (dtype) {
    case c10::kFloat: return add_same<float>(dst, a, b, n, divisor);
    case c10::kDouble: return add_same<double>(dst, a, b, n, divisor);
    case c10::kBFloat16: return add_bf16(dst, a, b, n, divisor);
    case c10::kHalf: return add_half(dst, a, b, n, divisor);
    case c10::kInt:
      FSDP_CHECK(divisor == 1, "integer AVG must be rejected at issue time");
      return add_same<int32_t>(dst, a, b, n, 1);
    case c10::kLong:
      FSDP_CHECK(divisor == 1, "integer AVG must be rejected at issue time");
      return add_same<int64_t>(dst, a, b, n, 1);
    default:
      FSDP_CHECK(false, "dtype ", dtype, " must be rejected at issue time");
  }
}

}  // namespace fsdp::comm
