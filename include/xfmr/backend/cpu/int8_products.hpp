// int8_products.hpp: detail::Int8Products, CpuBackend<float>'s matrix
// products in int8 precision (CpuOptions::int8): weight-only int8 for
// decoding, a quarter of float32's bytes a token streams.
//
// keep_copy(w, rows, cols) quantises a contiguous rows x cols matrix once,
// symmetric and per row (core/int8.hpp; a row is an output of y = x W^T,
// the products' layout for a weight): scale_r = max_k |w_rk| / 127 and
// q_rk = round(w_rk / scale_r) in [-127, 127], so |w_rk - scale_r q_rk| <=
// scale_r / 2; or keeps rows given (a saved int8 model's). A product whose
// B operand is w (the same pointer and leading dimension, no more rows than
// kept, transposed as a weight is) reads the int8 rows: output (m, r) =
// scale_r * sum_k a_mk q_rk, the sum in float32 in the order gemm_rows_int8
// documents (test_int8 recomputes it lane by lane and compares bit for
// bit); for up to kRowKernelRows rows of A (a decoding step, a small beam),
// each block of sixteen weight rows read once for all of them. More rows
// (a prompt, many beams), or a CPU without AVX-512: the kept rows widened
// to scale_r q_rk in float32 a tile of about kWidenBytes at a time, then
// float32's product on the tile. Products of other operands (attention's,
// training's) stay float32. w must not change until drop_copies();
// WeightCopies (infer/weight_copies.hpp) keeps a model's matrices for one
// scope.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "xfmr/backend/cpu/gemm.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/backend/cpu/simd.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/int8.hpp"

namespace xfmr::detail {

#ifdef XFMR_SIMD_ROWS
// Rows [n0, n1) of C(M, N) = A(M, K) Q^T, Q int8 (N, K) with leading
// dimension ldq and a scale a row: C[m, r] = scale[r] * sum_k A[m, k] Q[r, k].
// The sum's order: dot_rows_side_by_side's (simd.hpp: one sixteen-lane
// accumulator a row, the columns sixteen at a time in order, the masked
// tail last), then sum16 over the sixteen rows of a block; the scale
// multiplies last. Each sixteen-row block of Q stays in cache while every
// row of A passes over it.
inline void gemm_rows_int8(int n0, int n1, int M, int K, const std::int8_t* Q, long ldq, const float* scale,
                           const float* A, long lda, float* C, long ldc) {
  const auto widen = [](const std::int8_t* p, __mmask16 lanes) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(lanes, p)));
  };
  for (int r0 = n0; r0 < n1; r0 += 16) {
    const int rows = std::min(16, n1 - r0);
    const __mmask16 live = first_lanes(rows);
    const __m512 s = _mm512_maskz_loadu_ps(live, scale + r0);
    for (int m = 0; m < M; ++m) {
      __m512 acc[16];
      dot_rows_side_by_side(rows, K, Q + r0 * ldq, ldq, A + m * lda, widen, acc);
      _mm512_mask_storeu_ps(C + m * ldc + r0, live, _mm512_mul_ps(sum16(acc), s));
    }
  }
}
#endif

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
    const std::int8_t* q = copy.q.data();
    const float* s = copy.scale.data();
#ifdef XFMR_SIMD_ROWS
    if (M <= kRowKernelRows) {
      parallel_ranges(
          N, long(N) * K * M >= kGemvSplitWork,
          [=](long n0, long n1) { gemm_rows_int8(int(n0), int(n1), M, K, q, ldb, s, A, lda, C, ldc); }, 16);
      return;
    }
#endif
    // Many rows (a prompt, a batch of beams): float32's kernel, which uses
    // each weight for many rows, on a tile of the weight's rows at a time
    // widened to float32 (about kWidenBytes; each tile's outputs are
    // float32's product on those dequantised rows).
    const int tile = std::max(16, int(kWidenBytes / sizeof(float) / std::size_t(ldb)) / 16 * 16);
    widened_.resize(std::size_t(std::min(tile, N)) * std::size_t(ldb));
    float* w = widened_.data();
    for (int n0 = 0; n0 < N; n0 += tile) {
      const int rows = std::min(tile, N - n0);
      const std::int8_t* qt = q + long(n0) * ldb;
      const float* st = s + n0;
      parallel_ranges(rows, long(rows) * ldb > kParallelWork, [=](long lo, long hi) {
        for (long r = lo; r < hi; ++r)
          for (long k = 0; k < ldb; ++k) w[r * ldb + k] = st[r] * float(qt[r * ldb + k]);
      });
      detail::gemm(false, true, M, rows, K, 1.0f, A, lda, w, ldb, 0.0f, C + n0, ldc);
    }
  }

  // The float32 rows a product of many rows widens at a time.
  static constexpr std::size_t kWidenBytes = std::size_t(1) << 20;

  // The most rows of A a product reads the int8 rows for directly: a
  // decoding step's one, a beam's few.
  static constexpr int kRowKernelRows = 8;

  void keep_copy(const float* w, int rows, int cols) {
    Copy& copy = make_copy(w, rows, cols);
    std::int8_t* q = copy.q.data();
    float* scale = copy.scale.data();
    parallel_ranges(rows, long(rows) * cols > kParallelWork, [=](long lo, long hi) {
      for (long r = lo; r < hi; ++r) scale[r] = quantise_row_int8(w + r * cols, cols, q + r * cols);
    });
  }
  // keep_copy with the int8 rows and scales given (a saved int8 model's,
  // io/checkpoint.hpp's quantise_checkpoint) instead of computed from w,
  // which holds their dequantised values.
  void keep_copy(const float* w, int rows, int cols, const std::int8_t* q, const float* scale) {
    Copy& copy = make_copy(w, rows, cols);
    std::copy_n(q, copy.q.size(), copy.q.begin());
    std::copy_n(scale, copy.scale.size(), copy.scale.begin());
  }
  void drop_copies() { copies_.clear(); }
  std::size_t copy_bytes() const {
    std::size_t n = 0;
    for (const auto& [w, c] : copies_) n += c.q.size() + c.scale.size() * sizeof(float);
    return n;
  }

 private:
  struct Copy {
    int rows = 0, cols = 0;
    std::vector<std::int8_t> q;
    std::vector<float> scale;
  };
  Copy& make_copy(const float* w, int rows, int cols) {
    require(rows > 0 && cols > 0, "int8 weight copy of a ", rows, " x ", cols, " matrix");
    Copy& copy = copies_[w];
    copy.rows = rows;
    copy.cols = cols;
    copy.q.resize(std::size_t(rows) * std::size_t(cols));
    copy.scale.resize(std::size_t(rows));
    return copy;
  }
  std::unordered_map<const float*, Copy> copies_;  // by weight
  std::vector<float> widened_;                      // a tile of kept rows as float32, for products of many rows
};

}  // namespace xfmr::detail
