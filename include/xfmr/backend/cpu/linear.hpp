// linear.hpp: the CPU's matrix products and biases (layers/linear.hpp,
// layers/output_projection.hpp; CUDA: cuda/linear.cu).
//
//  gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
//      C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C; beta == 0 never reads C.
//      gemm.hpp says which kernel serves which shape; in bf16 precision
//      bf16_products.hpp (operands rounded to bfloat16, float32 sums); with
//      bf16 weights those whose B is a kept weight alone; in int8 precision
//      int8_products.hpp (kept weights read as int8), in 4-bit precision
//      q4_products.hpp.
//  bias_add(rows, n, bias, y)        y[r,:] += bias                  (accumulate)
//  bias_grad(rows, n, dy, dbias)     dbias += sum_r dy[r,:]          (accumulate; columns split, rows in order)
//
// A layer's products with what follows them (Linear, FeedForward), for a
// backend to fuse (CUDA: cuBLASLt's epilogues); w is (out, in) as
// torch.nn.Linear's, bias (out) or null for none:
//  linear_forward(rows, in, out, x, w, bias, y)          y = x w^T + bias                (assign)
//  linear_gelu_forward(rows, in, out, x, w, bias, h, y)  h = x w^T + bias, y = gelu(h)  (assign both)
//  linear_dgelu_input_grad(rows, in, out, dy, w, h, dh)  dh = gelu'(h) * (dy w)          (assign; the input
//      gradient of a Linear whose input was gelu(h); dh and h do not overlap)
// On the CPU they are those operations in turn (gemm, bias_add,
// gelu_forward / gelu_backward; CpuBackend, cpu.hpp), bit for bit.
//  keep_weight_copy(w, rows, cols, source, panels)  registers the rows x cols matrix at w, whose values
//      `source` gives (MemoryWeights over w, or the file of a deferred tensor: core/tensor.hpp), for decoding
//      until drop_weight_copies(): in bf16, int8 and 4-bit precision, products whose B is w read the
//      precision's copy of it (bf16_products.hpp, int8_products.hpp, q4_products.hpp), made at the first such
//      product; in float32, with `panels`, those of a matrix of 2^17 weights or more read its panels
//      (float_panels.hpp). Returns whether w's products are so served (false: a small float32 matrix, read
//      as it is, which must then be in memory). A deferred matrix's products that its copy cannot serve (an
//      int8 or float32 backward pass's, through w untransposed; bf16 and 4-bit copies serve it) read its source
//      into scratch first (as does any product
//      whose B is a lent matrix's address that this backend keeps no copy of: core/tensor.hpp), and
//      embedding_forward (CpuBackend) a lent table's rows from its source (its pages given back after each
//      lookup). w must not change meanwhile
//      (WeightCopies, infer/weight_copies.hpp).
//  keep_weight_copy(w, rows, cols)   the same for a matrix held in memory at w
//  drop_weight_copies()              the copies and registrations dropped
//  weight_copy_bytes()               the bytes of the copies made so far
//  holds_weight_copies()             whether any matrix is registered
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "xfmr/backend/cpu/bf16_products.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/float_panels.hpp"
#include "xfmr/backend/cpu/gemm.hpp"
#include "xfmr/backend/cpu/int8_products.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/backend/cpu/q4_products.hpp"
#include "xfmr/core/weight_source.hpp"

namespace xfmr::detail {

template <class S>
class CpuLinear {
 public:
  explicit CpuLinear(const CpuOptions& opts = {})
      : bf16_(opts.bf16 && std::is_same_v<S, float>),
        bf16_weights_(opts.bf16_weights && std::is_same_v<S, float>),
        int8_(opts.int8 && std::is_same_v<S, float>),
        q4_(opts.q4 && std::is_same_v<S, float>) {}

  void gemm(bool ta, bool tb, int M, int N, int K, S alpha, const S* A, int lda, const S* B, int ldb, S beta, S* C,
            int ldc) {
    if constexpr (std::is_same_v<S, float>) {
      if (any_lent())  // B a lent matrix's address (core/tensor.hpp) that no copy here serves: read its source
        if (const auto source = lent_source(B); source && !serves(ta, tb, M, N, K, alpha, B, ldb, beta))
          B = read_into_scratch(*source);
      if (bf16_ || (bf16_weights_ && products_.serves(ta, tb, N, K, B, ldb)))
        return products_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      const CpuOps<S>& ops = cpu_ops<S>();
      if (int8_ && int8_products_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ops.quantise_rows,
                                       ops.quantise_weight_rows))
        return;
      if (q4_ && q4_products_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ops.quantise_rows_q4,
                                   ops.pack_panel_q4, ops.gemm))
        return;
      if (panels_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    }
    cpu_ops<S>().gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void bias_add(int rows, int n, const S* bias, S* y) { cpu_ops<S>().bias_add(rows, n, bias, y); }
  void bias_grad(int rows, int n, const S* dy, S* dbias) { cpu_ops<S>().bias_grad(rows, n, dy, dbias); }

