// avx2.cpp: the row kernels of backend/cpu/kernels.hpp for x86-64-v3 (AVX2,
// FMA, F16C), the only flags this file compiles with (CMakeLists.txt): the
// level of AMD's processors before Zen 4, Intel's client cores since Alder
// Lake and most cloud instances. Eight rows side by side, each with its own
// accumulator over the row in 8-wide steps (the masked tail last), and one
// transposing sum (sum8) for eight outputs; AVX2 has no masked byte or
// 16-bit loads, so narrow rows' tails are read through a small zeroed copy.
//
// As in avx512.cpp, everything but the table has internal linkage and no
// header that emits inline functions is included.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/levels.hpp"
#include "xfmr/core/q4.hpp"
#include "kernels/vector_exp.hpp"

namespace xfmr::detail::avx2 {
namespace {

// An int32 lane mask of lanes [0, n), for n <= 8 (n <= 0: none), as the
// masked loads and stores take it.
__m256i first_lanes(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }

float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
float lane_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// The horizontal sums of eight vectors in one: lane r holds the sum of
// a[r]'s lanes (hadd pairs the rows, the 128-bit halves are added last).
__m256 sum8(const __m256 (&a)[8]) {
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);  // rows 0-3 | 0-3, 4-7 | 4-7
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}
__m256i sum8_epi32(const __m256i (&a)[8]) {
  const __m256i h01 = _mm256_hadd_epi32(a[0], a[1]), h23 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i h45 = _mm256_hadd_epi32(a[4], a[5]), h67 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i lo = _mm256_hadd_epi32(h01, h23), hi = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
}

// acc[r], for r < rows, sums row r's elements at w + r ldw, widened to
// float32 by load(pointer, k_tail) (k_tail: the lanes of a last partial
// step, 8 for a full one), times x's, eight columns a step in order and the
// tail last; acc[r] past `rows` stays zero. Eight independent chains share
// each load of x, and the cache lines of the next block's rows (w + 8 ldw
// on) are prefetched into L2 meanwhile, a line every `line` columns.
template <class T, class Load>
void dot_rows_side_by_side(int rows, int K, const T* w, long ldw, const float* x, const Load& load, __m256 (&acc)[8]) {
  constexpr int kLine = 64 / int(sizeof(T));
  const int k_full = K - K % 8;
  for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
  for (int k = 0; k < k_full; k += 8) {
    if (k % kLine == 0)
      for (int r = 8; r < 16; ++r) _mm_prefetch(reinterpret_cast<const char*>(w + r * ldw + k), _MM_HINT_T1);
    const __m256 x8 = _mm256_loadu_ps(x + k);
    for (int r = 0; r < 8; ++r)
      if (r < rows) acc[r] = _mm256_fmadd_ps(load(w + r * ldw + k, 8), x8, acc[r]);
  }
  if (K > k_full) {
    const __m256 x8 = _mm256_maskload_ps(x + k_full, first_lanes(K - k_full));
    for (int r = 0; r < 8; ++r)
      if (r < rows) acc[r] = _mm256_fmadd_ps(load(w + r * ldw + k_full, K - k_full), x8, acc[r]);
  }
}

__m256 load_floats(const float* p, int lanes) {
  return lanes == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first_lanes(lanes));
}

void gemv_rows(int n0, int n1, int K, const float* W, long ldw, const float* x, float* y) {
  for (int r0 = n0; r0 < n1; r0 += 8) {
    const int rows = n1 - r0 < 8 ? n1 - r0 : 8;
    __m256 acc[8];
    dot_rows_side_by_side(rows, K, W + r0 * ldw, ldw, x, load_floats, acc);
    _mm256_maskstore_ps(y + r0, first_lanes(rows), sum8(acc));
  }
}

