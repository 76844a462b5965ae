// linear.cu: GEMMs through cuBLAS (row-major, see cuda::column_major_gemm),
// the bias kernels of Linear and OutputProjection, and the fused products
// (a product with its bias and GELU, or with GELU's gradient) through
// cuBLASLt's epilogues.
//
// Types. CudaBackend's products are float32 (strict, TF32, or bf16-rounded
// operands: CudaOptions). CudaBf16Backend's read bfloat16 operands
// (activations, weights' product copies) and sum in float32 on the tensor
// cores (CUBLAS_COMPUTE_32F), writing bfloat16 activations or float32
// parameter gradients.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

template <class T>
constexpr cudaDataType_t data_type() {
  return std::is_same_v<T, Bf16> ? CUDA_R_16BF : CUDA_R_32F;
}

// W elements a thread at a time (common.cuh's with_pack_width; n a multiple
// of W, so a pack never wraps a row).
template <class A, int W>
__global__ void bias_add_kernel(int rows, int n, const float* bias, A* y) {
  const std::size_t total = std::size_t(rows) * n;
  for (std::size_t i = first_index() * W; i < total; i += grid_stride() * W) {
    float v[W];
    load<W>(y + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] += bias[(i + k) % n];
    store<W>(y + i, v);
  }
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
  check_cublas(cublasLtMatmulDescSetAttribute(op, what, &value, sizeof value), "cublasLtMatmulDescSetAttribute");
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
}  // namespace

// Column-major D (m, n) = op(A) (m, k) B (k, n) with an epilogue: A is a
// layer's weight, stored (k, m) when trans_a (the forward's W^T) and (m, k)
// otherwise; `bias` has m values; `aux` (m, n) with leading dimension ld_aux
// is GELU's input, written by the GELU_AUX epilogues and read by DGELU.
// A, B, D, the bias and aux are all of `type` (float32, or bfloat16 for
// CudaBf16Backend, whose bias is rounded for the call); sums in float32.
struct cuda::LtProduct {
  cublasLtEpilogue_t epilogue;
  bool trans_a;
  int m, n, k;
  const void* a;
  int lda;
  const void* b;
  int ldb;
  void* d;
  int ldd;
  const void* bias;
  const void* aux;
  int ld_aux;
  cudaDataType_t type;
};

