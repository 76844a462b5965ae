// portable.cpp: the row kernels of backend/cpu/kernels.hpp for any
// processor (x86-64's baseline, SSE2, or another architecture): Eigen's
// GEMV and softmax (row_references.hpp), plain loops for the int8 and 4-bit
// products;
// no kernel for a few rows at once (gemm.hpp sends them to BLAS) or for
// bf16 weight copies (bf16::gemm). Compiled with the library's own flags.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/levels.hpp"
#include "xfmr/core/q4.hpp"
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

// Each panel's blocks unpacked once for all M rows, then q4.hpp's formula
// output by output (std::fma: the fused multiply-add of the other levels).
void q4_product_rows(int n0, int n1, int M, int K, const std::byte* P, const std::int8_t* Q, long ldq,
                     const float* scale, const std::int32_t* offset, long lds, float* C, long ldc) {
  const long blocks = q4_blocks(K);
  std::vector<std::uint8_t> q(std::size_t(blocks) * kQ4PanelRows * kQ4Block);
  std::vector<float> d(std::size_t(blocks) * kQ4PanelRows);
  for (int r0 = n0; r0 < n1; r0 += kQ4PanelRows) {
    const long p = r0 / kQ4PanelRows;
    for (long b = 0; b < blocks; ++b)
      for (int i = 0; i < kQ4PanelRows; ++i)
        d[std::size_t(b * kQ4PanelRows + i)] =
            q4_unpack_row(P + q4_offset(K, p, b), i, q.data() + (b * kQ4PanelRows + i) * kQ4Block);
    for (int r = r0; r < n1 && r < r0 + kQ4PanelRows; ++r)
      for (int m = 0; m < M; ++m) {
        float acc = 0.0f;
        for (long b = 0; b < blocks; ++b) {
          const std::uint8_t* w = q.data() + (b * kQ4PanelRows + (r - r0)) * kQ4Block;
          const std::int8_t* a = Q + m * ldq + b * kQ4Block;
          std::int32_t sum = offset[m * lds + b];
          for (int k = 0; k < kQ4Block; ++k) sum += std::int32_t(a[k]) * std::int32_t(w[k]);
          acc = std::fma(float(sum), d[std::size_t(b * kQ4PanelRows + (r - r0))] * scale[m * lds + b], acc);
        }
        C[m * ldc + r] = acc;
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
  k.q4_product_rows = q4_product_rows;
  k.q4_isa = "plain loop";
  k.softmax_row = softmax_row_reference<float>;
  return k;
}

}  // namespace xfmr::detail::portable
