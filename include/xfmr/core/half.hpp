// half.hpp: IEEE 754 half precision (float16) to float32 and back, for
// the stored formats that hold it (safetensors' F16, the 4-bit weights'
// scales: core/q4.hpp). float16 has 5 exponent bits and 11 significant
// bits: normal values from 2^-14 to 65504, subnormals down to 2^-24.
#pragma once

#include <bit>
#include <cstdint>

namespace xfmr::detail {

// Exact: every float16 is a float32.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: renormalise
    exp = 113;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// The float16 nearest x (ties to even, as F16C's vcvtps2ph with rounding
// to nearest); past 65504 (rounded) infinity, NaN a quiet NaN.
inline std::uint16_t float_to_half(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // 65520 and up (and infinity): infinity
  if (a < 0x38800000u) {                                       // below 2^-14: subnormal or zero
    if (a < 0x33000000u) return sign;                           // below half the smallest subnormal (2^-25)
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - int(a >> 23);                        // 14..24: the bits below the subnormal's unit
    const std::uint32_t q = mant >> shift, rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    return std::uint16_t(sign | (q + (rest > half || (rest == half && (q & 1u)))));
  }
  const std::uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);  // ties to even at bit 13
  return std::uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

}  // namespace xfmr::detail
