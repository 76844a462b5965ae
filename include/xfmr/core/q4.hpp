// q4.hpp: the one definition of xfmr's 4-bit weights, shared by the CPU's
// 4-bit products (backend/cpu/q4_products.hpp, the kernels of each level),
// 4-bit checkpoints (io/checkpoint.hpp's quantise_model) and what reads
// them back (io/weight_sources.hpp); and of the int8 activations those
// products quantise as they go.
//
// A weight matrix W (N, K), rows the outputs of y = x W^T, is cut into
// blocks of 32 consecutive weights of a row, each with its own scale d
// (float16) and 4-bit values q in [0, 15]: w ~ d (q - 8). d is the block's
// value of largest magnitude over -8, rounded to float16, so that value is
// exact (q = 0) and the others round to nearest, q = clamp(round(w / d) +
// 8, 0, 15); a block of zeros has d = 0 and q = 8. 4.5 bits a weight, as
// llama.cpp's Q4_0, whose numbers these are.
//
// The bytes are laid out for the kernels, which read them in place: 16
// rows at a time (a panel; the last padded with rows of zeros), each of a
// panel's blocks kQ4BlockBytes = 288 bytes:
//   [0, 32)    the 16 rows' scales, float16, little-endian, row 0 first;
//   [32, 288)  four groups g of 64 bytes: row i's four bytes 4i..4i+3, byte
//              j's low nibble q[4g + j] and its high nibble q[16 + 4g + j]
//              (the block's k numbered from 0).
// One 512-bit load is a group: AVX-512 VNNI multiplies its low nibbles by
// four activations broadcast, its high nibbles by four others, into the 16
// rows' sums with no horizontal sum (AVX2 does the same in two halves),
// and a panel is one stream of bytes. K is padded to whole blocks (q = 8:
// weights of zero). A tensor of a 4-bit checkpoint holds these bytes as
// U8 of shape (panels, blocks, 288).
//
// The products quantise each row of activations afresh, a block of 32 at a
// time, symmetric int8: s = max |a| / 127, a_q = round(a / s) (s = 0 and
// a_q = 0 for a block of zeros; s = NaN for one with a NaN or infinity).
// Then y[m, n] is, over the blocks b in order from zero,
//   acc = fma(float(I_b), d_nb * s_mb, acc),
//   I_b = sum_k a_q[k] q[k] - 8 sum_k a_q[k]   (int32, exact),
// so that an output is the same bits for any rows beside it and at every
// level (test_q4 checks each level against this formula).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "xfmr/core/half.hpp"
#include "xfmr/core/int8.hpp"

