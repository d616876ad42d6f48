// fsdp-cpp: local reduction kernels (see reduce.h).
#include "comm/reduce.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

// T is the stored type, Acc the type every addition happens in.
template <class T, class Acc>
void add_typed(void* dst, const void* a, const void* b, int64_t n, int divisor) {
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  if (divisor == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<Acc>(x[i]) + static_cast<Acc>(y[i]));
  } else {
    // Divide (not multiply by 1/N): matches what a reference computes as sum / N.
    const Acc div = static_cast<Acc>(divisor);
    for (int64_t i = 0; i < n; ++i)
      d[i] = static_cast<T>((static_cast<Acc>(x[i]) + static_cast<Acc>(y[i])) / div);
  }
}

}  // namespace

void add_into(void* dst, const void* a, const void* b, int64_t n, c10::ScalarType dtype, int divisor) {
  switch (dtype) {
    case c10::kFloat: return add_typed<float, float>(dst, a, b, n, divisor);
    case c10::kDouble: return add_typed<double, double>(dst, a, b, n, divisor);
    case c10::kBFloat16: return add_typed<c10::BFloat16, float>(dst, a, b, n, divisor);
    case c10::kHalf: return add_typed<c10::Half, float>(dst, a, b, n, divisor);
    case c10::kInt:
      FSDP_CHECK(divisor == 1, "integer AVG must be rejected at issue time");
      return add_typed<int32_t, int32_t>(dst, a, b, n, 1);
    case c10::kLong:
      FSDP_CHECK(divisor == 1, "integer AVG must be rejected at issue time");
      return add_typed<int64_t, int64_t>(dst, a, b, n, 1);
    default:
      FSDP_CHECK(false, "dtype ", dtype, " must be rejected at issue time");
  }
}

}  // namespace fsdp::comm
