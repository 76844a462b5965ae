// gemm.hpp: detail::gemm, CpuBackend's row-major C = alpha op(A) op(B)
// + beta C, and how it spends the threads on each shape:
//
// - one row times a weight matrix, y = W x (a decoding step's projections):
//   in float the kernels' gemv_rows (cpu/kernels.hpp: the level the CPU
//   runs), in double Eigen's GEMV; from kGemvSplitWork weights W's rows are
//   split over the OpenMP threads, so each core streams its part of the
//   matrix; in float two to multi_rows (16) rows (a batch of decoding
//   steps) likewise through gemv_rows_multi where the level has it, W read
//   once for all of them, each row the bits it gets alone (inside a
//   WeightCopies scope CpuLinear sends a large matrix's products of one to
//   sixteen rows to its panels instead: float_panels.hpp);
// - from kBlasWork multiply-adds and kBlasMinSide rows and columns: one
//   block of C's rows (or columns) per thread, through a libxsmm kernel
//   when the weight-sized operand stays in cache (cpu/small_gemm.hpp), else
//   single-threaded BLAS up to kBlasSplitWork; larger products go to BLAS
//   whole, with its own threads;
// - other single rows against a large matrix: BLAS's threaded GEMV;
// - everything smaller: Eigen, inline.
// BLAS is oneDNN's sgemm for float where xfmr is built with oneDNN,
// OpenBLAS otherwise (and for double). oneDNN picks its kernel from the
// processor's instruction sets; Debian 12's OpenBLAS 0.3.21 picks by model
// and runs its SSE3 kernel (Prescott) on processors newer than it knows:
// 60 GFLOP/s against oneDNN's 300 on the 2-core Xeon (Emerald Rapids) of
// BENCHMARKS.md, where oneDNN also beats OpenBLAS's AVX-512 kernel (265).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <type_traits>

#ifdef XFMR_WITH_OPENBLAS
#include <cblas.h>
#endif

#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/backend/cpu/onednn_sgemm.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/backend/cpu/row_references.hpp"
#include "xfmr/backend/cpu/small_gemm.hpp"

