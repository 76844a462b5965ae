// avx512.cpp: the row kernels of backend/cpu/kernels.hpp for x86-64-v4
// (AVX-512 F, BW, CD, DQ, VL), the only flags this file compiles with
// (CMakeLists.txt). Sixteen rows side by side: sixteen outputs share one
// transposing sum (sum16) where Eigen's kernels spend one horizontal sum on
// each, and the softmax works in masked 16-wide vectors throughout.
//
// Everything here but the table has internal linkage, and no header that
// would emit an inline function compiled for AVX-512 is included (Eigen's,
// the standard library's containers): a copy of one, merged by the linker
// with the portable build's, could run on a CPU without AVX-512
// (test/CMakeLists.txt's level_objects_share_no_symbols checks).
#include <immintrin.h>

#include <cstdint>

#include "kernels/levels.hpp"
#include "kernels/vector_exp.hpp"

namespace xfmr::detail::avx512 {
namespace {

// Lanes [0, n) of a 16-wide vector, for n <= 16 (n <= 0: none).
__mmask16 first_lanes(int n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// The sum and the maximum of a vector's lanes (GCC 12's _mm512_reduce_*
// warn of an uninitialised variable inside its own header).
float lane_sum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0x4E));
  return _mm512_cvtss_f32(_mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0xB1)));
}
float lane_max(__m512 v) {
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  v = _mm512_max_ps(v, _mm512_shuffle_ps(v, v, 0x4E));
  return _mm512_cvtss_f32(_mm512_max_ps(v, _mm512_shuffle_ps(v, v, 0xB1)));
}

// GCC 12 warns, inlining the shuffles below, that _mm512_shuffle_f32x4's
// undefined passthrough operand is used uninitialized (GCC bug 105593,
// fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"

// The horizontal sums of sixteen vectors, in one vector: lane r holds the
// sum of a[r]'s lanes. A tree of 15 shuffle-and-add steps, each halving the
// number of vectors while doubling the rows each lane stands for.
__m512 sum16(const __m512 (&a)[16]) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)  // 256-bit halves: b[i] = rows 2i, 2i+1 (two 128-bit lanes each)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit lanes: c[i] lane l = row 4i + l
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // pairs within lanes: d[i] lane l = rows 8i + l (lane half 0), 8i + 4 + l
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44), _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
  // Element 4l + p now holds row l + 4p: transpose the 4 x 4 back.
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s);
}

// Rows [n0, n1) of y = W x, sixteen rows at a time: dot(w) gives row w's
// products summed into one vector (read in memory order, which streams from
// L2 about 15% faster than sixteen rows a chunk at a time), then one sum16
// gives the sixteen outputs. A last partial block leaves its missing rows zero.
template <class Dot>
void gemv_blocks(int n0, int n1, const float* W, long ldw, float* y, const Dot& dot) {
  for (int r0 = n0; r0 < n1; r0 += 16) {
    const int rows = n1 - r0 < 16 ? n1 - r0 : 16;
    __m512 acc[16];
    for (int r = 0; r < 16; ++r) acc[r] = r < rows ? dot(W + (r0 + r) * ldw) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(y + r0, first_lanes(rows), sum16(acc));
  }
}

// Any K: a K that is not a multiple of 16 ends with masked loads.
void gemv_rows_general(int n0, int n1, int K, const float* W, long ldw, const float* x, float* y) {
  const __mmask16 k_tail = first_lanes(K % 16);
  const int k_full = K - K % 16;
  gemv_blocks(n0, n1, W, ldw, y, [=](const float* w) {
    __m512 a = _mm512_setzero_ps();
    for (int k = 0; k < k_full; k += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a);
    if (k_tail) a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k_tail, w + k_full), _mm512_maskz_loadu_ps(k_tail, x + k_full), a);
    return a;
  });
}

// K = 16 * NK, with x held in registers: the multiply-adds of
// gemv_rows_general in the same order, so the same bits, with one load per
// sixteen weights instead of two. A decoding step of shakespeare-small ran
// 15-30% faster on one core than with x loaded for each row block.
template <int NK>
void gemv_rows_fixed(int n0, int n1, const float* W, long ldw, const float* x, float* y) {
  __m512 xv[NK];
  for (int k = 0; k < NK; ++k) xv[k] = _mm512_loadu_ps(x + 16 * k);
  gemv_blocks(n0, n1, W, ldw, y, [&xv](const float* w) {
    __m512 a = _mm512_setzero_ps();
    for (int k = 0; k < NK; ++k) a = _mm512_fmadd_ps(_mm512_loadu_ps(w + 16 * k), xv[k], a);
    return a;
  });
}

