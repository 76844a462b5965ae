// cuda.hpp: CudaBackend, the backend operations (backend.hpp, and each
// family's contract in backend/cpu/<family>.hpp) on an
// NVIDIA GPU, and the device storage its layers keep.
//
// Declarations only: the definitions live in cuda/*.cu (kernels and cuBLAS
// calls, no Eigen), compiled into xfmr_cuda whenever CMake finds a CUDA
// compiler, which then defines XFMR_WITH_CUDA for users of xfmr::xfmr. This
// header needs no CUDA header of its own; without XFMR_WITH_CUDA it declares
// nothing.
//
// Memory. Every Scalar pointer an operation takes is device memory (model
// tensors, activations, gradients, dropout masks). Token ids, targets and
// masks (key padding, pooling exclusions) are host memory, as on the CPU:
// they come from the caller's batch, and the backend checks them on the host
// (same messages as CpuBackend) and uploads them itself.
//
// Execution. All work goes to one stream in order; an operation that returns
// a value to the host (a loss, a sum of squares) waits for it. Every CUDA and
// cuBLAS call and every kernel launch is checked: failures throw xfmr::Error
// with the CUDA message and the operation's name.
//
// Precision. float throughout; GEMMs in strict FP32 by default, TF32 tensor
// cores only when CudaOptions::tf32 asks for them, bf16 ones (operands
// rounded to bfloat16, float32 sums: the CPU's bf16 products) when
// CudaOptions::bf16 does.
#pragma once

#ifdef XFMR_WITH_CUDA

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "xfmr/backend/attention_plan.hpp"
#include "xfmr/backend/backend.hpp"
#include "xfmr/backend/bf16.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/mask.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/core/workspace.hpp"

namespace xfmr::cuda {

// Whether this xfmr was built with NCCL (CMake found nccl.h and libnccl in
// the CUDA toolkit): CudaBackend::all_reduce_sum works only then.
bool nccl_available();

// Number of usable CUDA devices; 0 when there is no driver or no device
// (never an error, so callers can skip GPU work cleanly).
int device_count();

// The device's name, e.g. "NVIDIA H100 80GB HBM3". Throws xfmr::Error naming
// the ordinal and the device count when the ordinal is out of range.
std::string device_name(int ordinal);

// Raw device memory (cudaMalloc, never managed memory). Each throws
// xfmr::Error with the CUDA message on failure; release never throws.
void* allocate(std::size_t bytes);
void release(void* p) noexcept;
// Device memory held through allocate() (every DeviceArray, Tensor and
// Buffer, cuBLAS's workspace), now and at its peak since the start or
// reset_peak_memory(), and how many allocations were made since the start
// (a steady-state step makes none); not the CUDA context's own, nor
// cuBLAS's internals.
struct MemoryUse {
  std::size_t bytes = 0, peak_bytes = 0, allocations = 0;
};
MemoryUse memory_use();
void reset_peak_memory();
void upload(void* device_dst, const void* host_src, std::size_t bytes);
void download(void* host_dst, const void* device_src, std::size_t bytes);
void copy_on_device(void* dst, const void* src, std::size_t bytes);
void fill_zero(void* device_dst, std::size_t bytes);
void synchronize();

// Grow-only device storage of T. Growing keeps the existing elements and
// zeroes the new ones, like the host containers.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray& o) { *this = o; }
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(const DeviceArray& o) {
    if (this != &o) {
      reserve(o.n_);
      if (o.n_) copy_on_device(p_, o.p_, o.n_ * sizeof(T));
    }
    return *this;
  }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceArray() { release(p_); }

