// fsdp-cpp: the local arithmetic of reducing collectives.
// defines: add_into, sum_in_rank_order
//
// bf16 and fp16 are widened to fp32 for every addition and rounded once per
// call, so a ring step loses no more than one rounding; the division of
// ReduceOp::AVG happens on the accumulated value before that rounding.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace fsdp::comm {

// dst[i] = (a[i] + b[i]) / divisor, for i < n. divisor 1 means a plain sum.
// dst may alias a or b. Supported: fp32, fp64, bf16, fp16, int32, int64.
void add_into(void* dst, const void* a, const void* b, int64_t n, c10::ScalarType dtype,
              int divisor = 1);

// dst[i] = (src[0][i] + src[1][i] + ... + src[k-1][i]) / divisor, added in
// that order, for i < n: fp32 and fp64 in their type, bf16 and fp16 in fp32
// and rounded once, integers exactly. dst must not overlap a source other
// than src[0] (which it may equal). k >= 1.
void sum_in_rank_order(void* dst, const void* const* src, int k, int64_t n, c10::ScalarType dtype, int divisor = 1);

}  // namespace fsdp::comm