namespace xfmr::detail {

inline constexpr int kQ4Block = 32;             // weights a scale
inline constexpr int kQ4PanelRows = 16;         // rows a panel
inline constexpr int kQ4BlockBytes = 32 + 256;  // a panel's block: 16 scales, then 4 groups of 64 bytes
inline long q4_blocks(long K) { return (K + kQ4Block - 1) / kQ4Block; }
inline long q4_panels(long N) { return (N + kQ4PanelRows - 1) / kQ4PanelRows; }
// The bytes of panel p's block b start at P + q4_offset(K, p, b); a matrix's bytes.
inline std::size_t q4_offset(long K, long p, long b) { return std::size_t(p * q4_blocks(K) + b) * kQ4BlockBytes; }
inline std::size_t q4_bytes(long N, long K) { return std::size_t(q4_panels(N) * q4_blocks(K)) * kQ4BlockBytes; }

// The largest weight a float16 scale can hold: 8 x 65504.
inline constexpr float kQ4MaxWeight = 8.0f * 65504.0f;

// Quantises n <= 32 weights (the rest of the block zeros) into q[0, 32);
// returns the scale's float16 bits. |w| must be at most kQ4MaxWeight and
// finite (the caller checks). Always inlined, as what calls it: a CPU
// level's copy never stands in for another's (q4_products.hpp).
[[gnu::always_inline]] inline std::uint16_t q4_quantise_block(const float* w, int n, std::uint8_t* q) {
  alignas(64) float x[kQ4Block] = {};  // the block, zeros past n: every loop below a whole vector's
  std::copy_n(w, n, x);
  const float amax = largest_magnitude(x, kQ4Block);
  float extreme = 0.0f;  // the first value of largest magnitude, with its sign
  for (int k = 0; k < kQ4Block; ++k)
    if (std::fabs(x[k]) == amax) {
      extreme = x[k];
      break;
    }
  const std::uint16_t bits = float_to_half(extreme / -8.0f);
  const float d = half_to_float(bits);
  if (d == 0.0f) {
    std::fill(q, q + kQ4Block, std::uint8_t(8));
    return bits;
  }
  for (int k = 0; k < kQ4Block; ++k) q[k] = std::uint8_t(std::clamp(std::nearbyint(x[k] / d) + 8.0f, 0.0f, 15.0f));
  return bits;
}

// Panel p of W (N, K), rows ldw apart, quantised into its q4_blocks(K)
// blocks at P (kQ4BlockBytes each).
[[gnu::always_inline]] inline void q4_pack_panel(long p, int N, int K, const float* W, long ldw, std::byte* P) {
  const long blocks = q4_blocks(K);
  std::uint8_t q[kQ4PanelRows][kQ4Block];
  for (long b = 0; b < blocks; ++b) {
    std::byte* out = P + b * kQ4BlockBytes;
    const int k0 = int(b * kQ4Block), n = std::min(kQ4Block, K - k0);
    for (int i = 0; i < kQ4PanelRows; ++i) {
      const long r = p * kQ4PanelRows + i;
      std::uint16_t scale = 0;
      if (r < N) scale = q4_quantise_block(W + r * ldw + k0, n, q[i]);
      else std::fill(q[i], q[i] + kQ4Block, std::uint8_t(8));
      std::memcpy(out + 2 * i, &scale, 2);
    }
    for (int g = 0; g < 4; ++g)
      for (int i = 0; i < kQ4PanelRows; ++i)
        for (int j = 0; j < 4; ++j)
          out[32 + 64 * g + 4 * i + j] = std::byte(q[i][4 * g + j] | (q[i][16 + 4 * g + j] << 4));
  }
}

// Row i of a panel's block (its bytes at `block`): q[0, 32) and the scale.
inline float q4_unpack_row(const std::byte* block, int i, std::uint8_t* q) {
  std::uint16_t scale;
  std::memcpy(&scale, block + 2 * i, 2);
  for (int g = 0; g < 4; ++g)
    for (int j = 0; j < 4; ++j) {
      const auto v = std::to_integer<std::uint8_t>(block[32 + 64 * g + 4 * i + j]);
      q[4 * g + j] = v & 15;
      q[16 + 4 * g + j] = v >> 4;
    }
  return half_to_float(scale);
}

// Rows [r0, r1) and columns [c0, c1) (c0 a multiple of kQ4Block) of the
// 4-bit matrix P (K columns) as float32, d (q - 8), exact (a float16 scale
// times an integer of 4 bits), into out (ldo apart).
inline void q4_dequantise(const std::byte* P, long K, long r0, long r1, long c0, long c1, float* out, long ldo) {
  std::uint8_t q[kQ4Block];
  for (long r = r0; r < r1; ++r)
    for (long b = c0 / kQ4Block; b < q4_blocks(c1); ++b) {
      const float d = q4_unpack_row(P + q4_offset(K, r / kQ4PanelRows, b), int(r % kQ4PanelRows), q);
      for (long k = b * kQ4Block; k < std::min(c1, (b + 1) * kQ4Block); ++k)
        out[(r - r0) * ldo + k - c0] = d * float(int(q[k - b * kQ4Block]) - 8);
    }
}
// Row r of the 4-bit matrix P (K columns) as float32.
inline void q4_dequantise_row(const std::byte* P, long K, long r, float* out) { q4_dequantise(P, K, r, r + 1, 0, K, out, K); }

// One activation row's blocks (see above) into a_q (K rounded up to whole
// blocks, zeros past K), their scales and -8 times their sums. Always
// inlined: a level's copy never stands in for another's (q4_products.hpp).
[[gnu::always_inline]] inline void q4_quantise_activations(const float* a, int K, std::int8_t* q, float* scale,
                                                          std::int32_t* offset) {
  for (long b = 0; b < q4_blocks(K); ++b) {
    const int k0 = int(b * kQ4Block), n = std::min(kQ4Block, K - k0);
    float amax = 0.0f;
    bool finite = true;
    for (int k = 0; k < n; ++k) {
      amax = std::max(amax, std::fabs(a[k0 + k]));
      finite = finite && std::isfinite(a[k0 + k]);
    }
    std::int32_t sum = 0;
    if (!finite || amax == 0.0f) {
      std::fill(q + k0, q + k0 + kQ4Block, std::int8_t(0));
      scale[b] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    } else {
      const float s = amax / 127.0f, inv = 1.0f / s;
      for (int k = 0; k < kQ4Block; ++k) {
        const std::int8_t v =
            k < n ? std::int8_t(std::clamp(std::nearbyint(a[k0 + k] * inv), -127.0f, 127.0f)) : std::int8_t(0);
        q[k0 + k] = v;
        sum += v;
      }
      scale[b] = s;
    }
    offset[b] = -8 * sum;
  }
}

}  // namespace xfmr::detail