  T* reserve(std::size_t n) {
    if (n > n_) {
      T* q = static_cast<T*>(allocate(n * sizeof(T)));
      if (n_) copy_on_device(q, p_, n_ * sizeof(T));
      fill_zero(q + n_, (n - n_) * sizeof(T));
      release(p_);
      p_ = q;
      n_ = n;
    }
    return p_;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  std::size_t capacity() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// y[i] = x[i] rounded to bfloat16 (to nearest, ties to even), queued on
// the backend's stream: a Tensor's product copy (cuda/runtime.cu).
void round_to_bf16(std::size_t n, const float* x, Bf16* y);

// A parameter-like tensor in device memory, with the host Tensor's interface
// minus element access: values come and go through generate(),
// copy_from_host() and copy_to_host() (initialisation, checkpoints, moving
// weights between backends).
//
// P is the type products read the values in (product_data(); backend.hpp).
// With P = S these are the values themselves. With P = Bf16 they are a copy
// rounded to bfloat16, made again on the first product_data() after any
// data() that could write the values (the non-const one: the optimizers,
// checkpoints, copy_from_host), so that a product never reads a stale copy;
// a pointer from data() must not be kept and written through after a later
// product_data().
template <class S, class P = S>
class Tensor : public ShapedStorage<Tensor<S, P>, S> {
 public:
  using ShapedStorage<Tensor<S, P>, S>::size;

  Tensor() = default;
  explicit Tensor(std::vector<std::int64_t> shape) { resize(std::move(shape)); }
  Tensor(std::initializer_list<std::int64_t> shape) : Tensor(std::vector<std::int64_t>(shape)) {}

  void resize(std::vector<std::int64_t> shape) { storage_.reserve(this->set_shape(std::move(shape))); }

  S* data() {
    copy_current_ = false;
    return storage_.data();
  }
  const S* data() const { return storage_.data(); }
  const P* product_data() const {
    if constexpr (std::is_same_v<P, S>) {
      return data();
    } else {
      if (!copy_current_ && size()) {
        round_to_bf16(size(), data(), copy_.reserve(size()));
        copy_current_ = true;
      }
      return copy_.data();
    }
  }

  void zero() {
    if (size()) fill_zero(data(), size() * sizeof(S));
  }
  void fill(S v) {
    std::vector<S> host(size(), v);
    copy_from_host(host.data());
  }
  // Sets every element, in order, to f() computed on the host.
  template <class F>
  void generate(F&& f) {
    std::vector<S> host(size());
    for (auto& x : host) x = f();
    copy_from_host(host.data());
  }
  void copy_from_host(const S* src) {
    if (size()) upload(data(), src, size() * sizeof(S));
  }
  void copy_to_host(S* dst) const {
    if (size()) download(dst, data(), size() * sizeof(S));
  }

 private:
  DeviceArray<S> storage_;
  struct NoCopy {};
  [[no_unique_address]] mutable std::conditional_t<std::is_same_v<P, S>, NoCopy, DeviceArray<P>> copy_;
  mutable bool copy_current_ = false;
};

// Activations and saved state in device memory (host Buffer's interface).
template <class T>
class Buffer {
 public:
  T* reserve(std::size_t n) { return storage_.reserve(n); }
  template <int COLS>
  Rows<T, COLS> rows(int r) {
    return {reserve(static_cast<std::size_t>(r) * COLS), r};
  }
  template <int COLS>
  Rows<T, COLS> rows(int r, Dim<COLS> cols) {
    return {reserve(static_cast<std::size_t>(r) * cols), r, cols};
  }
  T* data() { return storage_.data(); }
  const T* data() const { return storage_.data(); }
  std::size_t capacity() const { return storage_.capacity(); }

 private:
  DeviceArray<T> storage_;
};

// Row-major GEMM as cuBLAS's column-major call: a row-major (M, N) matrix
// with leading dimension ld is the column-major (N, M) one, so
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLAS gets B as its
// first operand and A as its second. Host-side logic, unit-tested without a
// GPU (test_cuda_runtime).
struct ColumnMajorGemm {
  bool trans_first, trans_second;  // cuBLAS transa (applies to B), transb (to A)
  int m, n, k;                     // cuBLAS m = N, n = M, k = K
  int ld_first, ld_second, ldc;    // ldb, lda, ldc
};
constexpr ColumnMajorGemm column_major_gemm(bool ta, bool tb, int M, int N, int K, int lda, int ldb, int ldc) {
  return {tb, ta, N, M, K, ldb, lda, ldc};
}

// Launch shape for n independent elements: 256 threads a block, grid
// capped (kernels stride over the rest), so a result never depends on it.
struct Launch {
  unsigned blocks, threads;
};
constexpr Launch elementwise_launch(std::size_t n, unsigned max_blocks = 65535) {
  const unsigned threads = 256;
  const std::size_t want = (n + threads - 1) / threads;
  return {static_cast<unsigned>(want == 0 ? 1 : (want < max_blocks ? want : max_blocks)), threads};
}

}  // namespace xfmr::cuda

namespace xfmr {

class ProcessGroup;  // core/distributed.hpp

struct CudaOptions {
  int device = 0;
  bool tf32 = false;  // TF32 tensor-core GEMMs (about 1e-3 relative error); FP32 when false
  // bf16 mixed precision, as CpuOptions::bf16: gemm() rounds both operands
  // to bfloat16 and sums in float32 on the tensor cores (cuBLAS's
  // CUBLAS_COMPUTE_32F_FAST_16BF on float32 matrices); weights, activations,
  // attention's batched products and every reduction stay float32.
  bool bf16 = false;
  // graph_step() replays CUDA graphs; when false (or when the environment
  // sets XFMR_CUDA_GRAPHS=0) it runs the step directly, queueing every kernel.
  bool graph_steps = true;
  // Tiled attention (flash_attention_*, attention_tiled.cu): training forwards past
  // the fused kernels' 256 keys save log-sum-exps instead of the (B, H, Tq,
  // Tk) probabilities. Off until its parity tests have run on a GPU
  // (test_cuda_parity's tiled_attention_matches_the_cpu); the environment's
  // XFMR_CUDA_FLASH_ATTENTION=1 turns it on in every program. With bf16
  // it runs on the tensor cores for heads of 64 and 128 (attention_bf16.cu;
  // bf16_tiled_attention_on_tensor_cores).
  bool flash_attention = false;
  // cross_entropy_forward_backward's fused kernel (losses.cu): loss and
  // gradient in one pass, no probabilities. Off until its parity test has
  // run on a GPU (fused_cross_entropy_matches_the_cpu): the forward and
  // backward kernels run instead, through a buffer of probabilities. The
  // environment's XFMR_CUDA_FUSED_LOSS=1 turns it on in every program.
  bool fused_loss = false;
  // The fused products (linear_forward, linear_gelu_forward,
  // linear_dgelu_input_grad; linear.cu) as single cuBLASLt calls, the bias
  // and GELU (or GELU's gradient) applied in the product's epilogue, where
  // cuBLASLt has an algorithm for the shape (GELU's needs a width that is a
  // multiple of 8); otherwise, and when false, the product and then the
  // kernels. Off until its parity test has run on a GPU
  // (lt_epilogues_match_the_cpu); the environment's
  // XFMR_CUDA_LT_EPILOGUES=1 turns it on in every program.
  bool lt_epilogues = false;
};

// The backend's device context (cuBLAS handles, staging, scratch, graphs;
// cuda/common.cuh) and one fused product's description (cuda/linear.cu).
namespace cuda {
struct Context;
struct LtProduct;
struct NotNarrow {};
struct EpilogueStats {
  std::size_t fused = 0, unfused = 0;
};
}  // namespace cuda

// CudaBackend and CudaBf16Backend: the operations on one GPU, with
// activations stored as A (float, or bfloat16 as xfmr::Bf16) and everything
// else (parameters, their gradients, optimizer state, saved statistics,
// every sum) float32. Each member is defined in cuda/<family>.cu for both.
template <class A>
class BasicCudaBackend {
 public:
  using Scalar = float;
  using S = float;
  using Activation = A;  // backend.hpp
  using Tensor = cuda::Tensor<float, A>;
  template <class T>
  using Buffer = cuda::Buffer<T>;
  static constexpr bool kNarrow = !std::is_same_v<A, S>;  // activations stored narrower than float32
  static constexpr const char* name = kNarrow ? "cuda-bf16" : "cuda";
  // The type of the overloads only a narrow backend has (a product into
  // float32 parameter gradients, the sum of squares of activations): A
  // there; with float32 activations they would repeat the float32 ones, and
  // take a type nothing passes.
  using NarrowA = std::conditional_t<kNarrow, A, cuda::NotNarrow>;

