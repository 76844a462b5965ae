// avx512_vnni.cpp: the int8 products of backend/cpu/kernels.hpp's avx512
// level on a CPU with AVX-512 VNNI (Ice Lake and Zen 4 on), compiled for
// x86-64-v4 with VNNI (CMakeLists.txt): vpdpbusd sums four products of a
// uint8 and an int8 into each int32 lane, 64 multiply-adds an instruction.
// The weights are in kernels.hpp's blocked layout.
// Internal linkage throughout, as in avx512.cpp.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/levels.hpp"
#include "xfmr/core/q4.hpp"

namespace xfmr::detail::avx512_vnni {
namespace {

__mmask16 first_lanes(int n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// One block of 16 rows (kernels.hpp's blocked layout, `width` bytes a row)
// against M rows of U: lane r of I[m] = sum_k U[m, k] Q[r, k]. Each group
// of four columns is one load, multiplied by each of U's rows' four bytes
// broadcast; the weights 4 KiB ahead are prefetched (their stream crosses
// into the next block, the thread's rows being consecutive).
template <int M>
void int8_block(const std::int8_t* P, long width, const std::uint8_t* U, long ldu, __m512i* I) {
  __m512i acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_si512();
  for (long k = 0; k < width; k += 4) {
    const std::int8_t* group = P + k * kInt8BlockRows;
    _mm_prefetch(reinterpret_cast<const char*>(group + 4096), _MM_HINT_T0);
    const __m512i w = _mm512_loadu_si512(group);
    for (int m = 0; m < M; ++m) {
      std::int32_t u;
      std::memcpy(&u, U + m * ldu + k, sizeof u);
      acc[m] = _mm512_dpbusd_epi32(acc[m], _mm512_set1_epi32(u), w);
    }
  }
  for (int m = 0; m < M; ++m) I[m] = acc[m];
}

}  // namespace

// A block of 16 rows at a time, read from memory for the first eight rows
// of U and from cache for the rest. U's rows are read up to K rounded up to
// four bytes (within ldu), the padding's weights zero.
void int8_product_rows(int n0, int n1, int M, int K, const std::int8_t* Q, long ldq, const float* scale,
                       const std::int32_t* q_sum, const std::uint8_t* U, long ldu, const ActivationScale* rows,
                       float* C, long ldc) {
  (void)K;
  for (int r0 = n0; r0 < n1; r0 += kInt8BlockRows) {
    const int live_rows = n1 - r0 < kInt8BlockRows ? n1 - r0 : kInt8BlockRows;
    const __mmask16 live = first_lanes(live_rows);
    const std::int8_t* block = Q + long(r0) * ldq;
    const __m512 s = _mm512_maskz_loadu_ps(live, scale + r0);
    const __m512i sums = _mm512_maskz_loadu_epi32(live, q_sum + r0);
    for (int m0 = 0; m0 < M; m0 += 8) {
      const int m_n = M - m0 < 8 ? M - m0 : 8;
      const std::uint8_t* u = U + long(m0) * ldu;
      __m512i I[8];
      switch (m_n) {
        case 1:
          int8_block<1>(block, ldq, u, ldu, I);
          break;
        case 2:
          int8_block<2>(block, ldq, u, ldu, I);
          break;
        case 3:
          int8_block<3>(block, ldq, u, ldu, I);
          break;
        case 4:
          int8_block<4>(block, ldq, u, ldu, I);
          break;
        case 5:
          int8_block<5>(block, ldq, u, ldu, I);
          break;
        case 6:
          int8_block<6>(block, ldq, u, ldu, I);
          break;
        case 7:
          int8_block<7>(block, ldq, u, ldu, I);
          break;
        default:
          int8_block<8>(block, ldq, u, ldu, I);
          break;
      }
      for (int m = 0; m < m_n; ++m) {
        const ActivationScale a = rows[m0 + m];
        const __m512i sum = _mm512_sub_epi32(I[m], _mm512_mullo_epi32(_mm512_set1_epi32(a.zero), sums));
        const __m512 c = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), s), _mm512_set1_ps(a.scale));
        _mm512_mask_storeu_ps(C + long(m0 + m) * ldc + r0, live, c);
      }
    }
  }
}