// One block of W's rows [r0, r0 + rows), rows <= 8, for M <= 4 rows of X:
// two W rows a pass share each load of x (eight accumulators, the sixteen
// registers' bound), each output's sums in gemv_rows's order.
template <int M>
void gemv_block_multi(int r0, int rows, int K, const float* W, long ldw, const float* X, long ldx, float* Y, long ldy) {
  const int k_full = K - K % 8;
  const __m256i k_tail = first_lanes(K % 8);
  __m256 acc[M][8];
  for (int r = 0; r < 8; r += 2) {
    __m256 a[M], b[M];
    for (int m = 0; m < M; ++m) a[m] = b[m] = _mm256_setzero_ps();
    if (r < rows) {
      const float* w0 = W + (r0 + r) * ldw;
      const float* w1 = r + 1 < rows ? w0 + ldw : w0;  // a last odd row is summed twice, then dropped
      for (int k = 0; k < k_full; k += 8) {
        _mm_prefetch(reinterpret_cast<const char*>(w0 + 2 * ldw + k), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(w0 + 3 * ldw + k), _MM_HINT_T1);
        const __m256 u = _mm256_loadu_ps(w0 + k), v = _mm256_loadu_ps(w1 + k);
        for (int m = 0; m < M; ++m) {
          const __m256 x = _mm256_loadu_ps(X + m * ldx + k);
          a[m] = _mm256_fmadd_ps(u, x, a[m]);
          b[m] = _mm256_fmadd_ps(v, x, b[m]);
        }
      }
      if (K > k_full) {
        const __m256 u = _mm256_maskload_ps(w0 + k_full, k_tail), v = _mm256_maskload_ps(w1 + k_full, k_tail);
        for (int m = 0; m < M; ++m) {
          const __m256 x = _mm256_maskload_ps(X + m * ldx + k_full, k_tail);
          a[m] = _mm256_fmadd_ps(u, x, a[m]);
          b[m] = _mm256_fmadd_ps(v, x, b[m]);
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      acc[m][r] = r < rows ? a[m] : _mm256_setzero_ps();
      acc[m][r + 1] = r + 1 < rows ? b[m] : _mm256_setzero_ps();
    }
  }
  for (int m = 0; m < M; ++m) _mm256_maskstore_ps(Y + m * ldy + r0, first_lanes(rows), sum8(acc[m]));
}

// Four rows of X at a time, each block of W's rows read from memory for the
// first four and from cache for the rest.
void gemv_rows_multi(int M, int n0, int n1, int K, const float* W, long ldw, const float* X, long ldx, float* Y,
                     long ldy) {
  for (int r0 = n0; r0 < n1; r0 += 8) {
    const int rows = n1 - r0 < 8 ? n1 - r0 : 8;
    for (int m0 = 0; m0 < M; m0 += 4) {
      const float* x = X + m0 * ldx;
      float* y = Y + m0 * ldy;
      switch (M - m0 < 4 ? M - m0 : 4) {
        case 1: gemv_rows(r0, r0 + rows, K, W, ldw, x, y); break;
        case 2: gemv_block_multi<2>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
        case 3: gemv_block_multi<3>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
        default: gemv_block_multi<4>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
      }
    }
  }
}

// NB panels from panel b for M rows of X (kernels.hpp's float panels), a
// panel's 16 rows in two 8-wide halves: 2 x NB x M chains of
// multiply-adds, every panel's stream prefetched 4 KiB ahead. The sums are
// avx512.cpp's, in the same order: the same bits.
template <int M, int NB>
void panel_pass(int b, int N, int K, const float* P, long stride, const float* X, long ldx, float* Y, long ldy) {
  __m256 acc[NB][M][2];
  for (auto& a : acc)
    for (auto& m : a) m[0] = m[1] = _mm256_setzero_ps();
  const float* p = P + b * stride;
  for (int k = 0; k < K; ++k, p += kPanelRows) {
    __m256 w[NB][2];
    for (int j = 0; j < NB; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(p + j * stride) + 4096, _MM_HINT_T0);
      w[j][0] = _mm256_loadu_ps(p + j * stride);
      w[j][1] = _mm256_loadu_ps(p + j * stride + 8);
    }
    for (int m = 0; m < M; ++m) {
      const __m256 x = _mm256_broadcast_ss(X + m * ldx + k);
      for (int j = 0; j < NB; ++j) {
        acc[j][m][0] = _mm256_fmadd_ps(w[j][0], x, acc[j][m][0]);
        acc[j][m][1] = _mm256_fmadd_ps(w[j][1], x, acc[j][m][1]);
      }
    }
  }
  for (int j = 0; j < NB; ++j) {
    const int r = (b + j) * kPanelRows;
    for (int m = 0; m < M; ++m) {
      _mm256_maskstore_ps(Y + m * ldy + r, first_lanes(N - r), acc[j][m][0]);
      _mm256_maskstore_ps(Y + m * ldy + r + 8, first_lanes(N - r - 8), acc[j][m][1]);
    }
  }
}

// Panels [b0, b1) for M <= 4 rows (sixteen registers: at most 8 chains),
// the rest half as many panels at a time.
template <int M, int NB>
void panel_passes(int& b, int b1, int N, int K, const float* P, long stride, const float* X, long ldx, float* Y,
                  long ldy) {
  for (; b + NB <= b1; b += NB) panel_pass<M, NB>(b, N, K, P, stride, X, ldx, Y, ldy);
  if constexpr (NB > 1) panel_passes<M, NB / 2>(b, b1, N, K, P, stride, X, ldx, Y, ldy);
}
template <int M>
void panel_rows_m(int b0, int b1, int N, int K, const float* P, long stride, const float* X, long ldx, float* Y,
                  long ldy) {
  panel_passes<M, M == 1 ? 4 : M == 2 ? 2 : 1>(b0, b1, N, K, P, stride, X, ldx, Y, ldy);
}

// Four rows of X at a time over each panel, read again from cache for the
// rest.
void panel_rows(int b0, int b1, int N, int M, int K, const float* P, long stride, const float* X, long ldx, float* Y,
                long ldy) {
  const int group = M > 4 ? 1 : b1 - b0;
  for (int g = b0; g < b1; g += group) {
    const int g1 = b1 - g < group ? b1 : g + group;
    for (int m0 = 0; m0 < M; m0 += 4) {
      const float* x = X + m0 * ldx;
      float* y = Y + m0 * ldy;
      switch (M - m0 < 4 ? M - m0 : 4) {
        case 1: panel_rows_m<1>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        case 2: panel_rows_m<2>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        case 3: panel_rows_m<3>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        default: panel_rows_m<4>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
      }
    }
  }
}

// bfloat16 bits widen to their float32 exactly: a shift into the high half.
__m256 widen_bf16(__m128i bits) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)); }
__m256 load_bf16(const std::uint16_t* p, int lanes) {
  if (lanes == 8) return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) std::uint16_t tail[8] = {};
  for (int i = 0; i < lanes; ++i) tail[i] = p[i];
  return widen_bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(tail)));
}

