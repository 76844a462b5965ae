// linear.hpp: the CPU's matrix products and biases (layers/linear.hpp,
// layers/output_projection.hpp; CUDA: cuda/linear.cu).
//
//  gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
//      C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C; beta == 0 never reads C.
//      gemm.hpp says which kernel serves which shape; in bf16 precision
//      bf16_products.hpp (operands rounded to bfloat16, float32 sums); in
//      int8 precision int8_products.hpp (kept weights read as int8).
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
//  keep_weight_copy(w, rows, cols)   in bf16 (int8) precision, products whose B is w read its bfloat16
//  drop_weight_copies()              (int8, a scale a row) copy until drop_weight_copies(); w must not
//  weight_copy_bytes()               change meanwhile (WeightCopies, infer/weight_copies.hpp). In float32
//  holds_weight_copies()             keep_weight_copy does nothing.
//  keep_weight_copy(w, rows, cols, q, scale)  the same with w's int8 rows and scales given (a saved
//                                    int8 model's; w holds scale_r q_rk): int8 precision keeps them as they are.
//  keep_decoding_copy(w, rows, cols) in float32 precision, products of a few rows (a decoding step's)
//                                    whose B is w read its panels (float_panels.hpp), packed at the first
//                                    one, until drop_weight_copies(); in bf16 and int8 it does nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "xfmr/backend/cpu/bf16_products.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/float_panels.hpp"
#include "xfmr/backend/cpu/gemm.hpp"
#include "xfmr/backend/cpu/int8_products.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

template <class S>
class CpuLinear {
 public:
  explicit CpuLinear(const CpuOptions& opts = {})
      : bf16_(opts.bf16 && std::is_same_v<S, float>), int8_(opts.int8 && std::is_same_v<S, float>) {}

  void gemm(bool ta, bool tb, int M, int N, int K, S alpha, const S* A, int lda, const S* B, int ldb, S beta, S* C,
            int ldc) {
    if constexpr (std::is_same_v<S, float>) {
      if (bf16_) return products_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      if (int8_ && int8_products_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, cpu_ops<S>().quantise_rows))
        return;
      if (panels_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    }
    cpu_ops<S>().gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void bias_add(int rows, int n, const S* bias, S* y) { cpu_ops<S>().bias_add(rows, n, bias, y); }
  void bias_grad(int rows, int n, const S* dy, S* dbias) { cpu_ops<S>().bias_grad(rows, n, dy, dbias); }

  void keep_weight_copy(const S* w, int rows, int cols);
  void keep_weight_copy(const S* w, int rows, int cols, const std::int8_t* q, const float* scale);
  void keep_decoding_copy(const S* w, int rows, int cols);
  void drop_weight_copies();
  std::size_t weight_copy_bytes() const;
  bool holds_weight_copies() const { return weight_copy_bytes() > 0 || panels_.kept(); }

 private:
  bool bf16_, int8_;
  Bf16Products products_;       // bf16 precision's products, and the weight copies they read
  Int8Products int8_products_;  // int8 precision's
  FloatPanels panels_;          // float32 precision's decoding copies
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
void CpuLinear<S>::keep_weight_copy(const S* w, int rows, int cols) {
  if constexpr (std::is_same_v<S, float>) {
    if (bf16_) products_.keep_copy(w, rows, cols);
    if (int8_) int8_products_.keep_copy(w, rows, cols);
  } else {
    (void)w, (void)rows, (void)cols;
  }
}

template <class S>
void CpuLinear<S>::keep_weight_copy(const S* w, int rows, int cols, const std::int8_t* q, const float* scale) {
  if constexpr (std::is_same_v<S, float>) {
    if (int8_) return int8_products_.keep_copy(w, rows, cols, q, scale);
  }
  (void)q, (void)scale;
  keep_weight_copy(w, rows, cols);
}

template <class S>
void CpuLinear<S>::keep_decoding_copy(const S* w, int rows, int cols) {
  if constexpr (std::is_same_v<S, float>) {
    if (!bf16_ && !int8_) panels_.keep_copy(w, rows, cols);
  } else {
    (void)w, (void)rows, (void)cols;
  }
}

template <class S>
void CpuLinear<S>::drop_weight_copies() {
  products_.drop_copies();
  int8_products_.drop_copies();
  panels_.drop_copies();
}

template <class S>
std::size_t CpuLinear<S>::weight_copy_bytes() const {
  return products_.copy_bytes() + int8_products_.copy_bytes() + panels_.copy_bytes();
}

XFMR_CPU_FAMILY(CpuLinear);

}  // namespace xfmr::detail