  bool keep_weight_copy(const S* w, int rows, int cols, std::shared_ptr<const WeightSource> source,
                        bool panels = true);
  // The same for a matrix in memory (its values at w).
  bool keep_weight_copy(const S* w, int rows, int cols) {
    if constexpr (std::is_same_v<S, float>)
      return keep_weight_copy(w, rows, cols, std::make_shared<MemoryWeights>(w, rows, cols));
    return false;
  }
  void drop_weight_copies();
  std::size_t weight_copy_bytes() const;
  bool holds_weight_copies() const { return !kept_.empty(); }

 private:
  // Whether the precision's copy serves this product whose B is a kept matrix.
  bool serves(bool ta, bool tb, int M, int N, int K, S alpha, const S* B, int ldb, S beta) const {
    if constexpr (std::is_same_v<S, float>) {
      if (bf16_ || bf16_weights_) return products_.serves(ta, tb, N, K, B, ldb);
      if (int8_) return int8_products_.serves(ta, tb, N, K, alpha, B, ldb, beta);
      if (q4_) return q4_products_.serves(ta, tb, N, K, alpha, B, ldb, beta);
      return panels_.serves(ta, tb, M, N, K, alpha, B, ldb, beta);
    }
    return false;
  }
  const S* read_into_scratch(const WeightSource& source) {
    scratch_.resize(std::size_t(source.rows() * source.cols()));
    if constexpr (std::is_same_v<S, float>) source.read_rows(0, source.rows(), scratch_.data());
    source.release();  // the file's pages given back: a frozen base's backward reads each matrix a step
    return scratch_.data();
  }

  bool bf16_, bf16_weights_, int8_, q4_;
  Bf16Products products_;       // bf16 precision's products, and the weight copies they read
  Int8Products int8_products_;  // int8 precision's
  Q4Products q4_products_;      // 4-bit precision's
  FloatPanels panels_;          // float32 precision's decoding copies
  std::unordered_map<const S*, std::shared_ptr<const WeightSource>> kept_;  // every matrix registered
  std::vector<S> scratch_;  // a deferred matrix read for a product its copy does not serve
};

inline namespace XFMR_CPU_OPS_NS {

template <class S>
void bias_add(int rows, int n, const S* bias, S* y) {
  parallel_ranges(long(rows), long(rows) * n > kLightParallelWork, [=](long lo, long hi) {
    for (long r = lo; r < hi; ++r) {
      S* yr = y + r * n;
      for (int c = 0; c < n; ++c) yr[c] += bias[c];
    }
  });
}

// Split over columns, each summed over the rows in order: the same result
// on any thread count.
template <class S>
void bias_grad(int rows, int n, const S* dy, S* dbias) {
  parallel_ranges(long(n), long(rows) * n > kParallelWork, [=](long lo, long hi) {
    for (int r = 0; r < rows; ++r) {
      const S* g = dy + long(r) * n;
      for (long c = lo; c < hi; ++c) dbias[c] += g[c];
    }
  });
}

}  // namespace XFMR_CPU_OPS_NS

template <class S>
bool CpuLinear<S>::keep_weight_copy(const S* w, int rows, int cols, std::shared_ptr<const WeightSource> source,
                                    bool panels) {
  if constexpr (std::is_same_v<S, float>) {
    bool served = true;
    if (bf16_ || bf16_weights_) products_.keep_copy(w, rows, cols, source);
    else if (int8_) int8_products_.keep_copy(w, rows, cols, source);
    else if (q4_) q4_products_.keep_copy(w, rows, cols, source);
    else served = panels && panels_.keep_copy(w, rows, cols, source);
    if (!served) return false;
    kept_[w] = std::move(source);
    return true;
  } else {
    (void)w, (void)rows, (void)cols, (void)source, (void)panels;
    return false;
  }
}

template <class S>
void CpuLinear<S>::drop_weight_copies() {
  products_.drop_copies();
  int8_products_.drop_copies();
  q4_products_.drop_copies();
  panels_.drop_copies();
  kept_.clear();
  std::vector<S>().swap(scratch_);
}

template <class S>
std::size_t CpuLinear<S>::weight_copy_bytes() const {
  return products_.copy_bytes() + int8_products_.copy_bytes() + q4_products_.copy_bytes() + panels_.copy_bytes();
}

XFMR_CPU_FAMILY(CpuLinear);

}  // namespace xfmr::detail
