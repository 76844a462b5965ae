// bf16_products.hpp: detail::Bf16Products, CpuBackend<float>'s matrix products in
// bf16 precision (CpuOptions::bf16), and the bfloat16 weight copies they
// read when decoding.
//
// A bf16 product rounds both operands on every call (bf16::gemm). A
// decoding step multiplies one row by every weight matrix, so its time is
// reading the weights; rounding them on each call would read and write them
// more. keep_copy(w, rows, cols) rounds a contiguous rows x cols matrix once
// and keeps the bits: from then on a product whose B operand is w (the same
// pointer and leading dimension cols, no more rows than kept) reads the
// copy, half the bytes of float32, and a single row against it runs the
// kernels' gemv_rows_bf16 (cpu/kernels.hpp; AVX2 and AVX-512) over the
// threads as float32's gemv_rows does. Outputs are
// bf16 products' either way (the same bits for more than one row; for one
// row, another float32 summation order). w must not change until
// drop_copies(); WeightCopies (infer/weight_copies.hpp) keeps a model's
// matrices for one scope.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/core/error.hpp"

namespace xfmr::detail {

class Bf16Products {
 public:
  // Row-major C = alpha op(A) op(B) + beta C (CpuBackend::gemm's arguments),
  // through B's copy where it has one.
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) {
    const std::uint16_t* bits = nullptr;
    if (const auto it = copies_.find(B); it != copies_.end() && it->second.cols == ldb && (tb ? N : K) <= it->second.rows)
      bits = it->second.bits.data();
    const auto row_kernel = cpu_kernels().gemv_rows_bf16;
    if (bits && row_kernel && M == 1 && tb && !ta && alpha == 1.0f && beta == 0.0f) {
      rounded_row_.resize(std::size_t(K));
      for (int k = 0; k < K; ++k) rounded_row_[std::size_t(k)] = bf16::round(A[k]);
      const float* x = rounded_row_.data();
      parallel_ranges(
          N, long(N) * K >= kGemvSplitWork, [=](long n0, long n1) { row_kernel(int(n0), int(n1), K, bits, ldb, x, C); },
          16);
      return;
    }
    bf16::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bits);
  }

  void keep_copy(const float* w, int rows, int cols) {
    require(rows > 0 && cols > 0, "bf16 weight copy of a ", rows, " x ", cols, " matrix");
    Copy& copy = copies_[w];
    copy.rows = rows;
    copy.cols = cols;
    copy.bits.resize(std::size_t(rows) * std::size_t(cols));
    std::uint16_t* out = copy.bits.data();
    const long n = long(copy.bits.size());
    parallel_ranges(n, n > kParallelWork, [=](long lo, long hi) {
      for (long i = lo; i < hi; ++i) out[i] = bf16::from_float(w[i]);
    });
  }
  void drop_copies() { copies_.clear(); }
  std::size_t copy_bytes() const {
    std::size_t n = 0;
    for (const auto& [w, c] : copies_) n += c.bits.size() * sizeof(std::uint16_t);
    return n;
  }

 private:
  struct Copy {
    int rows = 0, cols = 0;
    std::vector<std::uint16_t> bits;
  };
  std::unordered_map<const float*, Copy> copies_;  // by weight
  std::vector<float> rounded_row_;                  // a single row's operand, rounded
};

}  // namespace xfmr::detail
