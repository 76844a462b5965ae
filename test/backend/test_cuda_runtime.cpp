#define BOOST_TEST_MODULE cuda_runtime
// The CUDA backend's host side, on any machine: device queries, the
// row-major -> column-major GEMM mapping (checked by running the mapped call
// through a reference column-major GEMM), launch shapes, and clear errors
// when there is no GPU.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/cuda.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/rng.hpp"

using namespace xfmr;

BOOST_AUTO_TEST_CASE(device_queries) {
  const int n = cuda::device_count();
  BOOST_TEST(n >= 0);
  try {
    (void)cuda::device_name(n);  // one past the last device
    BOOST_FAIL("device ordinal " << n << " accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "CUDA device " + std::to_string(n) + " out of range [0, " + std::to_string(n) + ")");
  }
  if (n > 0) BOOST_TEST(!cuda::device_name(0).empty());
}

namespace {
// cuBLAS's column-major SGEMM semantics, on the host:
// C(m,n) = alpha op(X)(m,k) op(Y)(k,n) + beta C, element (i,j) at i + j*ld.
void column_major_sgemm(bool tx, bool ty, int m, int n, int k, float alpha, const float* X, int ldx, const float* Y,
                        int ldy, float beta, float* C, int ldc) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        const float x = tx ? X[p + std::size_t(i) * ldx] : X[i + std::size_t(p) * ldx];
        const float y = ty ? Y[j + std::size_t(p) * ldy] : Y[p + std::size_t(j) * ldy];
        s += double(x) * y;
      }
      float& c = C[i + std::size_t(j) * ldc];
      c = float(alpha * s + (beta == 0.0f ? 0.0 : double(beta) * c));
    }
}
}  // namespace

BOOST_AUTO_TEST_CASE(row_major_gemm_maps_onto_column_major_cublas) {
  Rng rng(3);
  CpuBackend<float> cpu;
  const int M = 7, N = 5, K = 9;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
      std::vector<float> A(std::size_t(ta ? K : M) * lda), B(std::size_t(tb ? N : K) * ldb), C(std::size_t(M) * ldc);
      for (auto* v : {&A, &B, &C})
        for (auto& x : *v) x = float(rng.uniform(-1, 1));
      std::vector<float> expected = C, got = C;
      cpu.gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, expected.data(), ldc);
      const auto g = cuda::column_major_gemm(ta, tb, M, N, K, lda, ldb, ldc);
      column_major_sgemm(g.trans_first, g.trans_second, g.m, g.n, g.k, 0.5f, B.data(), g.ld_first, A.data(),
                         g.ld_second, 2.0f, got.data(), g.ldc);
      for (std::size_t i = 0; i < C.size(); ++i)
        BOOST_TEST(got[i] == expected[i], boost::test_tools::tolerance(1e-5f));
    }
}

BOOST_AUTO_TEST_CASE(launch_shapes_cover_every_element) {
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(255), std::size_t(256), std::size_t(257),
                        std::size_t(1) << 30}) {
    const auto l = cuda::elementwise_launch(n);
    BOOST_TEST(l.threads == 256u);
    BOOST_TEST(l.blocks >= 1u);
    BOOST_TEST(l.blocks <= 65535u);
    // Kernels stride over the grid, so any grid covers n; it never exceeds the need.
    BOOST_TEST(std::size_t(l.blocks - 1) * l.threads < std::max<std::size_t>(n, 1));
  }
}

BOOST_AUTO_TEST_CASE(no_gpu_is_a_clear_error) {
  if (cuda::device_count() > 0) {
    CudaBackend be;  // works, names its device
    BOOST_TEST(!be.device_name().empty());
    BOOST_CHECK_THROW(CudaBackend({.device = cuda::device_count()}), Error);
    return;
  }
  try {
    CudaBackend be;
    BOOST_FAIL("a CUDA backend without a device");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).starts_with("CUDA backend: "), e.what());
  }
  try {
    cuda::Tensor<float> t({4, 4});
    BOOST_FAIL("device memory without a device");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).starts_with("cudaMalloc of 64 bytes failed: "), e.what());
  }
}
