// portable.cpp: the row kernels of backend/cpu/kernels.hpp for any
// processor (x86-64's baseline, SSE2, or another architecture): Eigen's
// GEMV and softmax (row_references.hpp), a plain loop for the int8 products;
// no kernel for a few rows at once (gemm.hpp sends them to BLAS) or for
// bf16 weight copies (bf16::gemm). Compiled with the library's own flags.
#include <cstdint>

#include "kernels/levels.hpp"
#include "xfmr/backend/cpu/row_references.hpp"

namespace xfmr::detail::portable {
namespace {

void int8_product_rows(int n0, int n1, int M, int K, const std::int8_t* Q, long ldq, const float* scale,
                       const std::int32_t* q_sum, const std::uint8_t* U, long ldu, const ActivationScale* rows,
                       float* C, long ldc) {
  for (int r = n0; r < n1; ++r) {
    const std::int8_t* q = Q + long(r) * ldq;
    for (int m = 0; m < M; ++m) {
      const std::uint8_t* u = U + long(m) * ldu;
      std::int32_t sum = 0;
#ifdef _OPENMP
#pragma omp simd reduction(+ : sum)  // vectorised at -O2 too (GCC 12's cheap model leaves it scalar, 30x slower)
#endif
      for (int k = 0; k < K; ++k) sum += std::int32_t(u[k]) * std::int32_t(q[k]);
      C[long(m) * ldc + r] = int8_output(sum - rows[m].zero * q_sum[r], scale[r], rows[m].scale);
    }
  }
}

}  // namespace

CpuKernels kernels() {
  CpuKernels k{};
  k.level = CpuLevel::portable;
  k.gemv_rows = gemv_rows_reference<float>;
  k.int8_product_rows = int8_product_rows;
  k.int8_isa = "plain loop";
  k.softmax_row = softmax_row_reference<float>;
  return k;
}

}  // namespace xfmr::detail::portable
