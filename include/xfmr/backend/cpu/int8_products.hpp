// int8_products.hpp: detail::Int8Products, CpuBackend<float>'s matrix
// products in int8 precision (CpuOptions::int8): int8 weights times int8
// activations, summed exactly in int32. A decoding step streams a quarter
// of float32's bytes, and with AVX-512 VNNI one instruction does 64
// multiply-adds (float32's FMA 16), so a step of many streams (continuous
// batching) is not bound by the multiply-adds as float32's is.
//
// keep_copy(w, rows, cols, source) registers a rows x cols matrix, whose
// values `source` gives (the tensor's memory at w, or the file of a
// deferred tensor: core/tensor.hpp); the first product that reads it
// quantises it once, symmetric and per row (core/int8.hpp; a row is an
// output of y = x W^T, the products' layout for a weight): scale_r = max_k
// |w_rk| / 127 and q_rk = round(w_rk / scale_r) in [-127, 127], or takes
// the rows as stored (a saved int8 model's). A product whose B operand is w
// (the same pointer and leading dimension, no more rows than kept,
// transposed as a weight is) quantises each row of A afresh to uint8 with
// its own scale and zero
// point (quantise_activation_u8) and gives
//
//   C[m, r] = float(I_mr) * scale_r * scale_m,
//   I_mr = sum_k u_mk q_rk - zero_m sum_k q_rk   (int32, exact),
//
// multiplied in that order. The sum being exact, a row's outputs are the
// same bits whatever rows come with it (one decoding step, a batch of
// streams, a prompt), and at every level of cpu/kernels.hpp: AVX-512
// VNNI's, AVX2's or a plain loop (test_int8 recomputes the formula and
// compares bit for bit at each level the CPU runs). A copy is kept in the
// layout of the level's kernel, packed once (with VNNI, kernels.hpp's
// blocks of 16 rows: one stream of bytes, no horizontal sums). Products
// of other operands (attention's, training's) stay float32. w must not
// change until drop_copies(); WeightCopies (infer/weight_copies.hpp)
// keeps a model's matrices for one scope.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "xfmr/backend/cpu/copy_source.hpp"
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
  parallel_ranges(M, long(M) * K > kLightParallelWork, [=](long lo, long hi) {
    for (long m = lo; m < hi; ++m) rows[m] = quantise_activation_u8(A + m * lda, K, U + m * ldu);
  });
}

// Rows [0, n) of W (cols apart) quantised symmetric and per row
// (quantise_row_int8) into Q's rows and their scales, compiled for the
// level (std::nearbyint one instruction), the same bits everywhere.
inline void quantise_weight_rows(int n, int cols, const float* W, std::int8_t* Q, float* scale) {
  for (int r = 0; r < n; ++r) scale[r] = quantise_row_int8(W + long(r) * cols, cols, Q + long(r) * cols);
}

}  // namespace XFMR_CPU_OPS_NS