void gemv_rows_bf16(int n0, int n1, int K, const std::uint16_t* W, long ldw, const float* x, float* y) {
  for (int r0 = n0; r0 < n1; r0 += 8) {
    const int rows = n1 - r0 < 8 ? n1 - r0 : 8;
    __m256 acc[8];
    dot_rows_side_by_side(rows, K, W + r0 * ldw, ldw, x, load_bf16, acc);
    _mm256_maskstore_ps(y + r0, first_lanes(rows), sum8(acc));
  }
}

// One block of Q's rows [r0, r0 + rows), rows <= 8, against M rows of U:
// lane r of I[m] = sum_k U[m, k] Q[r0 + r, k] over k < K, lanes past `rows`
// zero. Both widen to int16 and vpmaddwd sums each pair into int32 exactly
// (vpmaddubsw, which takes the bytes as they are, would saturate: 2 x 255 x
// 127 > 32767); R of Q's rows a pass share each widened row of U; the last
// K % 16 columns are summed one by one.
template <int M, int R>
void int8_block(int r0, int rows, int K, const std::int8_t* Q, long ldq, const std::uint8_t* U, long ldu, __m256i* I) {
  const int k_full = K - K % 16;
  __m256i acc[M][8];
  for (int r = 0; r < 8; r += R) {
    __m256i s[M][R];
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < R; ++j) s[m][j] = _mm256_setzero_si256();
    const std::int8_t* w[R];  // rows past the block read its last again, then are dropped
    for (int j = 0; j < R; ++j) w[j] = Q + long(r0 + (r + j < rows ? r + j : rows - 1)) * ldq;
    if (r < rows) {
      for (int k = 0; k < k_full; k += 16) {
        if (k % 64 == 0)
          for (int j = 0; j < R; ++j) _mm_prefetch(reinterpret_cast<const char*>(w[j] + 8 * ldq + k), _MM_HINT_T1);
        __m256i v[R];
        for (int j = 0; j < R; ++j)
          v[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[j] + k)));
        for (int m = 0; m < M; ++m) {
          const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(U + m * ldu + k)));
          for (int j = 0; j < R; ++j) s[m][j] = _mm256_add_epi32(s[m][j], _mm256_madd_epi16(x, v[j]));
        }
      }
    }
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < R; ++j) acc[m][r + j] = r + j < rows ? s[m][j] : _mm256_setzero_si256();
  }
  for (int m = 0; m < M; ++m) {
    I[m] = sum8_epi32(acc[m]);
    if (K == k_full) continue;
    alignas(32) std::int32_t tail[8] = {};
    for (int r = 0; r < rows; ++r)
      for (int k = k_full; k < K; ++k)
        tail[r] += std::int32_t(U[m * ldu + k]) * std::int32_t(Q[long(r0 + r) * ldq + k]);
    I[m] = _mm256_add_epi32(I[m], _mm256_load_si256(reinterpret_cast<const __m256i*>(tail)));
  }
}