namespace {
cublasComputeType_t lt_compute(const CudaOptions& o, cudaDataType_t type) {
  if (type == CUDA_R_16BF) return CUBLAS_COMPUTE_32F;
  return o.bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : o.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

void describe(LtCall& c, const cuda::LtProduct& p, cublasComputeType_t compute) {
  check_cublas(cublasLtMatmulDescCreate(&c.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set_attribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_attribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue);
  if (p.bias) set_attribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
  if (p.aux) {
    set_attribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
    set_attribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t(p.ld_aux));
  }
  const auto rows_a = p.trans_a ? p.k : p.m, cols_a = p.trans_a ? p.m : p.k;
  check_cublas(cublasLtMatrixLayoutCreate(&c.a, p.type, rows_a, cols_a, p.lda), "cublasLtMatrixLayoutCreate");
  check_cublas(cublasLtMatrixLayoutCreate(&c.b, p.type, p.k, p.n, p.ldb), "cublasLtMatrixLayoutCreate");
  check_cublas(cublasLtMatrixLayoutCreate(&c.d, p.type, p.m, p.n, p.ldd), "cublasLtMatrixLayoutCreate");
}

// The algorithm cuBLASLt's heuristic picks for p within `workspace` bytes,
// or none where it has none (or rejects the combination).
std::optional<cublasLtMatmulAlgo_t> choose_algorithm(cublasLtHandle_t lt, const cuda::LtProduct& p,
                                                     cublasComputeType_t compute, std::uint64_t workspace) {
  LtCall c;
  describe(c, p, compute);
  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(lt, c.op, c.a, c.b, c.d, c.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return std::nullopt;
  check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) return std::nullopt;
  return result.algo;
}

template <class A>
struct BiasGradTerm {
  const A* dy;
  int n;
  int unused = 0;  // no padding (graph signatures)
  __device__ void operator()(int r, int c, float* acc) const { acc[0] += to_float(dy[std::size_t(r) * n + c]); }
};

// C = alpha op(A) op(B) + beta C through cublasGemmEx: operands of type
// `ab`, C of type `c_type`, float32 sums (`compute`).
void gemm_ex(const cuda::ColumnMajorGemm& g, cublasHandle_t h, float alpha, const void* A, const void* B,
             cudaDataType_t ab, float beta, void* C, cudaDataType_t c_type, cublasComputeType_t compute) {
  check_cublas(cublasGemmEx(h, op(g.trans_first), op(g.trans_second), g.m, g.n, g.k, &alpha, B, ab, g.ld_first, A, ab,
                            g.ld_second, &beta, C, c_type, g.ldc, compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

// The product of gemm() (C of type C_T) queued or recorded (signature tag 10).
template <class A, class C_T>
void queue_gemm(cublasHandle_t h, const CudaOptions& o, bool ta, bool tb, int M, int N, int K, float alpha,
                const A* a, int lda, const A* b, int ldb, float beta, C_T* c, int ldc) {
  if (M == 0 || N == 0) return;
  const auto g = cuda::column_major_gemm(ta, tb, M, N, K, lda, ldb, ldc);
  const bool bf16 = o.bf16;
  enqueue(
      [&](Signature& s) {
        s.add_all(std::uint8_t(10), std::uint8_t(sizeof(A)), std::uint8_t(sizeof(C_T)), g.trans_first,
                  g.trans_second, g.m, g.n, g.k, g.ld_first, g.ld_second, g.ldc, alpha, a, b, beta, c);
      },
      [=] {
        if constexpr (std::is_same_v<A, Bf16>) {  // bfloat16 operands, float32 sums
          gemm_ex(g, h, alpha, a, b, CUDA_R_16BF, beta, c, data_type<C_T>(), CUBLAS_COMPUTE_32F);
        } else if (bf16) {  // float32 matrices, products on bfloat16-rounded operands, float32 sums
          gemm_ex(g, h, alpha, a, b, CUDA_R_32F, beta, c, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF);
        } else {
          check_cublas(cublasSgemm(h, op(g.trans_first), op(g.trans_second), g.m, g.n, g.k, &alpha, b, g.ld_first, a,
                                   g.ld_second, &beta, c, g.ldc),
                       "cublasSgemm");
        }
      });
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::gemm(bool ta, bool tb, int M, int N, int K, S alpha, const A* a, int lda, const A* b,
                               int ldb, S beta, A* c, int ldc) {
  queue_gemm(ctx_->blas, opts_, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}
template <class A>
void BasicCudaBackend<A>::gemm(bool ta, bool tb, int M, int N, int K, S alpha, const NarrowA* a, int lda,
                               const NarrowA* b, int ldb, S beta, S* c, int ldc) {
  queue_gemm(ctx_->blas, opts_, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class A>
template <class C>
void BasicCudaBackend<A>::gemm_strided_batched(bool ta, bool tb, int M, int N, int K, S alpha, const A* a, int lda,
                                               long stride_a, const A* b, int ldb, long stride_b, S beta, C* c,
                                               int ldc, long stride_c, int batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const auto g = cuda::column_major_gemm(ta, tb, M, N, K, lda, ldb, ldc);
  cublasHandle_t h = ctx_->blas;
  enqueue(
      [&](Signature& s) {
        s.add_all(std::uint8_t(11), std::uint8_t(sizeof(A)), std::uint8_t(sizeof(C)), g.trans_first, g.trans_second,
                  g.m, g.n, g.k, g.ld_first, g.ld_second, g.ldc, alpha, a, stride_a, b, stride_b, beta, c, stride_c,
                  batch);
      },
      [=] {
        if constexpr (kNarrow) {
          check_cublas(cublasGemmStridedBatchedEx(h, op(g.trans_first), op(g.trans_second), g.m, g.n, g.k, &alpha, b,
                                                  CUDA_R_16BF, g.ld_first, stride_b, a, CUDA_R_16BF, g.ld_second,
                                                  stride_a, &beta, c, data_type<C>(), g.ldc, stride_c, batch,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "cublasGemmStridedBatchedEx");
        } else {
          check_cublas(cublasSgemmStridedBatched(h, op(g.trans_first), op(g.trans_second), g.m, g.n, g.k, &alpha, b,
                                                 g.ld_first, stride_b, a, g.ld_second, stride_a, &beta, c, g.ldc,
                                                 stride_c, batch),
                       "cublasSgemmStridedBatched");
        }
      });
}

template <class A>
void BasicCudaBackend<A>::bias_add(int rows, int n, const S* bias, A* y) {
  const std::size_t total = std::size_t(rows) * n;
  with_pack_width<A>(
      std::size_t(n),
      [&](auto w) {
        launch("bias_add", cuda::elementwise_launch(total / w), bias_add_kernel<A, w()>, rows, n, bias, y);
      },
      y);
}

template <class A>
void BasicCudaBackend<A>::bias_grad(int rows, int n, const A* dy, S* dbias) {
  add_column_sums<1>("bias_grad", rows, n, BiasGradTerm<A>{dy, n}, {{dbias}}, ctx_->column_partial);
}

template <class A>
bool BasicCudaBackend<A>::lt_product(const cuda::LtProduct& product) {
  if (!opts_.lt_epilogues || product.m == 0 || product.n == 0) return false;
  cuda::LtProduct p = product;
  const cublasComputeType_t compute = lt_compute(opts_, p.type);
  // The heuristic's choice depends on the shape, the types and the
  // operands' alignment; it is asked once for each. (A bfloat16 bias is
  // rounded into a scratch of its own, aligned.)
  const std::array<long long, 14> key{p.epilogue, p.trans_a, p.m, p.n, p.k, p.lda, p.ldb, p.ldd, p.ld_aux, compute,
                                      aligned16(p.a) + 2 * aligned16(p.b) + 4 * aligned16(p.d),
                                      p.bias ? 1 + aligned16(p.bias) : 0, p.aux ? 1 + aligned16(p.aux) : 0, p.type};
  auto [it, fresh] = ctx_->lt_algos.try_emplace(key);
  if (fresh) it->second = choose_algorithm(ctx_->lt, p, compute, ctx_->blas_workspace.capacity());
  if (!it->second) return false;
  if constexpr (kNarrow) {  // the bias in the output's type, as cuBLASLt reads it
    if (p.bias) {
      Bf16* rounded = ctx_->narrow_bias.reserve(std::size_t(p.m));
      cuda::round_to_bf16(std::size_t(p.m), static_cast<const float*>(p.bias), rounded);
      p.bias = rounded;
    }
  }
  const cublasLtMatmulAlgo_t algo = *it->second;
  cublasLtHandle_t lt = ctx_->lt;
  void* workspace = ctx_->blas_workspace.data();
  const std::size_t workspace_bytes = ctx_->blas_workspace.capacity();
  enqueue(
      [&](Signature& s) {
        s.add_all(std::uint8_t(12), p.epilogue, p.trans_a, p.m, p.n, p.k, p.a, p.lda, p.b, p.ldb, p.d, p.ldd, p.bias,
                  p.aux, p.ld_aux, p.type);
      },
      [=] {
        LtCall c;
        describe(c, p, compute);
        const float one = 1.0f, zero = 0.0f;
        check_cublas(cublasLtMatmul(lt, c.op, &one, p.a, c.a, p.b, c.b, &zero, p.d, c.d, p.d, c.d, &algo, workspace,
                                    workspace_bytes, stream()),
                     "cublasLtMatmul");
      });
  return true;
}

// Row-major y (rows, out) = x (rows, in) w^T + bias is column-major
// y^T (out, rows) = w^T x^T: A = w stored (in, out), transposed; B = x^T.
template <class A>
void BasicCudaBackend<A>::linear_forward(int rows, int in, int out, const A* x, const A* w, const S* bias, A* y) {
  if (!bias) return gemm(false, true, rows, out, in, S(1), x, in, w, in, S(0), y, out);
  if (lt_product({CUBLASLT_EPILOGUE_BIAS, true, out, rows, in, w, in, x, in, y, out, bias, nullptr, 0,
                  data_type<A>()})) {
    ++ctx_->epilogues.fused;
    return;
  }
  ++ctx_->epilogues.unfused;
  gemm(false, true, rows, out, in, S(1), x, in, w, in, S(0), y, out);
  bias_add(rows, out, bias, y);
}

// As linear_forward, h its output (cuBLASLt's GELU input, leading dimension
// a multiple of 8) and y = gelu(h).
template <class A>
void BasicCudaBackend<A>::linear_gelu_forward(int rows, int in, int out, const A* x, const A* w, const S* bias, A* h,
                                              A* y) {
  if (out % 8 == 0 && lt_product({bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, true, out,
                                  rows, in, w, in, x, in, y, out, bias, h, out, data_type<A>()})) {
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
template <class A>
void BasicCudaBackend<A>::linear_dgelu_input_grad(int rows, int in, int out, const A* dy, const A* w, const A* h,
                                                  A* dh) {
  if (in % 8 == 0 && lt_product({CUBLASLT_EPILOGUE_DGELU, false, in, rows, out, w, in, dy, out, dh, in, nullptr, h, in,
                                 data_type<A>()})) {
    ++ctx_->epilogues.fused;
    return;
  }
  ++ctx_->epilogues.unfused;
  gemm(false, false, rows, in, out, S(1), dy, out, w, in, S(0), dh, in);
  gelu_backward(std::size_t(rows) * in, h, dh, dh);
}

template <class A>
auto BasicCudaBackend<A>::epilogue_stats() const -> EpilogueStats {
  return ctx_->epilogues;
}

#define XFMR_INSTANTIATE(A)                                                                                         \
  template void BasicCudaBackend<A>::gemm(bool, bool, int, int, int, float, const A*, int, const A*, int, float, A*, \
                                          int);                                                                     \
  template void BasicCudaBackend<A>::gemm_strided_batched(bool, bool, int, int, int, float, const A*, int, long,    \
                                                          const A*, int, long, float, float*, int, long, int);      \
  template void BasicCudaBackend<A>::bias_add(int, int, const float*, A*);                                          \
  template void BasicCudaBackend<A>::bias_grad(int, int, const A*, float*);                                         \
  template bool BasicCudaBackend<A>::lt_product(const cuda::LtProduct&);                                            \
  template void BasicCudaBackend<A>::linear_forward(int, int, int, const A*, const A*, const float*, A*);           \
  template void BasicCudaBackend<A>::linear_gelu_forward(int, int, int, const A*, const A*, const float*, A*, A*);  \
  template void BasicCudaBackend<A>::linear_dgelu_input_grad(int, int, int, const A*, const A*, const A*, A*);      \
  template cuda::EpilogueStats BasicCudaBackend<A>::epilogue_stats() const;
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE
template void BasicCudaBackend<Bf16>::gemm(bool, bool, int, int, int, float, const Bf16*, int, const Bf16*, int, float,
                                           float*, int);
template void BasicCudaBackend<Bf16>::gemm_strided_batched(bool, bool, int, int, int, float, const Bf16*, int, long,
                                                           const Bf16*, int, long, float, Bf16*, int, long, int);

}  // namespace xfmr
