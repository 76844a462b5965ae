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

}  // namespace xfmr::detail::avx512_vnni
