// float_panels.hpp: detail::FloatPanels, CpuBackend<float>'s decoding
// copies in float32 precision: each kept weight matrix also in panels
// (cpu/kernels.hpp's float panels: 16 rows' column k in one 64-byte group),
// read by the products of a few rows (a decoding step, a batch of streams).
//
// Row-major W (N, K) read a row at a time sums each output in 16 lanes and
// adds the lanes at the end; eight rows of X against it (gemv_rows_multi)
// reach a third of the read bandwidth on the 2-core Zen 5 of BENCHMARKS.md.
// A panel is one stream of consecutive bytes whose every load feeds one
// multiply-add a row of X into 16 outputs at once: eight rows stream
// gpt2-small's matrices at the read bandwidth, and one row faster than
// gemv_rows (the numbers are in BENCHMARKS.md). Each output is one chain of
// multiply-adds over k in order, so a row's outputs are the same bits
// whatever rows come with it (1 to kPanelMaxRows) and at every level with
// the kernel (AVX2's, AVX-512's), though not gemv_rows' bits.
//
// keep_copy(w, rows, cols) registers a contiguous rows x cols matrix; its
// panels are packed at the first product that reads them (B is w: the same
// pointer and leading dimension, no more rows or columns than kept, B
// transposed as a weight is, 1 to kPanelMaxRows rows of A, alpha 1, beta
// 0), so a matrix no such product reads (an embedding, a classifier's
// batches) costs nothing. They double the bytes of the matrices decoding
// reads while kept. w must not change until drop_copies(); WeightCopies
// (infer/weight_copies.hpp) keeps a model's matrices for one scope.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <unordered_map>

#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

class FloatPanels {
 public:
  // Row-major C = A B^T through B's panels when the product qualifies (see
  // above) and the level has the kernel; false otherwise, C untouched.
  bool gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) {
    if (copies_.empty() || M < 1 || M > kPanelMaxRows || ta || !tb || alpha != 1.0f || beta != 0.0f) return false;
    const auto it = copies_.find(B);
    if (it == copies_.end()) return false;
    Copy& copy = it->second;
    const auto kernel = cpu_kernels().panel_rows;
    if (!kernel || copy.cols != ldb || K > copy.cols || N > copy.rows) return false;
    if (!copy.panels) pack(B, copy);
    const float* P = copy.panels.get();
    const long stride = long(copy.cols) * kPanelRows;
    parallel_ranges(
        float_panel_count(N), long(N) * K >= kGemvSplitWork,
        [=](long b0, long b1) { kernel(int(b0), int(b1), N, M, K, P, stride, A, lda, C, ldc); }, 8);
    return true;
  }

  // A matrix of fewer than kGemvSplitWork weights is not kept: it stays in
  // cache, where a product of one row is bound by its chains of
  // multiply-adds (K long here, K / 16 in gemv_rows' lanes), not by the
  // bytes (shakespeare-small's tokens were 30% slower through panels).
  void keep_copy(const float* w, int rows, int cols) {
    if (long(rows) * cols < kGemvSplitWork) return;
    Copy& copy = copies_[w];
    if (copy.rows == rows && copy.cols == cols) return;
    copy = Copy{rows, cols, nullptr};
  }
  void drop_copies() { copies_.clear(); }
  // Matrices kept (packed or not yet), and the bytes of those packed.
  bool kept() const { return !copies_.empty(); }
  std::size_t copy_bytes() const {
    std::size_t n = 0;
    for (const auto& [w, c] : copies_)
      if (c.panels) n += bytes(c.rows, c.cols);
    return n;
  }
  // The bytes of a rows x cols matrix's panels.
  static std::size_t bytes(int rows, int cols) {
    return std::size_t(float_panel_count(rows)) * kPanelRows * std::size_t(cols) * sizeof(float);
  }

 private:
  struct AlignedDelete {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  struct Copy {
    int rows = 0, cols = 0;
    std::unique_ptr<float[], AlignedDelete> panels;  // null until the first product
  };
  // Not zeroed first: the threads' packing touches each page once.
  static void pack(const float* w, Copy& copy) {
    float* P = static_cast<float*>(::operator new[](bytes(copy.rows, copy.cols), std::align_val_t{64}));
    copy.panels.reset(P);
    const int rows = copy.rows, cols = copy.cols;
    parallel_ranges(float_panel_count(rows), long(rows) * cols > kParallelWork,
                    [=](long b0, long b1) { pack_float_panels(b0, b1, rows, cols, w, cols, P); });
  }
  std::unordered_map<const float*, Copy> copies_;  // by weight
};

}  // namespace xfmr::detail
