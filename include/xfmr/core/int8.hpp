// int8.hpp: the one definition of xfmr's int8 weights, symmetric and per
// row, shared by the CPU's int8 products (backend/cpu/int8_products.hpp)
// and int8 checkpoints (io/checkpoint.hpp's quantise_checkpoint), so that a
// saved row is the row int8 precision would make; and of the activations
// those products quantise as they go, unsigned and per row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace xfmr::detail {

// The largest |x[k]| of n finite values, as their bits' largest (an
// integer maximum, which vectorises where a float one does not).
[[gnu::always_inline]] inline float largest_magnitude(const float* x, long n) {
  std::uint32_t largest = 0;
  for (long k = 0; k < n; ++k) {
    std::uint32_t bits;
    std::memcpy(&bits, x + k, sizeof bits);
    largest = std::max(largest, bits & 0x7fffffffu);
  }
  float v;
  std::memcpy(&v, &largest, sizeof v);
  return v;
}

// One row's symmetric int8 quantisation: q[k] = round(w[k] / scale), scale
// = max |w| / 127 (0 for a row of zeros, whose q are all 0), so that
// |w[k] - scale q[k]| <= scale / 2 and q[k] lies in [-127, 127]. Returns
// scale.
[[gnu::always_inline]] inline float quantise_row_int8(const float* w, int n, std::int8_t* q) {
  const float amax = largest_magnitude(w, n);
  const float scale = amax / 127.0f;
  for (int k = 0; k < n; ++k)
    q[k] = scale > 0.0f ? std::int8_t(std::clamp(std::nearbyint(w[k] / scale), -127.0f, 127.0f)) : std::int8_t(0);
  return scale;
}

// One activation row's asymmetric uint8 quantisation, made afresh for each
// product (dynamic, as PyTorch's quantize_dynamic and ONNX Runtime's
// dynamic int8 do, but per row rather than per tensor, so that a row's
// numbers never depend on the rows beside it): over [lo, hi] = [min(0,
// min a), max(0, max a)], scale = (hi - lo) / 255 and zero = round(-lo /
// scale) in [0, 255], u[k] = clamp(round(a[k] / scale) + zero, 0, 255), so
// that a[k] ~ scale (u[k] - zero) within scale / 2 (1 ulp or so more where
// the clamp meets the range's ends) and 0 is exact. A row of zeros gives
// scale 0 and u = 0; a row with an infinity or NaN gives scale NaN (the
// products it feeds are NaN, as float32's would be).
struct ActivationScale {
  float scale = 0;
  int zero = 0;
};
// Always inlined: a copy compiled for one CPU level never stands in for
// another's (backend/cpu/ops.hpp's quantise_rows).
[[gnu::always_inline]] inline ActivationScale quantise_activation_u8(const float* a, int n, std::uint8_t* u) {
  float lo = 0.0f, hi = 0.0f;
  bool finite = true;
  for (int k = 0; k < n; ++k) {
    lo = std::min(lo, a[k]), hi = std::max(hi, a[k]);
    finite = finite && std::isfinite(a[k]);
  }
  if (!finite) {
    std::fill(u, u + n, std::uint8_t(0));
    return {std::numeric_limits<float>::quiet_NaN(), 0};
  }
  if (hi == lo) {
    std::fill(u, u + n, std::uint8_t(0));
    return {};
  }
  const float scale = (hi - lo) / 255.0f, inv = 1.0f / scale;
  const float zero = std::clamp(std::nearbyint(-lo * inv), 0.0f, 255.0f);
  for (int k = 0; k < n; ++k) u[k] = std::uint8_t(std::clamp(std::nearbyint(a[k] * inv) + zero, 0.0f, 255.0f));
  return {scale, int(zero)};
}

}  // namespace xfmr::detail
