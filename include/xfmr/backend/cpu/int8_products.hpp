// int8_products.hpp: detail::Int8Products, CpuBackend<float>'s matrix
// products in int8 precision (CpuOptions::int8): int8 weights times int8
// activations, summed exactly in int32. A decoding step streams a quarter
// of float32's bytes, and with AVX-512 VNNI one instruction does 64
// multiply-adds (float32's FMA 16), so a step of many streams (continuous
// batching) is not bound by the multiply-adds as float32's is.
//
// keep_copy(w, rows, cols) quantises a contiguous rows x cols matrix once,
// symmetric and per row (core/int8.hpp; a row is an output of y = x W^T,
// the products' layout for a weight): scale_r = max_k |w_rk| / 127 and
// q_rk = round(w_rk / scale_r) in [-127, 127]; or keeps rows given (a saved
// int8 model's). A product whose B operand is w (the same pointer and
// leading dimension, no more rows than kept, transposed as a weight is)
// quantises each row of A afresh to uint8 with its own scale and zero
// point (quantise_activation_u8) and gives
//
//   C[m, r] = float(I_mr) * scale_r * scale_m,
//   I_mr = sum_k u_mk q_rk - zero_m sum_k q_rk   (int32, exact),
//
// multiplied in that order. The sum being exact, a row's outputs are the
// same bits whatever rows come with it (one decoding step, a batch of
// streams, a prompt), through either kernel: AVX-512 VNNI's
// (int8_block_vnni) where the target has it, a plain loop elsewhere
// (test_int8 recomputes the formula and compares bit for bit). Products
// of other operands (attention's, training's) stay float32. w must not
// change until drop_copies(); WeightCopies (infer/weight_copies.hpp)
// keeps a model's matrices for one scope.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "xfmr/backend/cpu/gemm.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/backend/cpu/simd.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/int8.hpp"

#if defined(XFMR_SIMD_ROWS) && defined(__AVX512VNNI__)
#define XFMR_INT8_VNNI 1
#endif

namespace xfmr::detail {

// One output of the int8 product from its exact integer sum (the formula
// above, in its order).
inline float int8_output(std::int32_t sum, float weight_scale, float row_scale) {
  return float(sum) * weight_scale * row_scale;
}

#ifdef XFMR_INT8_VNNI
// One block of Q's rows [r0, r0 + rows), rows <= 16, against M rows of U
// (uint8, ldu apart, K columns): lane r of I[m] = sum_k U[m, k] Q[r0 + r,
// k], lanes past `rows` zero. R of Q's rows a pass share each load of U's
// rows (R x M accumulators, vpdpbusd summing four products a lane), and
// the next pass's R rows are prefetched into L2 meanwhile, as
// gemv_block_multi does for float32 (simd.hpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593, as in simd.hpp
template <int M, int R>
inline void int8_block_vnni(int r0, int rows, int K, const std::int8_t* Q, long ldq, const std::uint8_t* U, long ldu,
                            __m512i* I) {
  const int k_full = K - K % 64;
  const __mmask64 k_tail = K % 64 ? __mmask64(~0ull >> (64 - K % 64)) : __mmask64(0);
  __m512 acc[M][16];  // int32 lanes in float32's bits, for sum16_epi32
  for (int r = 0; r < 16; r += R) {
    __m512i s[M][R];
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < R; ++j) s[m][j] = _mm512_setzero_si512();
    if (r < rows) {
      const std::int8_t* w[R];  // rows past the block read its last again, then are dropped
      for (int j = 0; j < R; ++j) w[j] = Q + long(r0 + std::min(r + j, rows - 1)) * ldq;
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
      for (int j = 0; j < R; ++j) acc[m][r + j] = r + j < rows ? _mm512_castsi512_ps(s[m][j]) : _mm512_setzero_ps();
  }
  for (int m = 0; m < M; ++m) I[m] = sum16_epi32(acc[m]);
}
#pragma GCC diagnostic pop
#endif

// Rows [n0, n1) of C(M, N) = the int8 product of U's M quantised rows
// (ldu apart, their scales in `rows`) and Q (N, K), int8 with leading
// dimension ldq, a scale and a sum of its q a row.
inline void int8_product_rows(int n0, int n1, int M, int K, const std::int8_t* Q, long ldq, const float* scale,
                              const std::int32_t* q_sum, const std::uint8_t* U, long ldu, const ActivationScale* rows,
                              float* C, long ldc) {
#ifdef XFMR_INT8_VNNI
  // Sixteen of Q's rows a block, read from memory for the first eight rows
  // of U and from cache for the rest; the fewer U's rows, the more of Q's a
  // pass (at most sixteen accumulators).
  for (int r0 = n0; r0 < n1; r0 += 16) {
    const int live_rows = std::min(16, n1 - r0);
    const __mmask16 live = first_lanes(live_rows);
    const __m512 s = _mm512_maskz_loadu_ps(live, scale + r0);
    const __m512i sums = _mm512_maskz_loadu_epi32(live, q_sum + r0);
    for (int m0 = 0; m0 < M; m0 += 8) {
      const int m_n = std::min(8, M - m0);
      const std::uint8_t* u = U + long(m0) * ldu;
      __m512i I[8];
      switch (m_n) {
        case 1: int8_block_vnni<1, 16>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 2: int8_block_vnni<2, 8>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 3: int8_block_vnni<3, 4>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 4: int8_block_vnni<4, 4>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 5: int8_block_vnni<5, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 6: int8_block_vnni<6, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        case 7: int8_block_vnni<7, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
        default: int8_block_vnni<8, 2>(r0, live_rows, K, Q, ldq, u, ldu, I); break;
      }
      for (int m = 0; m < m_n; ++m) {
        const ActivationScale a = rows[m0 + m];
        const __m512i sum = _mm512_sub_epi32(I[m], _mm512_mullo_epi32(_mm512_set1_epi32(a.zero), sums));
        const __m512 c = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), s), _mm512_set1_ps(a.scale));
        _mm512_mask_storeu_ps(C + long(m0 + m) * ldc + r0, live, c);
      }
    }
  }
