// linear.cu: GEMMs through cuBLAS (row-major, see cuda::column_major_gemm),
// and the bias kernels of Linear and OutputProjection.
#include "common.cuh"

namespace xfmr {

namespace {
using cuda::detail::first_index;
using cuda::detail::grid_stride;

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

__global__ void bias_add_kernel(int rows, int n, const float* bias, float* y) {
  const std::size_t total = std::size_t(rows) * n;
  for (std::size_t i = first_index(); i < total; i += grid_stride()) y[i] += bias[i % n];
}

struct BiasGradTerm {
  const float* dy;
  int n;
  int unused = 0;  // no padding (graph signatures)
  __device__ void operator()(int r, int c, float* acc) const { acc[0] += dy[std::size_t(r) * n + c]; }
};
}  // namespace

void CudaBackend::gemm(bool ta, bool tb, int M, int N, int K, S alpha, const S* A, int lda, const S* B, int ldb,
                       S beta, S* C, int ldc) {
  if (M == 0 || N == 0) return;
  const auto g = cuda::column_major_gemm(ta, tb, M, N, K, lda, ldb, ldc);
  cublasHandle_t h = ctx_->blas;
  const bool bf16 = opts_.bf16;
  cuda::detail::enqueue(
      [&](cuda::detail::Signature& s) {
        s.add_all(std::uint8_t(10), g.trans_first, g.trans_second, g.m, g.n, g.k, g.ld_first, g.ld_second, g.ldc,
                  alpha, A, B, beta, C);
      },
      [=] {
        if (bf16) {  // float32 matrices, products on bfloat16-rounded operands, float32 sums
          cuda::detail::check_cublas(
              cublasGemmEx(h, op(g.trans_first), op(g.trans_second), g.m, g.n, g.k, &alpha, B, CUDA_R_32F, g.ld_first,
                           A, CUDA_R_32F, g.ld_second, &beta, C, CUDA_R_32F, g.ldc, CUBLAS_COMPUTE_32F_FAST_16BF,
                           CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx (bf16)");
          return;
        }
        cuda::detail::check_cublas(cublasSgemm(h, op(g.trans_first), op(g.trans_second), g.m, g.n, g.k, &alpha, B,
                                               g.ld_first, A, g.ld_second, &beta, C, g.ldc),
                                   "cublasSgemm");
      });
}

void CudaBackend::gemm_strided_batched(bool ta, bool tb, int M, int N, int K, S alpha, const S* A, int lda,
                                       long stride_a, const S* B, int ldb, long stride_b, S beta, S* C, int ldc,
                                       long stride_c, int batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const auto g = cuda::column_major_gemm(ta, tb, M, N, K, lda, ldb, ldc);
  cublasHandle_t h = ctx_->blas;
  cuda::detail::enqueue(
      [&](cuda::detail::Signature& s) {
        s.add_all(std::uint8_t(11), g.trans_first, g.trans_second, g.m, g.n, g.k, g.ld_first, g.ld_second, g.ldc,
                  alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch);
      },
      [=] {
        cuda::detail::check_cublas(
            cublasSgemmStridedBatched(h, op(g.trans_first), op(g.trans_second), g.m, g.n, g.k, &alpha, B, g.ld_first,
                                      stride_b, A, g.ld_second, stride_a, &beta, C, g.ldc, stride_c, batch),
            "cublasSgemmStridedBatched");
      });
}

void CudaBackend::bias_add(int rows, int n, const S* bias, S* y) {
  cuda::detail::launch("bias_add", cuda::elementwise_launch(std::size_t(rows) * n), bias_add_kernel, rows, n, bias, y);
}

void CudaBackend::bias_grad(int rows, int n, const S* dy, S* dbias) {
  cuda::detail::add_column_sums<1>("bias_grad", rows, n, BiasGradTerm{dy, n}, {{dbias}}, ctx_->column_partial);
}

}  // namespace xfmr