namespace xfmr::detail {
inline namespace XFMR_CPU_OPS_NS {

template <class S>
void gemm(bool ta, bool tb, int M, int N, int K, S alpha, const S* A, int lda, const S* B, int ldb, S beta, S* C,
          int ldc) {
  using MatR = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strided = Eigen::OuterStride<>;
  using Map = Eigen::Map<MatR, 0, Strided>;
  using CMap = Eigen::Map<const MatR, 0, Strided>;

  // One contiguous row times a (N, K) weight matrix, y = W x (a decoding
  // step's projections): the kernels' gemv_rows in float, Eigen's row-major
  // GEMV in double, without the general product's dispatch. From
  // kGemvSplitWork weights each thread takes a block of W's rows (multiples
  // of 16, a multiple of every kernel's block): the product is bound by
  // reading W, and each core then reads its part from its own cache.
  if (M == 1 && tb && !ta && alpha == S(1) && beta == S(0)) {
    const bool split = long(N) * K >= kGemvSplitWork;
    if constexpr (std::is_same_v<S, float>) {
      const auto rows = cpu_kernels().gemv_rows;
      parallel_ranges(N, split, [=](long n0, long n1) { rows(int(n0), int(n1), K, B, ldb, A, C); }, 16);
    } else {
      parallel_ranges(
          N, split, [=](long n0, long n1) { gemv_rows_reference(int(n0), int(n1), K, B, ldb, A, C); }, 16);
    }
    return;
  }
  // A few rows times a weight matrix (a batch of decoding steps): the
  // kernels' gemv_rows_multi reads W once for all of them, each row's
  // outputs the bits of its own y = W x above; BLAS would pack W for them.
  if constexpr (std::is_same_v<S, float>) {
    const CpuKernels& kernels = cpu_kernels();
    if (M > 1 && M <= kernels.multi_rows && tb && !ta && alpha == S(1) && beta == S(0)) {
      const auto multi = kernels.gemv_rows_multi;
      parallel_ranges(
          N, long(N) * K >= kGemvSplitWork,
          [=](long n0, long n1) { multi(M, int(n0), int(n1), K, B, ldb, A, lda, C, ldc); }, 16);
      return;
    }
  }
#ifdef XFMR_WITH_OPENBLAS
  // Small products and matrix-vector ones (a decoding step's single rows)
  // stay inline in Eigen: BLAS would pack a whole operand for one row.
  if (M >= kBlasMinSide && N >= kBlasMinSide && long(M) * N * K >= kBlasWork) {
    const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    auto blas = [=](int m0, int m1, int n0, int n1) {
      const S* a = A + (ta ? m0 : long(m0) * lda);
      const S* b = B + (tb ? long(n0) * ldb : n0);
      S* c = C + long(m0) * ldc + n0;
      if constexpr (std::is_same_v<S, float>) {
        if (!onednn_sgemm(ta, tb, m1 - m0, n1 - n0, K, alpha, a, lda, b, ldb, beta, c, ldc))
          cblas_sgemm(CblasRowMajor, opa, opb, m1 - m0, n1 - n0, K, alpha, a, lda, b, ldb, beta, c, ldc);
      } else {
        cblas_dgemm(CblasRowMajor, opa, opb, m1 - m0, n1 - n0, K, alpha, a, lda, b, ldb, beta, c, ldc);
      }
    };
    // With libxsmm, each thread multiplies its own block of C's rows (or
    // columns) with a JIT kernel, without packing, whenever the (K, N)
    // operand stays in cache (B^T is transposed once first, when there are
    // enough rows to pay for it). Otherwise, up to a few million
    // multiply-adds, one single-threaded BLAS call per thread on its block
    // beats BLAS's own threading, which splits and synchronises inside
    // each call; larger products share their packed panels and go to BLAS
    // whole.
    const bool small = kWithLibxsmm && alpha == S(1) && (beta == S(0) || beta == S(1)) &&
                       long(K) * N * long(sizeof(S)) <= kSmallGemmPanelBytes &&
                       (!tb || M >= kSmallGemmTransposeRows);
    if (small || long(M) * N * K < kBlasSplitWork) {
#ifdef XFMR_WITH_LIBXSMM
      const S* bs = small && tb ? transposed(B, ldb, N, K) : B;
      const int ldbs = small && tb ? N : ldb;
#endif
      const bool by_rows = M >= N;
      parallel_ranges(
          by_rows ? M : N, true,
          [=](long lo, long hi) {
            const int m0 = by_rows ? int(lo) : 0, m1 = by_rows ? int(hi) : M;
            const int n0 = by_rows ? 0 : int(lo), n1 = by_rows ? N : int(hi);
#ifdef XFMR_WITH_LIBXSMM
            if (small && small_gemm_block(ta, m0, m1, n0, n1, K, A, lda, bs + n0, ldbs, beta, C, ldc))
              return;
#endif
            blas(m0, m1, n0, n1);
          },
          kBlasSplitGrain);
      return;
    }
    blas(0, M, 0, N);
    return;
  }
  // Any other single row against a large matrix (transposed, scaled or
  // accumulating; y = W x was handled above) streams the whole
  // matrix for one row: memory bound, so OpenBLAS's threaded GEMV, which
  // splits the matrix over the cores and their caches, wins.
  if (M == 1 && long(N) * K >= kGemvThreadedWork) {
    const int incx = ta ? lda : 1;
    if constexpr (std::is_same_v<S, float>) {
      if (tb) cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A, incx, beta, C, 1);
      else cblas_sgemv(CblasRowMajor, CblasTrans, K, N, alpha, B, ldb, A, incx, beta, C, 1);
    } else {
      if (tb) cblas_dgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A, incx, beta, C, 1);
      else cblas_dgemv(CblasRowMajor, CblasTrans, K, N, alpha, B, ldb, A, incx, beta, C, 1);
    }
    return;
  }
#endif
  const CMap a(A, ta ? K : M, ta ? M : K, Strided(lda));
  const CMap b(B, tb ? N : K, tb ? K : N, Strided(ldb));
  Map c(C, M, N, Strided(ldc));
  // alpha == 1 (every layer's product) is left out of the expression: with
  // it, Eigen copies a single-row operand into a heap temporary.
  auto run = [&](const auto& opa, const auto& opb) {
    if (beta == S(0)) {
      if (alpha == S(1)) c.noalias() = opa * opb;
      else c.noalias() = alpha * opa * opb;
    } else {
      if (beta != S(1)) c *= beta;
      if (alpha == S(1)) c.noalias() += opa * opb;
      else c.noalias() += alpha * opa * opb;
    }
  };
  if (!ta && !tb) run(a, b);
  else if (ta && !tb) run(a.transpose(), b);
  else if (!ta && tb) run(a, b.transpose());
  else run(a.transpose(), b.transpose());
}

}  // namespace XFMR_CPU_OPS_NS
}  // namespace xfmr::detail