void gemv_rows(int n0, int n1, int K, const float* W, long ldw, const float* x, float* y) {
  switch (K) {
    case 16: return gemv_rows_fixed<1>(n0, n1, W, ldw, x, y);
    case 32: return gemv_rows_fixed<2>(n0, n1, W, ldw, x, y);
    case 64: return gemv_rows_fixed<4>(n0, n1, W, ldw, x, y);
    case 128: return gemv_rows_fixed<8>(n0, n1, W, ldw, x, y);
    case 256: return gemv_rows_fixed<16>(n0, n1, W, ldw, x, y);
    default: return gemv_rows_general(n0, n1, K, W, ldw, x, y);
  }
}

// One block of W's rows [r0, r0 + rows), rows <= 16, for M <= 8 rows of X:
// two W rows a pass share each load of x, the next pass's rows prefetched
// into L2 (on the 2-core Zen 5 of BENCHMARKS.md, eight rows of gpt2-small's
// shapes are bound by the multiply-adds: the pairs and the prefetch made
// them 1.5x faster, 65% of the cores' multiply-add rate). Each output's sums
// are gemv_rows_general's, in its order.
template <int M>
void gemv_block_multi(int r0, int rows, int K, const float* W, long ldw, const float* X, long ldx, float* Y, long ldy) {
  const __mmask16 k_tail = first_lanes(K % 16);
  const int k_full = K - K % 16;
  // Rows w0 and, when two, w0 + ldw: their sums for each row of X into a[m] and b[m].
  const auto pass = [&](const float* w0, bool two, __m512 (&a)[M], __m512 (&b)[M]) {
    for (int m = 0; m < M; ++m) a[m] = b[m] = _mm512_setzero_ps();
    const float* w1 = two ? w0 + ldw : w0;
    for (int k = 0; k < k_full; k += 16) {
      // The next pass's two rows into L2 meanwhile (past the matrix, a
      // prefetch does nothing): reading W then overlaps the multiply-adds.
      _mm_prefetch(reinterpret_cast<const char*>(w0 + 2 * ldw + k), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(w0 + 3 * ldw + k), _MM_HINT_T1);
      const __m512 u = _mm512_loadu_ps(w0 + k), v = _mm512_loadu_ps(w1 + k);
      for (int m = 0; m < M; ++m) {
        const __m512 x = _mm512_loadu_ps(X + m * ldx + k);
        a[m] = _mm512_fmadd_ps(u, x, a[m]);
        b[m] = _mm512_fmadd_ps(v, x, b[m]);
      }
    }
    if (k_tail) {
      const __m512 u = _mm512_maskz_loadu_ps(k_tail, w0 + k_full), v = _mm512_maskz_loadu_ps(k_tail, w1 + k_full);
      for (int m = 0; m < M; ++m) {
        const __m512 x = _mm512_maskz_loadu_ps(k_tail, X + m * ldx + k_full);
        a[m] = _mm512_fmadd_ps(u, x, a[m]);
        b[m] = _mm512_fmadd_ps(v, x, b[m]);
      }
    }
  };
  __m512 acc[M][16];
  for (int r = 0; r < 16; r += 2) {
    __m512 a[M], b[M];
    if (r < rows) pass(W + (r0 + r) * ldw, r + 1 < rows, a, b);
    for (int m = 0; m < M; ++m) {
      acc[m][r] = r < rows ? a[m] : _mm512_setzero_ps();
      acc[m][r + 1] = r + 1 < rows ? b[m] : _mm512_setzero_ps();  // a last odd row's pass summed it twice
    }
  }
  for (int m = 0; m < M; ++m) _mm512_mask_storeu_ps(Y + m * ldy + r0, first_lanes(rows), sum16(acc[m]));
}