  // Selects the device and creates the cuBLAS handle. Throws xfmr::Error
  // naming the device and the CUDA message when there is none.
  explicit BasicCudaBackend(CudaOptions opts = {});
  ~BasicCudaBackend();
  BasicCudaBackend(const BasicCudaBackend&) = delete;
  BasicCudaBackend& operator=(const BasicCudaBackend&) = delete;

  const CudaOptions& options() const { return opts_; }
  std::string device_name() const;
  void synchronize();

  // Runs step() (any host code calling this backend: a training step, say)
  // with its device work issued as CUDA graphs, which cost the host one
  // launch each instead of one per kernel. The work up to each point where
  // the host reads the device (a loss, a norm, logits) is one segment; a
  // segment whose operations and arguments are those of the same segment of
  // the last step with this key replays that step's graph, and any other is
  // captured anew. Results are bit for bit those of running step() directly.
  // Steps of one shape with fresh data (token ids, targets, masks, learning
  // rates and AdamW's bias corrections, dropout keys) replay; a changed
  // shape or buffer recaptures. Graph steps do not nest. If step() throws,
  // the work it recorded since the last such point is dropped. With
  // CudaOptions::graph_steps false, step() runs directly.
  template <class F>
  void graph_step(std::string_view key, F&& step) {
    if (!opts_.graph_steps) return std::forward<F>(step)();
    begin_graph_step(key);
    try {
      std::forward<F>(step)();
    } catch (...) {
      abort_graph_step();
      throw;
    }
    end_graph_step();
  }
  // Graph segments captured and replayed so far.
  struct GraphStats {
    std::size_t captures = 0, replays = 0;
  };
  GraphStats graph_stats() const;

