// small_gemm.hpp: one thread's block of a small row-major product through
// a libxsmm JIT kernel, which streams the operands as they lie instead of
// packing them as BLAS does. Used by CpuBackend::gemm when xfmr is built
// with libxsmm (XFMR_WITH_LIBXSMM) for products, of any number of rows,
// whose weight-sized operand stays in a core's cache.
//
// libxsmm is column-major, and a row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T: libxsmm's A is our B and its B our A.
// op(A) = A^T is its transposed B, which its kernels support; op(B) = B^T
// would be its transposed A, which they do not (1.17), so the caller first
// transposes such a B, once for all threads (transposed(), libxsmm's own
// transposition: a few microseconds for a small model's weight matrix).
#pragma once

#include "xfmr/backend/cpu/family.hpp"

namespace xfmr::detail {
#ifdef XFMR_WITH_LIBXSMM
inline constexpr bool kWithLibxsmm = true;
#else
inline constexpr bool kWithLibxsmm = false;
#endif
}  // namespace xfmr::detail

#ifdef XFMR_WITH_LIBXSMM

#include <libxsmm.h>

#include <cstddef>
#include <type_traits>

namespace xfmr::detail {
inline namespace XFMR_CPU_OPS_NS {

// C[m0:m1, n0:n1] (+)= op(A)[m0:m1, :] * Bn, where Bn is the block's
// (K, n1 - n0) columns of B, row-major with leading dimension ldb (already
// transposed when the product wanted B^T). beta is 0 or 1. False when
// libxsmm has no kernel for the block; C is then untouched.
template <class S>
bool small_gemm_block(bool ta, int m0, int m1, int n0, int n1, int K, const S* A, int lda, const S* Bn, int ldb,
                      S beta, S* C, int ldc) {
  const libxsmm_blasint m = n1 - n0, n = m1 - m0, k = K, la = ldb, lb = lda, lc = ldc;
  const int flags = (ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0) | (beta == S(0) ? LIBXSMM_GEMM_FLAG_BETA_0 : 0);
  const S one = 1;
  const S* a = Bn;                                      // libxsmm's A: (m, k), leading dimension ldb
  const S* b = A + (ta ? m0 : long(m0) * lda);          // libxsmm's B: (k, n), or (n, k) transposed
  S* c = C + long(m0) * ldc + n0;
  if constexpr (std::is_same_v<S, float>) {
    const auto kernel = libxsmm_smmdispatch(m, n, k, &la, &lb, &lc, &one, &beta, &flags, nullptr);
    if (!kernel) return false;
    kernel(a, b, c);
  } else {
    const auto kernel = libxsmm_dmmdispatch(m, n, k, &la, &lb, &lc, &one, &beta, &flags, nullptr);
    if (!kernel) return false;
    kernel(a, b, c);
  }
  return true;
}

// A thread's buffer for transposed(), grown as needed: a type of each
// level's own, where a std::vector<S> would be code the levels share
// (src/kernels/ops_*.cpp).
template <class S>
struct TransposeBuffer {
  S* data = nullptr;
  std::size_t size = 0;
  TransposeBuffer() = default;
  TransposeBuffer(const TransposeBuffer&) = delete;
  TransposeBuffer& operator=(const TransposeBuffer&) = delete;
  ~TransposeBuffer() { delete[] data; }
};

// B^T (K, N) row-major, for B (N, K) with leading dimension ldb, in a
// buffer of this thread's that lives until its next call.
template <class S>
const S* transposed(const S* B, int ldb, int N, int K) {
  thread_local TransposeBuffer<S> out;
  const std::size_t n = std::size_t(N) * K;
  if (out.size < n) {
    delete[] out.data;
    out.data = nullptr;
    out.data = new S[n];
    out.size = n;
  }
  libxsmm_otrans(out.data, B, sizeof(S), K, N, ldb, N);  // column-major: (K, N) in, (N, K) out
  return out.data;
}

}  // namespace XFMR_CPU_OPS_NS
}  // namespace xfmr::detail

#endif
