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
// streams, a prompt), and at every level of cpu/kernels.hpp: AVX-512
// VNNI's, AVX2's or a plain loop (test_int8 recomputes the formula and
// compares bit for bit at each level the CPU runs). Products
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

#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/int8.hpp"

namespace xfmr::detail {

inline namespace XFMR_CPU_OPS_NS {

// M rows of A (lda apart), each quantised by quantise_activation_u8 into U
// (ldu apart) and rows, over the threads: an operation of the level
// (cpu/ops.hpp), where std::nearbyint is one instruction (x86-64's
// baseline calls libm for it), in the same bits at every level.
inline void quantise_rows(int M, int K, const float* A, long lda, std::uint8_t* U, long ldu, ActivationScale* rows) {
  parallel_ranges(M, long(M) * K > kParallelWork, [=](long lo, long hi) {
    for (long m = lo; m < hi; ++m) rows[m] = quantise_activation_u8(A + m * lda, K, U + m * ldu);
  });
}

}  // namespace XFMR_CPU_OPS_NS

class Int8Products {
 public:
  // Row-major C = alpha op(A) op(B) + beta C (CpuBackend::gemm's arguments)
  // through B's int8 copy when it has one and the product is a weight's (B
  // transposed, alpha 1, beta 0), A's rows quantised by `quantise` (the
  // level's quantise_rows); false otherwise, C untouched (the caller's
  // float32 product).
  bool gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc, decltype(&quantise_rows) quantise) {
    const auto it = copies_.find(B);
    const bool weight = it != copies_.end() && it->second.cols == ldb && K <= ldb && N <= it->second.rows && tb &&
                        !ta && alpha == 1.0f && beta == 0.0f;
    if (!weight) return false;
    const Copy& copy = it->second;
    const long ldu = (long(K) + 63) / 64 * 64;
    quantised_.resize(std::size_t(M) * std::size_t(ldu));
    row_scales_.resize(std::size_t(M));
    std::uint8_t* U = quantised_.data();
    ActivationScale* rows = row_scales_.data();
    quantise(M, K, A, lda, U, ldu, rows);
    const std::int8_t* q = copy.q.data();
    const float* s = copy.scale.data();
    const std::int32_t* q_sum = copy.q_sum.data();
    const auto product = cpu_kernels().int8_product_rows;
    parallel_ranges(
        N, long(N) * K * M >= kGemvSplitWork,
        [=](long n0, long n1) { product(int(n0), int(n1), M, K, q, ldb, s, q_sum, U, ldu, rows, C, ldc); }, 16);
    return true;
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