// Eight rows of X at a time (the registers hold two W rows' sums for
// eight), each block of W's rows read from memory for the first eight and
// from L2 for the next.
void gemv_rows_multi(int M, int n0, int n1, int K, const float* W, long ldw, const float* X, long ldx, float* Y,
                     long ldy) {
  for (int r0 = n0; r0 < n1; r0 += 16) {
    const int rows = n1 - r0 < 16 ? n1 - r0 : 16;
    for (int m0 = 0; m0 < M; m0 += 8) {
      const float* x = X + m0 * ldx;
      float* y = Y + m0 * ldy;
      switch (M - m0 < 8 ? M - m0 : 8) {
        case 1: gemv_rows_general(r0, r0 + rows, K, W, ldw, x, y); break;
        case 2: gemv_block_multi<2>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
        case 3: gemv_block_multi<3>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
        case 4: gemv_block_multi<4>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
        case 5: gemv_block_multi<5>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
        case 6: gemv_block_multi<6>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
        case 7: gemv_block_multi<7>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
        default: gemv_block_multi<8>(r0, rows, K, W, ldw, x, ldx, y, ldy); break;
      }
    }
  }
}

// NB panels from panel b for M rows of X (kernels.hpp's float panels):
// NB x M chains of multiply-adds, one 64-byte load a panel and one
// broadcast a row for each k, every panel's stream prefetched 4 KiB ahead
// (with only the processor's prefetchers, eight rows read it at a third of
// the bandwidth).
template <int M, int NB>
void panel_pass(int b, int N, int K, const float* P, long stride, const float* X, long ldx, float* Y, long ldy) {
  __m512 acc[NB][M];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  const float* p = P + b * stride;
  for (int k = 0; k < K; ++k, p += kPanelRows) {
    __m512 w[NB];
    for (int j = 0; j < NB; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(p + j * stride) + 4096, _MM_HINT_T0);
      w[j] = _mm512_loadu_ps(p + j * stride);
    }
    for (int m = 0; m < M; ++m) {
      const __m512 x = _mm512_set1_ps(X[m * ldx + k]);
      for (int j = 0; j < NB; ++j) acc[j][m] = _mm512_fmadd_ps(w[j], x, acc[j][m]);
    }
  }
  for (int j = 0; j < NB; ++j) {
    const int r = (b + j) * kPanelRows;
    for (int m = 0; m < M; ++m) _mm512_mask_storeu_ps(Y + m * ldy + r, first_lanes(N - r), acc[j][m]);
  }
}

// Panels [b0, b1) for M <= 8 rows: as many panels at once as keep 8 to 16
// chains (one row's alone would wait on its multiply-adds' latency), the
// rest half as many at a time.
template <int M, int NB>
void panel_passes(int& b, int b1, int N, int K, const float* P, long stride, const float* X, long ldx, float* Y,
                  long ldy) {
  for (; b + NB <= b1; b += NB) panel_pass<M, NB>(b, N, K, P, stride, X, ldx, Y, ldy);
  if constexpr (NB > 1) panel_passes<M, NB / 2>(b, b1, N, K, P, stride, X, ldx, Y, ldy);
}
template <int M>
void panel_rows_m(int b0, int b1, int N, int K, const float* P, long stride, const float* X, long ldx, float* Y,
                  long ldy) {
  panel_passes<M, M == 1 ? 8 : M <= 4 ? 4 : 2>(b0, b1, N, K, P, stride, X, ldx, Y, ldy);
}

void panel_rows(int b0, int b1, int N, int M, int K, const float* P, long stride, const float* X, long ldx, float* Y,
                long ldy) {
  // Past eight rows, eight at a time over each pair of panels, read again
  // from cache.
  const int group = M > 8 ? 2 : b1 - b0;
  for (int g = b0; g < b1; g += group) {
    const int g1 = b1 - g < group ? b1 : g + group;
    for (int m0 = 0; m0 < M; m0 += 8) {
      const float* x = X + m0 * ldx;
      float* y = Y + m0 * ldy;
      switch (M - m0 < 8 ? M - m0 : 8) {
        case 1: panel_rows_m<1>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        case 2: panel_rows_m<2>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        case 3: panel_rows_m<3>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        case 4: panel_rows_m<4>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        case 5: panel_rows_m<5>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        case 6: panel_rows_m<6>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        case 7: panel_rows_m<7>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
        default: panel_rows_m<8>(g, g1, N, K, P, stride, x, ldx, y, ldy); break;
      }
    }
  }
}

