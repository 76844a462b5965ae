// avx512_vnni.cpp: the int8 products of backend/cpu/kernels.hpp's avx512
// level on a CPU with AVX-512 VNNI (Ice Lake and Zen 4 on), compiled for
// x86-64-v4 with VNNI (CMakeLists.txt): vpdpbusd sums four products of a
// uint8 and an int8 into each int32 lane, 64 multiply-adds an instruction.
// Internal linkage throughout, as in avx512.cpp.
#include <immintrin.h>

#include <cstdint>

#include "kernels/levels.hpp"

namespace xfmr::detail::avx512_vnni {
namespace {

__mmask16 first_lanes(int n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593, as in avx512.cpp

// The horizontal sums of sixteen vectors of int32 lanes, in one: lane r
// holds the sum of a[r]'s lanes (avx512.cpp's sum16, in integers).
__m512i sum16_epi32(const __m512i (&a)[16]) {
  __m512i b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(a[2 * i], a[2 * i + 1], 0x44),
                            _mm512_shuffle_i32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    c[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(b[2 * i], b[2 * i + 1], 0x88),
                            _mm512_shuffle_i32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // the 64-bit pairs of 0x44 and 0xEE shuffles
    d[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(c[2 * i], c[2 * i + 1]), _mm512_unpackhi_epi64(c[2 * i], c[2 * i + 1]));
  const __m512 e = _mm512_castsi512_ps(d[0]), f = _mm512_castsi512_ps(d[1]);
  const __m512i s = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(e, f, 0x88)),
                                     _mm512_castps_si512(_mm512_shuffle_ps(e, f, 0xDD)));
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s);
}

// One block of Q's rows [r0, r0 + rows), rows <= 16, against M rows of U:
// lane r of I[m] = sum_k U[m, k] Q[r0 + r, k], lanes past `rows` zero. R of
// Q's rows a pass share each load of U's rows (R x M accumulators), and the
// next pass's R rows are prefetched into L2 meanwhile.
template <int M, int R>
void int8_block(int r0, int rows, int K, const std::int8_t* Q, long ldq, const std::uint8_t* U, long ldu, __m512i* I) {
  const int k_full = K - K % 64;
  const __mmask64 k_tail = K % 64 ? __mmask64(~0ull >> (64 - K % 64)) : __mmask64(0);
  __m512i acc[M][16];
  for (int r = 0; r < 16; r += R) {
    __m512i s[M][R];
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < R; ++j) s[m][j] = _mm512_setzero_si512();
    if (r < rows) {
      const std::int8_t* w[R];  // rows past the block read its last again, then are dropped
      for (int j = 0; j < R; ++j) w[j] = Q + long(r0 + (r + j < rows ? r + j : rows - 1)) * ldq;
      const auto add = [&](int k, __mmask64 lanes) {
        __m512i v[R];
        for (int j = 0; j < R; ++j) v[j] = _mm512_maskz_loadu_epi8(lanes, w[j] + k);
        for (int m = 0; m < M; ++m) {
          const __m512i x = _mm512_maskz_loadu_epi8(lanes, U + m * ldu + k);
          for (int j = 0; j < R; ++j) s[m][j] = _mm512_dpbusd_epi32(s[m][j], x, v[j]);
        }
      };
      for (int k = 0; k < k_full; k += 64) {
        for (int j = 0; j < R; ++j) _mm_prefetch(reinterpret_cast<const char*>(w[j] + 16 * ldq + k), _MM_HINT_T1);
        add(k, ~__mmask64(0));
      }
      if (k_tail) add(k_full, k_tail);
    }
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < R; ++j) acc[m][r + j] = r + j < rows ? s[m][j] : _mm512_setzero_si512();
  }
  for (int m = 0; m < M; ++m) I[m] = sum16_epi32(acc[m]);
}

#pragma GCC diagnostic pop

}  // namespace

// Sixteen of Q's rows a block, read from memory for the first eight rows of
// U and from cache for the rest; the fewer U's rows, the more of Q's a pass
// (at most sixteen accumulators).
void int8_product_rows(int n0, int n1, int M, int K, const std::int8_t* Q, long ldq, const float* scale,
                       const std::int32_t* q_sum, const std::uint8_t* U, long ldu, const ActivationScale* rows,
                       float* C, long ldc) {
  for (int r0 = n0; r0 < n1; r0 += 16) {
    const int live_rows = n1 - r0 < 16 ? n1 - r0 : 16;
    const __mmask16 live = first_lanes(live_rows);
    const __m512 s = _mm512_maskz_loadu_ps(live, scale + r0);
    const __m512i sums = _mm512_maskz_loadu_epi32(live, q_sum + r0);
    for (int m0 = 0; m0 < M; m0 += 8) {
      const int m_n = M - m0 < 8 ? M - m0 : 8;
      const std::uint8_t* u = U + long(m0) * ldu;
      __m512i I[8];
      switch (m_n) {
        case 1: int8_block<1, 16>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 2: int8_block<2, 8>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 3: int8_block<3, 4>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 4: int8_block<4, 4>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 5: int8_block<5, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 6: int8_block<6, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 7: int8_block<7, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        default: int8_block<8, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
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

}  // namespace xfmr::detail::avx512_vnni
