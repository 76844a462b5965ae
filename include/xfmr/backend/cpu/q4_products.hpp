// q4_products.hpp: detail::Q4Products, CpuBackend<float>'s matrix products
// in 4-bit precision (CpuOptions::q4): 4-bit weights (core/q4.hpp) times
// int8 activations quantised a block of 32 at a time, each block's sum
// exact in int32. A decoding step streams 4.5 bits a weight, against
// int8's 8.25 and float32's 32.
//
// keep_copy(w, rows, cols, source) registers a rows x cols matrix whose
// values `source` gives (the tensor's memory at w, or the file of a
// deferred tensor: core/tensor.hpp); the first product that reads it
// quantises it into panels once, or reads the source's panels in place
// where it is stored so (a 4-bit checkpoint's, mapped: no copy). A product
// whose B operand is w (the same pointer and leading dimension, no more
// rows than kept, transposed as a weight is, alpha 1, beta 0) quantises
// each row of A afresh (q4_quantise_activations) and gives q4.hpp's
// formula through the level's kernel (cpu/kernels.hpp's q4_product_rows:
// AVX-512 VNNI's, AVX2's or a plain loop), the same bits at every level and
// for any rows beside a row: a prompt's rows and a decoding step's, one
// stream's and a batch's. A product through w untransposed (the input
// gradient of a frozen 4-bit base, models/lora.hpp: dx = dy W) multiplies
// the 4-bit weights themselves, widened to float32 a block of 2^21 at a
// time (exact: a scale times a small integer) for the level's float32
// product: of w's rows, summed into C, when they are the longer side, else
// of its columns. Products of other operands (attention's) stay float32.
// w must not change until drop_copies(); WeightCopies
// (infer/weight_copies.hpp) keeps a model's matrices for one scope.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "xfmr/backend/cpu/copy_source.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/q4.hpp"

namespace xfmr::detail {

inline namespace XFMR_CPU_OPS_NS {

// M rows of A (lda apart) quantised by q4_quantise_activations into Q
// (ldq apart), their blocks' scales and offsets (lds apart), over the
// threads: an operation of the level (cpu/ops.hpp), where std::nearbyint is
// one instruction, in the same bits at every level.
inline void quantise_rows_q4(int M, int K, const float* A, long lda, std::int8_t* Q, long ldq, float* scale,
                             std::int32_t* offset, long lds) {
  parallel_ranges(M, long(M) * K > kLightParallelWork, [=](long lo, long hi) {
    for (long m = lo; m < hi; ++m) q4_quantise_activations(A + m * lda, K, Q + m * ldq, scale + m * lds, offset + m * lds);
  });
}

// Rows [0, n) (n <= 16) of W (ldw apart) quantised into a panel's blocks
// at P (core/q4.hpp), compiled for the level (std::nearbyint and the
// division vectorised), the same bits everywhere.
inline void pack_panel_q4(int n, int K, const float* W, long ldw, std::byte* P) {
  q4_pack_panel(0, n, K, W, ldw, P);
}

}  // namespace XFMR_CPU_OPS_NS

class Q4Products {
 public:
  // Row-major C = alpha op(A) op(B) + beta C (CpuBackend::gemm's arguments)
  // through B's 4-bit copy when it has one and the product is a weight's
  // (see above); false otherwise, C untouched (the caller's float32
  // product). `quantise` and `pack_panel` are the level's (cpu/ops.hpp).
  // `float_gemm` is the level's float32 product, for w untransposed.
  using FloatGemm = void (*)(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*,
                             int);
  bool gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc, decltype(&quantise_rows_q4) quantise, decltype(&pack_panel_q4) pack_panel,
            FloatGemm float_gemm) {
    if (!serves(ta, tb, N, K, alpha, B, ldb, beta)) return false;
    Copy& copy = copies_.find(B)->second;
    if (!copy.panels) pack(copy, pack_panel);
    if (!tb) {
      widened_product(copy, ta, M, N, K, alpha, A, lda, beta, C, ldc, float_gemm);
      return true;
    }
    const long blocks = q4_blocks(K), ldq = blocks * kQ4Block;
    quantised_.resize(std::size_t(M) * std::size_t(ldq));
    scales_.resize(std::size_t(M) * std::size_t(blocks));
    offsets_.resize(std::size_t(M) * std::size_t(blocks));
    quantise(M, K, A, lda, quantised_.data(), ldq, scales_.data(), offsets_.data(), blocks);
    const auto product = cpu_kernels().q4_product_rows;
    const std::byte* P = copy.panels;
    const std::int8_t* Q = quantised_.data();
    const float* s = scales_.data();
    const std::int32_t* o = offsets_.data();
    parallel_ranges(
        N, long(N) * K * M >= kGemvSplitWork,
        [=](long n0, long n1) { product(int(n0), int(n1), M, K, P, Q, ldq, s, o, blocks, C, ldc); }, kQ4PanelRows);
    return true;
  }