// Rows [n0, n1) of y = W x with W in bfloat16: each widens to its float32
// exactly (a shift). Sixteen rows side by side, each read 64 bytes (32
// values) a load: their even columns widened by a shift, their odd ones by
// a mask, each half against x's matching columns (x_even, x_odd: x split
// once a product), so a load costs two multiply-adds and no conversion;
// and the next sixteen rows' lines are prefetched as these are read (16
// independent chains of multiply-adds share each x load).
void gemv_rows_bf16(int n0, int n1, int K, const std::uint16_t* W, long ldw, const float* x, float* y) {
  const int k_full = K - K % 32;
  alignas(64) float xs[2][4096];  // x's even and odd columns up to 8192
  const bool split = k_full <= 8192;
  if (split)
    for (int k = 0; k < k_full; k += 2) xs[0][k / 2] = x[k], xs[1][k / 2] = x[k + 1];
  const __m512i high = _mm512_set1_epi32(int(0xFFFF0000u));
  for (int r0 = n0; r0 < n1; r0 += 16) {
    const int rows = n1 - r0 < 16 ? n1 - r0 : 16;
    const std::uint16_t* w = W + r0 * ldw;
    __m512 acc[16];
    for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
    int k = 0;
    if (split) {
      for (; k < k_full; k += 32) {
        for (int r = 0; r < 16; ++r) _mm_prefetch(reinterpret_cast<const char*>(w + (r + 16) * ldw + k), _MM_HINT_T0);
        const __m512 xe = _mm512_load_ps(&xs[0][k / 2]), xo = _mm512_load_ps(&xs[1][k / 2]);
        for (int r = 0; r < 16; ++r)
          if (r < rows) {
            const __m512i v = _mm512_loadu_si512(w + r * ldw + k);
            acc[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), xe, acc[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, high)), xo, acc[r]);
          }
      }
    }
    const auto add = [&](int kk, __mmask16 lanes) {
      const __m512 x16 = _mm512_maskz_loadu_ps(lanes, x + kk);
      for (int r = 0; r < 16; ++r)
        if (r < rows) {
          const __m256i bits = _mm256_maskz_loadu_epi16(lanes, w + r * ldw + kk);
          const __m512 wide = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
          acc[r] = _mm512_fmadd_ps(wide, x16, acc[r]);
        }
    };
    for (; k + 16 <= K; k += 16) add(k, __mmask16(0xFFFF));
    if (K > k) add(k, first_lanes(K - k));
    _mm512_mask_storeu_ps(y + r0, first_lanes(rows), sum16(acc));
  }
}

#pragma GCC diagnostic pop

void softmax_row(const float* in, float* out, int n, int Tk, const std::uint8_t* pad) {
  const __m128i zero = _mm_setzero_si128();
  auto allowed = [&](int j) {
    const __mmask16 m = first_lanes(n - j);
    return pad ? __mmask16(m & ~_mm_cmpneq_epi8_mask(_mm_maskz_loadu_epi8(m, pad + j), zero)) : m;
  };
  const __m512 minus_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 mx = minus_inf;
  for (int j = 0; j < n; j += 16) {
    const __mmask16 a = allowed(j);  // a masked load: nothing is read past n
    mx = _mm512_mask_max_ps(mx, a, mx, _mm512_maskz_loadu_ps(a, in + j));
  }
  const float m = lane_max(mx);
  if (m == -__builtin_inff()) {
    for (int j = 0; j < Tk; j += 16) _mm512_mask_storeu_ps(out + j, first_lanes(Tk - j), _mm512_setzero_ps());
    return;
  }
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < n; j += 16) {
    const __mmask16 a = allowed(j);
    const __m512 e = _mm512_maskz_mov_ps(a, vector_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(a, in + j), mv)));
    sum = _mm512_add_ps(sum, e);
    _mm512_mask_storeu_ps(out + j, first_lanes(n - j), e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / lane_sum(sum));
  for (int j = 0; j < n; j += 16) {
    const __mmask16 live = first_lanes(n - j);
    _mm512_mask_storeu_ps(out + j, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, out + j), inv));
  }
  for (int j = n; j < Tk; j += 16) _mm512_mask_storeu_ps(out + j, first_lanes(Tk - j), _mm512_setzero_ps());
}

}  // namespace

CpuKernels kernels() {
  CpuKernels k{};
  k.level = CpuLevel::avx512;
  k.gemv_rows = gemv_rows;
  k.multi_rows = 16;
  k.gemv_rows_multi = gemv_rows_multi;
  k.panel_rows = panel_rows;
  k.gemv_rows_bf16 = gemv_rows_bf16;
  k.softmax_row = softmax_row;
  return k;  // int8: levels.cpp picks VNNI's or AVX2's
}

}  // namespace xfmr::detail::avx512