void int8_product_rows(int n0, int n1, int M, int K, const std::int8_t* Q, long ldq, const float* scale,
                       const std::int32_t* q_sum, const std::uint8_t* U, long ldu, const ActivationScale* rows,
                       float* C, long ldc) {
  for (int r0 = n0; r0 < n1; r0 += 8) {
    const int live_rows = n1 - r0 < 8 ? n1 - r0 : 8;
    const __m256i live = first_lanes(live_rows);
    const __m256 s = _mm256_maskload_ps(scale + r0, live);
    const __m256i sums = _mm256_maskload_epi32(q_sum + r0, live);
    for (int m0 = 0; m0 < M; m0 += 4) {
      const int m_n = M - m0 < 4 ? M - m0 : 4;
      const std::uint8_t* u = U + long(m0) * ldu;
      __m256i I[4];
      switch (m_n) {
        case 1: int8_block<1, 8>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 2: int8_block<2, 4>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 3: int8_block<3, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        default: int8_block<4, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
      }
      for (int m = 0; m < m_n; ++m) {
        const ActivationScale a = rows[m0 + m];
        const __m256i sum = _mm256_sub_epi32(I[m], _mm256_mullo_epi32(_mm256_set1_epi32(a.zero), sums));
        const __m256 c = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), s), _mm256_set1_ps(a.scale));
        _mm256_maskstore_ps(C + long(m0 + m) * ldc + r0, live, c);
      }
    }
  }
}

// 4-bit products (core/q4.hpp): half h of a panel (rows 8h..8h+7: each
// group's second 32 bytes for h = 1) against MT rows of activations. A
// group's low nibbles times four activations broadcast, and its high ones
// times four others, through vpmaddubsw (unsigned 4-bit times signed 8-bit,
// pairs summed in 16 bits: at most 2 x 15 x 127); a block's eight such
// products summed in 16 bits (at most 30480, exact) and widened once.
template <int MT>
void q4_half(const std::byte* P, long blocks, int h, const std::int8_t* Q, long ldq, const float* scale,
             const std::int32_t* offset, long lds, __m256* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
  for (long b = 0; b < blocks; ++b) {
    const std::byte* block = P + b * kQ4BlockBytes;
    for (int line = 0; line < kQ4BlockBytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(block) + 16384 + line, _MM_HINT_T0);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * h)));
    __m256i w[8];
    for (int g = 0; g < 4; ++g) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 + 64 * g + 32 * h));
      w[2 * g] = _mm256_and_si256(v, low);
      w[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    for (int m = 0; m < MT; ++m) {
      const std::int8_t* a = Q + m * ldq + b * kQ4Block;
      const auto four = [&](int k) {
        std::int32_t v;
        std::memcpy(&v, a + k, sizeof v);
        return _mm256_set1_epi32(v);
      };
      __m256i p = _mm256_maddubs_epi16(w[0], four(0));
      p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[1], four(16)));
      for (int g = 1; g < 4; ++g) {
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[2 * g], four(4 * g)));
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[2 * g + 1], four(16 + 4 * g)));
      }
      const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(p, ones), _mm256_set1_epi32(offset[m * lds + b]));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, _mm256_set1_ps(scale[m * lds + b])), acc[m]);
    }
  }
}

