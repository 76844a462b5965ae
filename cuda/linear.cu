// linear.cu: GEMMs through cuBLAS (row-major, see cuda::column_major_gemm),
// the bias kernels of Linear and OutputProjection, and the fused products
// (a product with its bias and GELU, or with GELU's gradient) through
// cuBLASLt's epilogues.
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

// One matmul descriptor and its three layouts, destroyed with it.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  LtCall() = default;
  LtCall(const LtCall&) = delete;
  LtCall& operator=(const LtCall&) = delete;
  ~LtCall() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <class T>
void set_attribute(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t what, const T& value) {
  cuda::detail::check_cublas(cublasLtMatmulDescSetAttribute(op, what, &value, sizeof value),
                             "cublasLtMatmulDescSetAttribute");
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
}  // namespace

// Column-major D (m, n) = op(A) (m, k) B (k, n), float32 throughout, with
// an epilogue: A is a layer's weight, stored (k, m) when trans_a (the
// forward's W^T) and (m, k) otherwise; `bias` has m values; `aux` (m, n)
// with leading dimension ld_aux is GELU's input, written by the GELU_AUX
// epilogues and read by DGELU.
struct CudaBackend::LtProduct {
  cublasLtEpilogue_t epilogue;
  bool trans_a;
  int m, n, k;
  const float* a;
  int lda;
  const float* b;
  int ldb;
  float* d;
  int ldd;
  const float* bias;
  const float* aux;
  int ld_aux;
};

namespace {
cublasComputeType_t lt_compute(const CudaOptions& o) {
  return o.bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : o.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

void describe(LtCall& c, const CudaBackend::LtProduct& p, cublasComputeType_t compute) {
  using cuda::detail::check_cublas;
  check_cublas(cublasLtMatmulDescCreate(&c.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set_attribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_attribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue);
  if (p.bias) set_attribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(p.bias));
  if (p.aux) {
    set_attribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(p.aux));
    set_attribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t(p.ld_aux));
  }
  const auto rows_a = p.trans_a ? p.k : p.m, cols_a = p.trans_a ? p.m : p.k;
  check_cublas(cublasLtMatrixLayoutCreate(&c.a, CUDA_R_32F, rows_a, cols_a, p.lda), "cublasLtMatrixLayoutCreate");
  check_cublas(cublasLtMatrixLayoutCreate(&c.b, CUDA_R_32F, p.k, p.n, p.ldb), "cublasLtMatrixLayoutCreate");
  check_cublas(cublasLtMatrixLayoutCreate(&c.d, CUDA_R_32F, p.m, p.n, p.ldd), "cublasLtMatrixLayoutCreate");
}