  // Whether this product reads B's copy: a weight's, over all its columns,
  // or any through B untransposed (its rows and columns within the copy's).
  bool serves(bool ta, bool tb, int N, int K, float alpha, const float* B, int ldb, float beta) const {
    const auto it = copies_.find(B);
    if (it == copies_.end() || it->second.cols != ldb) return false;
    if (!tb) return K <= it->second.rows && N <= ldb;
    return K == ldb && N <= it->second.rows && !ta && alpha == 1.0f && beta == 0.0f;
  }

  void keep_copy(const float* w, int rows, int cols, std::shared_ptr<const WeightSource> source) {
    require(rows > 0 && cols > 0, "4-bit weight copy of a ", rows, " x ", cols, " matrix");
    copies_[w] = Copy{rows, cols, nullptr, nullptr, std::move(source)};
  }
  void drop_copies() {
    copies_.clear();
    std::vector<float>().swap(wide_);
  }
  // The bytes of the copies made here (panels read in place from a file are
  // the file's).
  std::size_t copy_bytes() const {
    std::size_t n = 0;
    for (const auto& [w, c] : copies_)
      if (c.owned) n += q4_bytes(c.rows, c.cols);
    return n;
  }

 private:
  struct Copy {
    int rows = 0, cols = 0;
    const std::byte* panels = nullptr;     // null until the first product
    LargeBuffer owned;                     // quantised here, or
    std::shared_ptr<const WeightSource> source;  // until then (kept while its panels are read in place)
  };
  // The copy: the source's panels read in place, or its blocks reordered
  // (WeightSource::q4_panels), or made with the level's pack_panel_q4.
  static void pack(Copy& copy, decltype(&pack_panel_q4) pack_panel) {
    if (const StoredWeights s = copy.source->stored(StoredLayout::q4_panels); s.layout == StoredLayout::q4_panels) {
      copy.panels = s.data;
      return;
    }
    const int cols = copy.cols;
    LargeBuffer owned = allocate_large(q4_bytes(copy.rows, cols));
    std::byte* P = owned.get();
    const std::string name = copy.source->name();
    if (!copy.source->q4_panels(P))
      for_each_row_chunk(*copy.source, kQ4PanelRows, [=, &name](long r0, long r1, const float* values) {
        const float amax = largest_magnitude(values, (r1 - r0) * cols);
        require(amax <= kQ4MaxWeight, name, ": a weight of magnitude ", amax, " in rows ", r0, "-", r1 - 1,
                " is past the largest 4-bit weights hold (", kQ4MaxWeight, ": 8 float16 scales)");
        pack_panel(int(r1 - r0), cols, values, cols, P + q4_offset(cols, r0 / kQ4PanelRows, 0));
      });
    copy.owned = std::move(owned);
    copy.panels = copy.owned.get();
    copy.source->release();
    copy.source.reset();
  }
  // C = alpha op(A) W + beta C, W (K x N) the first rows and columns of the
  // copy, widened a block at a time into wide_.
  void widened_product(const Copy& copy, bool ta, int M, int N, int K, float alpha, const float* A, int lda,
                       float beta, float* C, int ldc, FloatGemm float_gemm) {
    constexpr long kWidened = 1L << 21;  // floats widened at a time (8 MB)
    if (M == 0 || N == 0) return;
    const std::byte* P = copy.panels;
    const long cols = copy.cols;
    // W's rows [r0, r1), columns [c0, c1) into wide_, c1 - c0 apart, panels over the threads.
    const auto widen = [&](long r0, long r1, long c0, long c1) {
      wide_.resize(std::size_t((r1 - r0) * (c1 - c0)));
      float* out = wide_.data();
      parallel_ranges(
          r1 - r0, (r1 - r0) * (c1 - c0) > kParallelWork,
          [=](long lo, long hi) { q4_dequantise(P, cols, r0 + lo, r0 + hi, c0, c1, out + lo * (c1 - c0), c1 - c0); },
          kQ4PanelRows);
    };
    if (K > N) {  // blocks of W's rows (A's columns), summed into C
      const long rows = std::max<long>(kQ4PanelRows, kWidened / N / kQ4PanelRows * kQ4PanelRows);
      for (long r = 0; r < K; r += rows) {
        const long n = std::min<long>(rows, K - r);
        widen(r, r + n, 0, N);
        float_gemm(ta, false, M, N, int(n), alpha, ta ? A + r * lda : A + r, lda, wide_.data(), N,
                   r == 0 ? beta : 1.0f, C, ldc);
      }
    } else {  // blocks of W's columns (C's)
      const long width = std::max<long>(kQ4Block, kWidened / std::max(K, 1) / kQ4Block * kQ4Block);
      for (long c = 0; c < N; c += width) {
        const long n = std::min<long>(width, N - c);
        widen(0, K, c, c + n);
        float_gemm(ta, false, M, int(n), K, alpha, A, lda, wide_.data(), int(n), beta, C + c, ldc);
      }
    }
  }

  std::unordered_map<const float*, Copy> copies_;  // by weight
  std::vector<float> wide_;                         // a block of a copy widened (widened_product)
  std::vector<std::int8_t> quantised_;              // a product's rows of A, a block at a time
  std::vector<float> scales_;                       // their blocks' scales
  std::vector<std::int32_t> offsets_;               // and -8 times their sums
};

}  // namespace xfmr::detail