  // Logits and other results for host code (sampling, accuracy; attention's
  // probabilities): copies x to `staging` (widened to float32) and returns it.
  std::span<const S> host_view(std::span<const S> x, std::vector<S>& staging);
  std::span<const S> host_view(std::span<const NarrowA> x, std::vector<S>& staging);

  // Scratch memory the layers take for the length of a call (core/workspace.hpp).
  Workspace<Buffer<Activation>>& workspace() { return workspace_; }

  // ---- the operations, by family (backend/cpu/<family>.hpp; cuda/<family>.cu) ----
  // Activations are A, parameters and statistics S (backend.hpp). With
  // bfloat16 activations, a product reads bfloat16 operands (activations,
  // and the weights' Tensor::product_data()), sums in float32 and rounds
  // its result once; the second gemm writes float32 parameter gradients.
  void gemm(bool ta, bool tb, int M, int N, int K, S alpha, const A* a, int lda, const A* b, int ldb, S beta, A* c,
            int ldc);
  void gemm(bool ta, bool tb, int M, int N, int K, S alpha, const NarrowA* a, int lda, const NarrowA* b, int ldb,
            S beta, S* c, int ldc);
  void bias_add(int rows, int n, const S* bias, A* y);
  void bias_grad(int rows, int n, const A* dy, S* dbias);
  void linear_forward(int rows, int in, int out, const A* x, const A* w, const S* bias, A* y);
  void linear_gelu_forward(int rows, int in, int out, const A* x, const A* w, const S* bias, A* h, A* y);
  void linear_dgelu_input_grad(int rows, int in, int out, const A* dy, const A* w, const A* h, A* dh);
  // The fused products served by one cuBLASLt call each, and by the product
  // and kernels (CudaOptions::lt_epilogues off, or no algorithm for the
  // shape), since the start.
  using EpilogueStats = cuda::EpilogueStats;
  EpilogueStats epilogue_stats() const;
  void add(std::size_t n, const A* a, const A* b, A* y);
  void add_to(std::size_t n, const A* x, A* y);
  void copy(std::size_t n, const A* x, A* y);
  void add_positions_forward(int B, int T, int D, const A* x, const S* table, A* y);
  void add_positions_backward(int B, int T, int D, const A* dy, S* dtable);
  void rope_forward(int B, int T, int offset, int H, int hd, const S* table, A* x, int ld);
  void rope_backward(int B, int T, int offset, int H, int hd, const S* table, A* dx, int ld);
  void layer_norm_forward(int rows, int n, const A* x, const S* gamma, const S* beta, S eps, A* y, S* mean, S* rstd);
  void layer_norm_backward(int rows, int n, const A* dy, const A* x, const S* gamma, const S* mean, const S* rstd,
                           A* dx, S* dgamma, S* dbeta);
  void rms_norm_forward(int rows, int n, const A* x, const S* gamma, S eps, A* y, S* rstd);
  void rms_norm_backward(int rows, int n, const A* dy, const A* x, const S* gamma, const S* rstd, A* dx, S* dgamma);
  void relu_forward(std::size_t n, const A* x, A* y);
  void relu_backward(std::size_t n, const A* x, const A* dy, A* dx);
  void gelu_forward(std::size_t n, const A* x, A* y);
  void gelu_backward(std::size_t n, const A* x, const A* dy, A* dx);
  void swiglu_forward(int rows, int n, const A* h, A* y);
  void swiglu_backward(int rows, int n, const A* h, const A* dy, A* dh);
  void geglu_forward(int rows, int n, const A* h, A* y);
  void geglu_backward(int rows, int n, const A* h, const A* dy, A* dh);
  void dropout_forward(std::size_t n, float p, std::uint64_t key, const A* x, A* y, std::uint8_t* keep);
  void dropout_backward(std::size_t n, float p, const std::uint8_t* keep, const A* dy, A* dx);
  void embedding_forward(int n, int V, int D, const std::int32_t* ids, const S* table, A* y);
  void embedding_backward(int n, int D, const std::int32_t* ids, const A* dy, S* dtable);
  void mean_pool_forward(int B, int T, int D, const A* x, const std::uint8_t* exclude, A* y);
  void mean_pool_backward(int B, int T, int D, const A* dy, const std::uint8_t* exclude, A* dx);
  double cross_entropy_forward(int rows, int V, const A* logits, const std::int32_t* targets, int ignore_index,
                               S* probs, S smoothing = S(0));
  void cross_entropy_backward(int rows, int V, const S* probs, const std::int32_t* targets, int ignore_index, S dloss,
                              A* dlogits, S smoothing = S(0));
  double cross_entropy_forward_backward(int rows, int V, const A* logits, const std::int32_t* targets,
                                        int ignore_index, S dloss, A* dlogits, S smoothing = S(0));
  double sum_squares(std::size_t n, const S* x);
  double sum_squares(std::size_t n, const NarrowA* x);
  void sum_squares_each(std::span<const SquaresTensor<S>> tensors, std::span<double> sums);
  void scale(std::size_t n, S alpha, S* x);
  void adamw_step(std::span<const AdamWTensor<S>> tensors, S lr, S beta1, S beta2, S eps, S bias_correction1,
                  S bias_correction2);
  void sgd_step(std::size_t n, S* p, const S* g, S* buf, S lr, S momentum, S weight_decay);
  void attention_forward(const AttentionDims& a, const A* q, int ldq, const A* k, int ldk, const A* v, int ldv, A* y,
                         int ldy, S* probs, const AttentionMask& mask);
  void attention_backward(const AttentionDims& a, const A* dy, int ldy, const A* q, int ldq, const A* k, int ldk,
                          const A* v, int ldv, const S* probs, A* dq, A* dk, A* dv);
  // The reach of the attention kernels (attention_plan.hpp): the tiled
  // path where CudaOptions::flash_attention asks.
  AttentionKernels attention_kernels() const { return cuda_attention_kernels(opts_.flash_attention); }
  void flash_attention_forward(const AttentionDims& a, const A* q, int ldq, const A* k, int ldk, const A* v, int ldv,
                               A* y, int ldy, S* lse, const AttentionMask& mask);
  void flash_attention_backward(const AttentionDims& a, const A* dy, int ldy, const A* y, int ldo, const A* q, int ldq,
                                const A* k, int ldk, const A* v, int ldv, const S* lse, const AttentionMask& mask,
                                A* dq, A* dk, A* dv);