// One row of activations against NP panels, both halves of each at once
// (2 NP streams of weights, where one half at a time left them streaming
// at two thirds of int8's speed): each group's activations broadcast once
// for all of them; acc[2 j + h] is panel j's half h.
template <int NP>
void q4_one_row(const std::byte* P, long blocks, const std::int8_t* a_row, const float* scale,
                const std::int32_t* offset, __m256* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const long panel_bytes = blocks * kQ4BlockBytes;
  for (int i = 0; i < 2 * NP; ++i) acc[i] = _mm256_setzero_ps();
  for (long b = 0; b < blocks; ++b) {
    const std::int8_t* a = a_row + b * kQ4Block;
    const auto four = [&](int k) {
      std::int32_t v;
      std::memcpy(&v, a + k, sizeof v);
      return _mm256_set1_epi32(v);
    };
    __m256i p[2 * NP];
    for (int i = 0; i < 2 * NP; ++i) p[i] = _mm256_setzero_si256();
    for (int g = 0; g < 4; ++g) {
      const __m256i a_lo = four(4 * g), a_hi = four(16 + 4 * g);
      for (int i = 0; i < 2 * NP; ++i) {
        const std::byte* block = P + (i / 2) * panel_bytes + b * kQ4BlockBytes;
        if (g == 0)
          for (int line = 0; line < kQ4BlockBytes; line += 128)
            _mm_prefetch(reinterpret_cast<const char*>(block) + 16384 + line + 64 * (i % 2), _MM_HINT_T0);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 + 64 * g + 32 * (i % 2)));
        p[i] = _mm256_add_epi16(p[i], _mm256_maddubs_epi16(_mm256_and_si256(v, low), a_lo));
        p[i] = _mm256_add_epi16(p[i], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), a_hi));
      }
    }
    const __m256i o = _mm256_set1_epi32(offset[b]);
    const __m256 s = _mm256_set1_ps(scale[b]);
    for (int i = 0; i < 2 * NP; ++i) {
      const std::byte* block = P + (i / 2) * panel_bytes + b * kQ4BlockBytes;
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * (i % 2))));
      const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(p[i], ones), o);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, s), acc[i]);
    }
  }
}

}  // namespace

