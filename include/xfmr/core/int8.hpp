// int8.hpp: the one definition of xfmr's int8 weights, symmetric and per
// row, shared by the CPU's int8 products (backend/cpu/int8_products.hpp)
// and int8 checkpoints (io/checkpoint.hpp's quantise_checkpoint), so that a
// saved row is the row int8 precision would make.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace xfmr::detail {

// One row's symmetric int8 quantisation: q[k] = round(w[k] / scale), scale
// = max |w| / 127 (0 for a row of zeros, whose q are all 0), so that
// |w[k] - scale q[k]| <= scale / 2 and q[k] lies in [-127, 127]. Returns
// scale.
inline float quantise_row_int8(const float* w, int n, std::int8_t* q) {
  float amax = 0.0f;
  for (int k = 0; k < n; ++k) amax = std::max(amax, std::fabs(w[k]));
  const float scale = amax / 127.0f;
  for (int k = 0; k < n; ++k)
    q[k] = scale > 0.0f ? std::int8_t(std::clamp(std::nearbyint(w[k] / scale), -127.0f, 127.0f)) : std::int8_t(0);
  return scale;
}

}  // namespace xfmr::detail