namespace {

// 4-bit products (core/q4.hpp): NP consecutive panels' blocks against MT
// rows of activations. Each group's low nibbles are multiplied by four
// activations broadcast and its high nibbles by four others (vpdpbusd:
// unsigned 4-bit times signed 8-bit), into a block's 16 exact sums,
// started at the block's offset; then one fused multiply-add a block and
// row. One row reads four panels side by side: four streams and four
// times the independent work in flight, where one panel alone left the
// weights streaming at two thirds of int8's speed (a 11264 x 2048 matrix
// from memory, 16.6 against 26.0 GB/s; four panels 26.5); every panel is
// prefetched 16 KiB ahead (4 KiB did no better than the processor's own
// prefetchers).
template <int NP, int MT>
void q4_panels(const std::byte* P, long blocks, const std::int8_t* Q, long ldq, const float* scale,
               const std::int32_t* offset, long lds, __m512* acc) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const long panel_bytes = blocks * kQ4BlockBytes;
  for (int i = 0; i < NP * MT; ++i) acc[i] = _mm512_setzero_ps();
  for (long b = 0; b < blocks; ++b) {
    for (int j = 0; j < NP; ++j) {
      const std::byte* block = P + j * panel_bytes + b * kQ4BlockBytes;
      for (int line = 0; line < kQ4BlockBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block) + 16384 + line, _MM_HINT_T0);
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
      __m512i w[8];
      for (int g = 0; g < 4; ++g) {
        const __m512i v = _mm512_loadu_si512(block + 32 + 64 * g);
        w[2 * g] = _mm512_and_si512(v, low);
        w[2 * g + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      for (int m = 0; m < MT; ++m) {
        const std::int8_t* a = Q + m * ldq + b * kQ4Block;
        const auto four = [&](int k) {
          std::int32_t v;
          std::memcpy(&v, a + k, sizeof v);
          return _mm512_set1_epi32(v);
        };
        __m512i lo = _mm512_set1_epi32(offset[m * lds + b]), hi = _mm512_setzero_si512();
        for (int g = 0; g < 4; ++g) {
          lo = _mm512_dpbusd_epi32(lo, w[2 * g], four(4 * g));
          hi = _mm512_dpbusd_epi32(hi, w[2 * g + 1], four(16 + 4 * g));
        }
        const __m512i sum = _mm512_add_epi32(lo, hi);
        __m512& out = acc[j * MT + m];
        out = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(scale[m * lds + b])), out);
      }
    }
  }
}

}  // namespace

// One row of activations: four panels at a time. More rows: a panel at a
// time, eight rows of activations at a time against it (the panel read
// from memory for the first eight and from cache for the rest).
void q4_product_rows(int n0, int n1, int M, int K, const std::byte* P, const std::int8_t* Q, long ldq,
                     const float* scale, const std::int32_t* offset, long lds, float* C, long ldc) {
  const long blocks = (long(K) + kQ4Block - 1) / kQ4Block;  // (q4.hpp's functions would be compiled here)
  const int step = M == 1 ? 4 * kQ4PanelRows : kQ4PanelRows;
  for (int r0 = n0; r0 < n1; r0 += step) {
    const std::byte* panel = P + r0 / kQ4PanelRows * blocks * kQ4BlockBytes;
    if (M == 1) {
      __m512 acc[4];
      const int np = (n1 - r0 + kQ4PanelRows - 1) / kQ4PanelRows;
      if (np >= 4) q4_panels<4, 1>(panel, blocks, Q, ldq, scale, offset, lds, acc);
      else if (np >= 2) q4_panels<2, 1>(panel, blocks, Q, ldq, scale, offset, lds, acc);
      if (np == 3) q4_panels<1, 1>(panel + 2 * blocks * kQ4BlockBytes, blocks, Q, ldq, scale, offset, lds, acc + 2);
      if (np == 1) q4_panels<1, 1>(panel, blocks, Q, ldq, scale, offset, lds, acc);
      for (int j = 0; j < 4 && r0 + j * kQ4PanelRows < n1; ++j)
        _mm512_mask_storeu_ps(C + r0 + j * kQ4PanelRows, first_lanes(n1 - r0 - j * kQ4PanelRows), acc[j]);
      continue;
    }
    const __mmask16 live = first_lanes(n1 - r0);
    for (int m0 = 0; m0 < M; m0 += 8) {
      const int m_n = M - m0 < 8 ? M - m0 : 8;
      const std::int8_t* q = Q + long(m0) * ldq;
      const float* s = scale + long(m0) * lds;
      const std::int32_t* o = offset + long(m0) * lds;
      __m512 acc[8];
      switch (m_n) {
        case 2: q4_panels<1, 2>(panel, blocks, q, ldq, s, o, lds, acc); break;
        case 3: q4_panels<1, 3>(panel, blocks, q, ldq, s, o, lds, acc); break;
        case 4: q4_panels<1, 4>(panel, blocks, q, ldq, s, o, lds, acc); break;
        case 5: q4_panels<1, 5>(panel, blocks, q, ldq, s, o, lds, acc); break;
        case 6: q4_panels<1, 6>(panel, blocks, q, ldq, s, o, lds, acc); break;
        case 7: q4_panels<1, 7>(panel, blocks, q, ldq, s, o, lds, acc); break;
        case 1: q4_panels<1, 1>(panel, blocks, q, ldq, s, o, lds, acc); break;
        default: q4_panels<1, 8>(panel, blocks, q, ldq, s, o, lds, acc); break;
      }
      for (int m = 0; m < m_n; ++m) _mm512_mask_storeu_ps(C + long(m0 + m) * ldc + r0, live, acc[m]);
    }
  }
}

}  // namespace xfmr::detail::avx512_vnni