void q4_product_rows(int n0, int n1, int M, int K, const std::byte* P, const std::int8_t* Q, long ldq,
                     const float* scale, const std::int32_t* offset, long lds, float* C, long ldc) {
  const long blocks = (long(K) + kQ4Block - 1) / kQ4Block;  // (q4.hpp's functions would be compiled here for AVX2)
  if (M == 1) {  // two panels at a time
    for (int r0 = n0; r0 < n1; r0 += 2 * kQ4PanelRows) {
      const std::byte* panel = P + r0 / kQ4PanelRows * blocks * kQ4BlockBytes;
      __m256 acc[4];
      if (n1 - r0 > kQ4PanelRows) q4_one_row<2>(panel, blocks, Q, scale, offset, acc);
      else q4_one_row<1>(panel, blocks, Q, scale, offset, acc);
      for (int i = 0; i < 4 && r0 + 8 * i < n1; ++i) _mm256_maskstore_ps(C + r0 + 8 * i, first_lanes(n1 - r0 - 8 * i), acc[i]);
    }
    return;
  }
  for (int r0 = n0; r0 < n1; r0 += kQ4PanelRows) {
    const std::byte* panel = P + r0 / kQ4PanelRows * blocks * kQ4BlockBytes;
    for (int h = 0; h < 2; ++h) {
      const int first = r0 + 8 * h, live_rows = n1 - first < 8 ? n1 - first : 8;
      if (live_rows <= 0) break;
      const __m256i live = first_lanes(live_rows);
      for (int m0 = 0; m0 < M; m0 += 4) {
        const int m_n = M - m0 < 4 ? M - m0 : 4;
        const std::int8_t* q = Q + long(m0) * ldq;
        const float* s = scale + long(m0) * lds;
        const std::int32_t* o = offset + long(m0) * lds;
        __m256 acc[4];
        switch (m_n) {
          case 1: q4_half<1>(panel, blocks, h, q, ldq, s, o, lds, acc); break;
          case 2: q4_half<2>(panel, blocks, h, q, ldq, s, o, lds, acc); break;
          case 3: q4_half<3>(panel, blocks, h, q, ldq, s, o, lds, acc); break;
          default: q4_half<4>(panel, blocks, h, q, ldq, s, o, lds, acc); break;
        }
        for (int m = 0; m < m_n; ++m) _mm256_maskstore_ps(C + long(m0 + m) * ldc + first, live, acc[m]);
      }
    }
  }
}

namespace {

// The lanes of keys [j, j + 8) that are below n and not padded (pad: n
// bytes or null), as an int32 lane mask.
__m256i allowed_keys(int j, int n, const std::uint8_t* pad) {
  const __m256i live = first_lanes(n - j);
  if (!pad) return live;
  alignas(8) std::uint8_t bytes[8] = {};
  for (int i = 0; i < 8 && j + i < n; ++i) bytes[i] = pad[j + i];
  const __m256i padded = _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes))),
                                            _mm256_setzero_si256());
  return _mm256_andnot_si256(padded, live);
}

void softmax_row(const float* in, float* out, int n, int Tk, const std::uint8_t* pad) {
  const __m256 minus_inf = _mm256_set1_ps(-__builtin_inff());
  __m256 mx = minus_inf;
  for (int j = 0; j < n; j += 8) {
    const __m256 a = _mm256_castsi256_ps(allowed_keys(j, n, pad));  // a masked load: nothing is read past n
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(minus_inf, _mm256_maskload_ps(in + j, _mm256_castps_si256(a)), a));
  }
  const float m = lane_max(mx);
  if (m == -__builtin_inff()) {
    for (int j = 0; j < Tk; j += 8) _mm256_maskstore_ps(out + j, first_lanes(Tk - j), _mm256_setzero_ps());
    return;
  }
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) {
    const __m256i a = allowed_keys(j, n, pad);
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(a), vector_exp(_mm256_sub_ps(_mm256_maskload_ps(in + j, a), mv)));
    sum = _mm256_add_ps(sum, e);
    _mm256_maskstore_ps(out + j, first_lanes(n - j), e);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / lane_sum(sum));
  for (int j = 0; j < n; j += 8) {
    const __m256i live = first_lanes(n - j);
    _mm256_maskstore_ps(out + j, live, _mm256_mul_ps(_mm256_maskload_ps(out + j, live), inv));
  }
  for (int j = n; j < Tk; j += 8) _mm256_maskstore_ps(out + j, first_lanes(Tk - j), _mm256_setzero_ps());
}

}  // namespace

CpuKernels kernels() {
  CpuKernels k{};
  k.level = CpuLevel::avx2;
  k.gemv_rows = gemv_rows;
  k.multi_rows = 16;
  k.gemv_rows_multi = gemv_rows_multi;
  k.panel_rows = panel_rows;
  k.gemv_rows_bf16 = gemv_rows_bf16;
  k.int8_product_rows = int8_product_rows;
  k.int8_isa = "AVX2";
  k.q4_product_rows = q4_product_rows;
  k.q4_isa = "AVX2";
  k.softmax_row = softmax_row;
  return k;
}

}  // namespace xfmr::detail::avx2