// The algorithm cuBLASLt's heuristic picks for p within `workspace` bytes,
// or none where it has none (or rejects the combination).
std::optional<cublasLtMatmulAlgo_t> choose_algorithm(cublasLtHandle_t lt, const CudaBackend::LtProduct& p,
                                                     cublasComputeType_t compute, std::uint64_t workspace) {
  LtCall c;
  describe(c, p, compute);
  cublasLtMatmulPreference_t pref = nullptr;
  cuda::detail::check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(lt, c.op, c.a, c.b, c.d, c.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return std::nullopt;
  cuda::detail::check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) return std::nullopt;
  return result.algo;
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

bool CudaBackend::lt_product(const LtProduct& p) {
  if (!opts_.lt_epilogues || p.m == 0 || p.n == 0) return false;
  const cublasComputeType_t compute = lt_compute(opts_);
  // The heuristic's choice depends on the shape, the types and the
  // operands' alignment; it is asked once for each.
  const std::array<long long, 14> key{p.epilogue, p.trans_a, p.m, p.n, p.k, p.lda, p.ldb, p.ldd, p.ld_aux, compute,
                                      aligned16(p.a) + 2 * aligned16(p.b) + 4 * aligned16(p.d),
                                      p.bias ? 1 + aligned16(p.bias) : 0, p.aux ? 1 + aligned16(p.aux) : 0, 0};
  auto [it, fresh] = ctx_->lt_algos.try_emplace(key);
  if (fresh) it->second = choose_algorithm(ctx_->lt, p, compute, ctx_->blas_workspace.capacity());
  if (!it->second) return false;
  const cublasLtMatmulAlgo_t algo = *it->second;
  cublasLtHandle_t lt = ctx_->lt;
  void* workspace = ctx_->blas_workspace.data();
  const std::size_t workspace_bytes = ctx_->blas_workspace.capacity();
  cuda::detail::enqueue(
      [&](cuda::detail::Signature& s) {
        s.add_all(std::uint8_t(12), p.epilogue, p.trans_a, p.m, p.n, p.k, p.a, p.lda, p.b, p.ldb, p.d, p.ldd, p.bias,
                  p.aux, p.ld_aux);
      },
      [=] {
        LtCall c;
        describe(c, p, compute);
        const float one = 1.0f, zero = 0.0f;
        cuda::detail::check_cublas(cublasLtMatmul(lt, c.op, &one, p.a, c.a, p.b, c.b, &zero, p.d, c.d, p.d, c.d, &algo,
                                                  workspace, workspace_bytes, cuda::detail::stream()),
                                   "cublasLtMatmul");
      });
  return true;
}

// Row-major y (rows, out) = x (rows, in) w^T + bias is column-major
// y^T (out, rows) = w^T x^T: A = w stored (in, out), transposed; B = x^T.
void CudaBackend::linear_forward(int rows, int in, int out, const S* x, const S* w, const S* bias, S* y) {
  if (!bias) return gemm(false, true, rows, out, in, S(1), x, in, w, in, S(0), y, out);
  if (lt_product({CUBLASLT_EPILOGUE_BIAS, true, out, rows, in, w, in, x, in, y, out, bias, nullptr, 0})) {
    ++ctx_->epilogues.fused;
    return;
  }
  ++ctx_->epilogues.unfused;
  gemm(false, true, rows, out, in, S(1), x, in, w, in, S(0), y, out);
  bias_add(rows, out, bias, y);
}

// As linear_forward, h its output (cuBLASLt's GELU input, leading dimension
// a multiple of 8) and y = gelu(h).
void CudaBackend::linear_gelu_forward(int rows, int in, int out, const S* x, const S* w, const S* bias, S* h,
                                      S* y) {
  if (out % 8 == 0 && lt_product({bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, true, out,
                                  rows, in, w, in, x, in, y, out, bias, h, out})) {
    ++ctx_->epilogues.fused;
    return;
  }
  ++ctx_->epilogues.unfused;
  gemm(false, true, rows, out, in, S(1), x, in, w, in, S(0), h, out);
  if (bias) bias_add(rows, out, bias, h);
  gelu_forward(std::size_t(rows) * out, h, y);
}

// Row-major dh (rows, in) = gelu'(h) * (dy (rows, out) w (out, in)) is
// column-major dh^T (in, rows) = w^T dy^T: A = w stored (in, out); B = dy^T;
// h^T the epilogue's input.
void CudaBackend::linear_dgelu_input_grad(int rows, int in, int out, const S* dy, const S* w, const S* h, S* dh) {
  if (in % 8 == 0 &&
      lt_product({CUBLASLT_EPILOGUE_DGELU, false, in, rows, out, w, in, dy, out, dh, in, nullptr, h, in})) {
    ++ctx_->epilogues.fused;
    return;
  }
  ++ctx_->epilogues.unfused;
  gemm(false, false, rows, in, out, S(1), dy, out, w, in, S(0), dh, in);
  gelu_backward(std::size_t(rows) * in, h, dh, dh);
}

CudaBackend::EpilogueStats CudaBackend::epilogue_stats() const { return ctx_->epilogues; }

}  // namespace xfmr