#else
  for (int r = n0; r < n1; ++r) {
    const std::int8_t* q = Q + long(r) * ldq;
    for (int m = 0; m < M; ++m) {
      const std::uint8_t* u = U + long(m) * ldu;
      std::int32_t sum = 0;
#ifdef _OPENMP
#pragma omp simd reduction(+ : sum)  // vectorised at -O2 too (GCC 12's cheap model leaves it scalar, 30x slower)
#endif
      for (int k = 0; k < K; ++k) sum += std::int32_t(u[k]) * std::int32_t(q[k]);
      C[long(m) * ldc + r] = int8_output(sum - rows[m].zero * q_sum[r], scale[r], rows[m].scale);
    }
  }
#endif
}

class Int8Products {
 public:
  // Row-major C = alpha op(A) op(B) + beta C (CpuBackend::gemm's arguments):
  // through B's int8 copy when it has one and the product is a weight's
  // (B transposed, alpha 1, beta 0), float32 otherwise.
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) {
    const auto it = copies_.find(B);
    const bool weight = it != copies_.end() && it->second.cols == ldb && K <= ldb && N <= it->second.rows && tb &&
                        !ta && alpha == 1.0f && beta == 0.0f;
    if (!weight) return detail::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const Copy& copy = it->second;
    const long ldu = (long(K) + 63) / 64 * 64;
    quantised_.resize(std::size_t(M) * std::size_t(ldu));
    row_scales_.resize(std::size_t(M));
    std::uint8_t* U = quantised_.data();
    ActivationScale* rows = row_scales_.data();
    parallel_ranges(M, long(M) * K > kParallelWork, [=](long lo, long hi) {
      for (long m = lo; m < hi; ++m) rows[m] = quantise_activation_u8(A + m * lda, K, U + m * ldu);
    });
    const std::int8_t* q = copy.q.data();
    const float* s = copy.scale.data();
    const std::int32_t* q_sum = copy.q_sum.data();
    parallel_ranges(
        N, long(N) * K * M >= kGemvSplitWork,
        [=](long n0, long n1) { int8_product_rows(int(n0), int(n1), M, K, q, ldb, s, q_sum, U, ldu, rows, C, ldc); },
        16);
  }

  // The widest weight row: beyond it sum_k u_k q_k could leave int32.
  static constexpr int kMaxCols = 2147483647 / (255 * 127);

  void keep_copy(const float* w, int rows, int cols) {
    Copy& copy = make_copy(w, rows, cols);
    std::int8_t* q = copy.q.data();
    float* scale = copy.scale.data();
    parallel_ranges(rows, long(rows) * cols > kParallelWork, [=](long lo, long hi) {
      for (long r = lo; r < hi; ++r) scale[r] = quantise_row_int8(w + r * cols, cols, q + r * cols);
    });
    sum_rows(copy);
  }
  // keep_copy with the int8 rows and scales given (a saved int8 model's,
  // io/checkpoint.hpp's quantise_checkpoint) instead of computed from w,
  // which holds their dequantised values.
  void keep_copy(const float* w, int rows, int cols, const std::int8_t* q, const float* scale) {
    Copy& copy = make_copy(w, rows, cols);
    std::copy_n(q, copy.q.size(), copy.q.begin());
    std::copy_n(scale, copy.scale.size(), copy.scale.begin());
    sum_rows(copy);
  }
  void drop_copies() { copies_.clear(); }
  std::size_t copy_bytes() const {
    std::size_t n = 0;
    for (const auto& [w, c] : copies_) n += c.q.size() + c.scale.size() * (sizeof(float) + sizeof(std::int32_t));
    return n;
  }

 private:
  struct Copy {
    int rows = 0, cols = 0;
    std::vector<std::int8_t> q;
    std::vector<float> scale;
    std::vector<std::int32_t> q_sum;  // sum_k q_rk, for the activations' zero points
  };
  Copy& make_copy(const float* w, int rows, int cols) {
    require(rows > 0 && cols > 0, "int8 weight copy of a ", rows, " x ", cols, " matrix");
    require(cols <= kMaxCols, "int8 weight copy of a ", rows, " x ", cols, " matrix: rows of at most ", kMaxCols,
            " columns keep the int32 sums exact");
    Copy& copy = copies_[w];
    copy.rows = rows;
    copy.cols = cols;
    copy.q.resize(std::size_t(rows) * std::size_t(cols));
    copy.scale.resize(std::size_t(rows));
    copy.q_sum.resize(std::size_t(rows));
    return copy;
  }
  static void sum_rows(Copy& copy) {
    for (int r = 0; r < copy.rows; ++r) {
      const std::int8_t* q = copy.q.data() + std::size_t(r) * std::size_t(copy.cols);
      copy.q_sum[std::size_t(r)] = std::accumulate(q, q + copy.cols, std::int32_t(0));
    }
  }
  std::unordered_map<const float*, Copy> copies_;  // by weight
  std::vector<std::uint8_t> quantised_;             // a product's rows of A as uint8, 64-byte multiples apart
  std::vector<ActivationScale> row_scales_;         // and their scales
};

}  // namespace xfmr::detail