class Int8Products {
 public:
  // Row-major C = alpha op(A) op(B) + beta C (CpuBackend::gemm's arguments)
  // through B's int8 copy when it has one and the product is a weight's (B
  // transposed, alpha 1, beta 0), A's rows quantised by `quantise` (the
  // level's quantise_rows; its weights, when first read, by the level's
  // quantise_weight_rows); false otherwise, C untouched (the caller's
  // float32 product).
  bool gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc, decltype(&quantise_rows) quantise,
            decltype(&quantise_weight_rows) quantise_weights) {
    if (!serves(ta, tb, N, K, alpha, B, ldb, beta)) return false;
    Copy& copy = copies_.find(B)->second;
    if (!copy.product) pack(copy, quantise_weights);
    const long ldu = (long(K) + 63) / 64 * 64;  // int8_block_width(K) <= ldu
    quantised_.resize(std::size_t(M) * std::size_t(ldu));
    row_scales_.resize(std::size_t(M));
    std::uint8_t* U = quantised_.data();
    ActivationScale* rows = row_scales_.data();
    quantise(M, K, A, lda, U, ldu, rows);
    const std::int8_t* q = reinterpret_cast<const std::int8_t*>(copy.q.get());
    const float* s = copy.scale.data();
    const std::int32_t* q_sum = copy.q_sum.data();
    const auto product = copy.product;
    const long ldq = copy.ldq;
    parallel_ranges(
        N, long(N) * K * M >= kGemvSplitWork,
        [=](long n0, long n1) { product(int(n0), int(n1), M, K, q, ldq, s, q_sum, U, ldu, rows, C, ldc); },
        kInt8BlockRows);
    return true;
  }

  // Whether this product reads B's copy: a weight's (see above).
  bool serves(bool ta, bool tb, int N, int K, float alpha, const float* B, int ldb, float beta) const {
    const auto it = copies_.find(B);
    return it != copies_.end() && it->second.cols == ldb && K <= ldb && N <= it->second.rows && tb && !ta &&
           alpha == 1.0f && beta == 0.0f;
  }

  // The widest weight row: beyond it sum_k u_k q_k could leave int32.
  static constexpr int kMaxCols = 2147483647 / (255 * 127);

  void keep_copy(const float* w, int rows, int cols, std::shared_ptr<const WeightSource> source) {
    require(rows > 0 && cols > 0, "int8 weight copy of a ", rows, " x ", cols, " matrix");
    require(cols <= kMaxCols, "int8 weight copy of a ", rows, " x ", cols, " matrix: rows of at most ", kMaxCols,
            " columns keep the int32 sums exact");
    copies_[w] = Copy{rows, cols, 0, nullptr, {}, {}, {}, std::move(source)};
  }
  void drop_copies() { copies_.clear(); }
  std::size_t copy_bytes() const {
    std::size_t n = 0;
    for (const auto& [w, c] : copies_) n += c.q.get_deleter().bytes + c.scale.size() * (sizeof(float) + sizeof(std::int32_t));
    return n;
  }
  // The bytes a copy of a rows x cols matrix takes at the level in use.
  static std::size_t copy_bytes(int rows, int cols) {
    const std::size_t q =
        cpu_kernels().int8_blocked ? int8_blocked_bytes(rows, cols) : std::size_t(rows) * std::size_t(cols);
    return q + std::size_t(rows) * (sizeof(float) + sizeof(std::int32_t));
  }

 private:
  struct Copy {
    int rows = 0, cols = 0;
    long ldq = 0;  // bytes from a row of q to the next (within a block when blocked)
    decltype(CpuKernels::int8_product_rows) product = nullptr;  // the kernel that reads q's layout; null until packed
    LargeBuffer q;                   // null until packed
    std::vector<float> scale;
    std::vector<std::int32_t> q_sum;             // sum_k q_rk, for the activations' zero points
    std::shared_ptr<const WeightSource> source;  // until packed
  };
  // The copy in the layout of the level in use (kernels.hpp's
  // int8_blocked), from the rows as stored or quantised here.
  static void pack(Copy& copy, decltype(&quantise_weight_rows) quantise_weights) {
    const CpuKernels& kernels = cpu_kernels();
    const int rows = copy.rows, cols = copy.cols;
    const bool blocked = kernels.int8_blocked;
    const long width = blocked ? int8_block_width(cols) : cols;
    LargeBuffer q = allocate_large(blocked ? int8_blocked_bytes(rows, cols) : std::size_t(rows) * std::size_t(cols));
    std::vector<float> scale(static_cast<std::size_t>(rows));
    std::vector<std::int32_t> q_sum(static_cast<std::size_t>(rows));
    std::int8_t* pq = reinterpret_cast<std::int8_t*>(q.get());
    float* ps = scale.data();
    std::int32_t* sums = q_sum.data();
    // Rows [r0, r1) of int8 values `rows_q` (cols apart) into the copy.
    const auto place = [=](long r0, long r1, const std::int8_t* rows_q) {
      for (long r = r0; r < r1; ++r) {
        const std::int8_t* row = rows_q + (r - r0) * cols;
        sums[r] = std::accumulate(row, row + cols, std::int32_t(0));
      }
      if (blocked) pack_int8_blocks(int(r1 - r0), cols, rows_q, cols, pq + r0 * width);
      else std::copy(rows_q, rows_q + (r1 - r0) * cols, pq + r0 * cols);
    };
    if (StoredWeights s = copy.source->stored(StoredLayout::int8_rows); s.layout == StoredLayout::int8_rows) {
      const auto* stored = reinterpret_cast<const std::int8_t*>(s.data);
      std::copy(s.scales.begin(), s.scales.end(), ps);
      parallel_ranges(
          rows, long(rows) * cols > kParallelWork,
          [=](long lo, long hi) { place(lo, hi, stored + lo * cols); }, kInt8BlockRows);
    } else {
      for_each_row_chunk(*copy.source, kInt8BlockRows, [=](long r0, long r1, const float* values) {
        std::int8_t chunk[kInt8BlockRows * 4096];
        std::vector<std::int8_t> wide;
        std::int8_t* rows_q = chunk;
        if ((r1 - r0) * cols > long(sizeof chunk)) wide.resize(std::size_t((r1 - r0) * cols)), rows_q = wide.data();
        quantise_weights(int(r1 - r0), cols, values, rows_q, ps + r0);
        place(r0, r1, rows_q);
      });
    }
    copy.q = std::move(q);
    copy.scale = std::move(scale);
    copy.q_sum = std::move(q_sum);
    copy.ldq = width;
    copy.product = kernels.int8_product_rows;
    copy.source->release();
    copy.source.reset();
  }
  std::unordered_map<const float*, Copy> copies_;  // by weight
  std::vector<std::uint8_t> quantised_;             // a product's rows of A as uint8, 64-byte multiples apart
  std::vector<ActivationScale> row_scales_;         // and their scales
};

}  // namespace xfmr::detail
