// bf16_products.hpp: detail::Bf16Products, CpuBackend<float>'s matrix products in
// bf16 precision (CpuOptions::bf16), and the bfloat16 weight copies they
// read when decoding.
//
// A bf16 product rounds both operands on every call (bf16::gemm). A
// decoding step multiplies one row by every weight matrix, so its time is
// reading the weights; rounding them on each call would read and write them
// more. keep_copy(w, rows, cols, source) registers a rows x cols matrix,
// whose values `source` gives (the tensor's memory at w, or the file of a
// deferred tensor: core/tensor.hpp), and the first product whose B operand
// is w (the same pointer and leading dimension cols, no more rows than
// kept) rounds them once and keeps the bits (a source stored in bfloat16
// rows is read in place, without a copy); from then on such a product reads
// the bits, half the bytes of float32, and a single row against them runs the
// kernels' gemv_rows_bf16 (cpu/kernels.hpp; AVX2 and AVX-512) over the
// threads as float32's gemv_rows does. Outputs are
// bf16 products' either way (the same bits for more than one row; for one
// row, another float32 summation order). w must not change until
// drop_copies(); WeightCopies (infer/weight_copies.hpp) keeps a model's
// matrices for one scope.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu/copy_source.hpp"
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
    const std::uint16_t* bits = serves(ta, tb, N, K, B, ldb) ? copies_.find(B)->second.read() : nullptr;
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

  // Whether this product reads B's copy (B is w, the same leading
  // dimension, no more rows than kept), and not B.
  bool serves(bool ta, bool tb, int N, int K, const float* B, int ldb) const {
    (void)ta;
    const auto it = copies_.find(B);
    return it != copies_.end() && it->second.cols == ldb && (tb ? N : K) <= it->second.rows;
  }

  void keep_copy(const float* w, int rows, int cols, std::shared_ptr<const WeightSource> source) {
    require(rows > 0 && cols > 0, "bf16 weight copy of a ", rows, " x ", cols, " matrix");
    Copy& copy = copies_[w];
    copy = Copy{rows, cols, {}, nullptr, std::move(source)};
  }
  void drop_copies() { copies_.clear(); }
  std::size_t copy_bytes() const {
    std::size_t n = 0;
    for (const auto& [w, c] : copies_) n += c.bits.get_deleter().bytes;
    return n;
  }

 private:
  struct Copy {
    int rows = 0, cols = 0;
    LargeBuffer bits;                              // rounded here, or
    const std::uint16_t* stored = nullptr;         // the source's own bfloat16 rows
    std::shared_ptr<const WeightSource> source;    // until read (kept while its rows are read in place)
    // The bits, rounded at the first call.
    const std::uint16_t* read() {
      if (stored) return stored;
      if (bits) return reinterpret_cast<const std::uint16_t*>(bits.get());
      if (const StoredWeights s = source->stored(StoredLayout::bf16_rows); s.layout == StoredLayout::bf16_rows)
        return stored = reinterpret_cast<const std::uint16_t*>(s.data);
      LargeBuffer rounded = allocate_large(std::size_t(rows) * std::size_t(cols) * sizeof(std::uint16_t));
      std::uint16_t* out = reinterpret_cast<std::uint16_t*>(rounded.get());
      const long width = cols;
      for_each_row_chunk(*source, 64, [=](long r0, long r1, const float* values) {
        for (long i = 0; i < (r1 - r0) * width; ++i) out[r0 * width + i] = bf16::from_float(values[i]);
      });
      bits = std::move(rounded);
      source->release();
      source.reset();
      return reinterpret_cast<const std::uint16_t*>(bits.get());
    }
  };
  std::unordered_map<const float*, Copy> copies_;  // by weight
  std::vector<float> rounded_row_;                  // a single row's operand, rounded
};

}  // namespace xfmr::detail
