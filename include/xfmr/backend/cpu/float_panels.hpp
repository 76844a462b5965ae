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
// keep_copy(w, rows, cols, source) registers a rows x cols matrix, whose
// values `source` gives (the tensor's memory at w, or the file a deferred
// tensor reads: core/tensor.hpp); its panels are packed from the source at
// the first product that reads them (B is w: the same pointer and leading
// dimension, no more rows or columns than kept, B transposed as a weight
// is, alpha 1, beta 0), so a matrix no product reads (an embedding) costs
// nothing. Products of more than kPanelMaxRows rows (a prompt) run over
// the panels a chunk of rows at a time, each panel pair read from cache
// for every chunk: every row of a product then has the bits it has alone.
// The panels add the matrix's bytes to what the model holds in memory
// (for a deferred matrix, the source's pages are given back once packed:
// they are its only bytes in memory). w must not change until
// drop_copies(); WeightCopies (infer/weight_copies.hpp) keeps a model's
// matrices for one scope.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <unordered_map>

#include "xfmr/backend/cpu/copy_source.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

class FloatPanels {
 public:
  // Row-major C = A B^T through B's panels when the product qualifies (see
  // above); false otherwise, C untouched.
  bool gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) {
    if (!serves(ta, tb, M, N, K, alpha, B, ldb, beta)) return false;
    Copy& copy = copies_.find(B)->second;
    const auto kernel = cpu_kernels().panel_rows;
    if (!copy.panels) pack(copy);
    const float* P = reinterpret_cast<const float*>(copy.panels.get());
    const long stride = long(copy.cols) * kPanelRows;
    if (M <= kPanelMaxRows) {
      parallel_ranges(
          float_panel_count(N), long(N) * K >= kGemvSplitWork,
          [=](long b0, long b1) { kernel(int(b0), int(b1), N, M, K, P, stride, A, lda, C, ldc); }, 8);
      return true;
    }
    parallel_ranges(float_panel_count(N), true, [=](long b0, long b1) {
      for (long b = b0; b < b1; b += 2)
        for (int m0 = 0; m0 < M; m0 += kPanelMaxRows)
          kernel(int(b), int(b + 2 < b1 ? b + 2 : b1), N, M - m0 < kPanelMaxRows ? M - m0 : kPanelMaxRows, K, P,
                 stride, A + long(m0) * lda, lda, C + long(m0) * ldc, ldc);
    });
    return true;
  }

  // Whether this product reads panels (see above).
  bool serves(bool ta, bool tb, int M, int N, int K, float alpha, const float* B, int ldb, float beta) const {
    if (copies_.empty() || M < 1 || ta || !tb || alpha != 1.0f || beta != 0.0f) return false;
    const auto it = copies_.find(B);
    return it != copies_.end() && cpu_kernels().panel_rows && it->second.cols == ldb && K <= it->second.cols &&
           N <= it->second.rows;
  }
  // Whether a rows x cols matrix is kept in panels: the level has the
  // kernel, and the matrix has kGemvSplitWork weights or more. A smaller
  // one stays in cache, where a product of one row is bound by its chains
  // of multiply-adds (K long here, K / 16 in gemv_rows' lanes), not by the
  // bytes (shakespeare-small's tokens were 30% slower through panels).
  static bool keeps(int rows, int cols) {
    return cpu_kernels().panel_rows && long(rows) * cols >= kGemvSplitWork;
  }
  // Registers the matrix (see above) where keeps(); false otherwise.
  bool keep_copy(const float* w, int rows, int cols, std::shared_ptr<const WeightSource> source) {
    if (!keeps(rows, cols)) return false;
    Copy& copy = copies_[w];
    if (copy.rows == rows && copy.cols == cols) return true;
    copy = Copy{rows, cols, nullptr, std::move(source)};
    return true;
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
  struct Copy {
    int rows = 0, cols = 0;
    LargeBuffer panels;                          // null until the first product
    std::shared_ptr<const WeightSource> source;  // until then
  };
  // Not zeroed first: the threads' packing touches each page once.
  static void pack(Copy& copy) {
    LargeBuffer panels = allocate_large(bytes(copy.rows, copy.cols));
    float* P = reinterpret_cast<float*>(panels.get());
    const int cols = copy.cols;
    for_each_row_chunk(*copy.source, kPanelRows, [=](long r0, long r1, const float* values) {
      pack_float_panels(0, 1, int(r1 - r0), cols, values, cols, P + r0 * cols);
    });
    copy.panels = std::move(panels);
    copy.source->release();
    copy.source.reset();
  }
  std::unordered_map<const float*, Copy> copies_;  // by weight
};

}  // namespace xfmr::detail