  // Training across processes, one GPU a rank (core/distributed.hpp): every
  // tensor (device memory) summed over the ranks of `group`, in place,
  // through NCCL on this backend's stream, the tensors' calls grouped into
  // one launch (ncclGroupStart/End). The communicator is made on the first
  // call, rank 0's NCCL id sent to the others over the group (MPI); with
  // one rank it is a copy. Throws xfmr::Error without NCCL (nccl_available).
  void all_reduce_sum(ProcessGroup& group, std::span<const std::span<S>> tensors);

 private:
  void begin_graph_step(std::string_view key);
  void end_graph_step();
  void abort_graph_step() noexcept;
  const std::uint8_t* upload_mask(const std::uint8_t* host, std::size_t n);
  const std::int32_t* upload_ids(const std::int32_t* host, std::size_t n);
  const std::uint64_t* dropout_key(std::uint64_t key);  // in device memory, for the next launch
  const S* drop_probabilities(const AttentionDims& a, const S* probs);  // attention dropout's weights
  // Strided-batched row-major GEMM of activations into C (S: attention's
  // scores and their gradients; A: its outputs and input gradients).
  template <class C>
  void gemm_strided_batched(bool ta, bool tb, int M, int N, int K, S alpha, const A* a, int lda, long stride_a,
                            const A* b, int ldb, long stride_b, S beta, C* c, int ldc, long stride_c, int batch);
  // The heads path's masked softmax over (B, H, Tq, Tk) and its backward.
  void softmax_forward(int B, int H, int Tq, int Tk, const S* scores, S* probs, const AttentionMask& mask);
  void softmax_backward(int rows, int n, const S* probs, const S* dprobs, S* dscores);
  // One fused product through cuBLASLt (linear.cu); false, having queued
  // nothing, where CudaOptions::lt_epilogues is off or cuBLASLt has no
  // algorithm for it.
  bool lt_product(const cuda::LtProduct& p);

  CudaOptions opts_;
  std::unique_ptr<cuda::Context> ctx_;
  Workspace<Buffer<Activation>> workspace_;  // after ctx_: freed before the context goes
};

using CudaBackend = BasicCudaBackend<float>;
using CudaBf16Backend = BasicCudaBackend<Bf16>;
static_assert(Backend<CudaBackend>);
static_assert(Backend<CudaBf16Backend>);

}  // namespace xfmr

#endif  // XFMR_WITH_CUDA
