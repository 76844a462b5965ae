// common.cuh: what every cuda/*.cu file shares: error checking, launch
// helpers, warp and block reductions, and the backend's context.
// Internal to xfmr_cuda (not installed).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "xfmr/backend/checks.hpp"
#include "xfmr/backend/cuda.hpp"
#include "xfmr/core/error.hpp"

namespace xfmr::cuda::detail {

// Ends an NCCL communicator (cuda/nccl.cu); nothing without NCCL or comm.
void destroy_nccl(void* comm) noexcept;

// Throws xfmr::Error("<what>: <CUDA message>") unless err is cudaSuccess.
void check(cudaError_t err, const char* what);
void check_cublas(cublasStatus_t status, const char* what);

// The stream all of xfmr's device work goes to: the calling thread's default
// stream, which (unlike the legacy default stream) a CUDA graph can capture.
inline cudaStream_t stream() { return cudaStreamPerThread; }

// ---- whole steps as CUDA graphs (CudaBackend::graph_step) ------------------
// Inside a graph step each device operation is recorded instead of queued:
// a closure that queues it, and its signature (what it launches, with which
// arguments, as bytes). The operations recorded up to the next point where
// the host waits for the device (a download, a synchronisation, a buffer
// that grows or is freed), or up to the end of the step, form a segment.
// Segment i of a step is launched as the CUDA graph captured for it before
// when its signature is the same; otherwise its closures are captured into a
// new graph first. Either way the device does what eager queueing would do,
// in the same order, so results are bit for bit the same.

// Arguments go into a signature as their bytes, so they must have no padding
// (whose bytes are undefined). Scalars and structs of unique representation
// qualify; a struct holding floats is declared padding-free by hand, next to
// a static_assert on its size.
template <class T>
inline constexpr bool kPaddingFree = std::is_scalar_v<T> || std::has_unique_object_representations_v<T>;

class Signature {
 public:
  template <class T>
  void add(const T& v) {
    static_assert(std::is_trivially_copyable_v<T> && kPaddingFree<T>, "a signature argument must have no padding");
    const auto* b = reinterpret_cast<const std::byte*>(&v);
    bytes_.insert(bytes_.end(), b, b + sizeof(T));
  }
  template <class... T>
  void add_all(const T&... v) {
    (add(v), ...);
  }
  void clear() { bytes_.clear(); }
  bool operator==(const Signature&) const = default;

 private:
  std::vector<std::byte> bytes_;
};

class StepRecorder;
// The recorder of the graph step running on this thread, or null.
StepRecorder* recording();

// Records op() and its signature in this thread's graph step.
void record(const std::function<void(Signature&)>& sign, std::function<void()> op);

// Queues op() now, or records it inside a graph step; sign(Signature&) adds
// the operation's identity and arguments.
template <class Sign, class Op>
void enqueue(Sign&& sign, Op op) {
  if (recording())
    record(sign, std::move(op));
  else
    op();
}

// Before the host frees or regrows device memory, or waits for the device:
// issues what a graph step has recorded so far (no-op outside one).
void flush_recorded();

// Launches kernel<<<grid, block, shared>>>(args...) on stream() and checks
// the launch (the configuration and any earlier asynchronous error).
// `shared`: bytes of dynamic shared memory (past 48 KiB the kernel's limit
// must have been raised: cudaFuncSetAttribute).
template <class... Params, class... Args>
void launch(const char* what, dim3 grid, dim3 block, unsigned shared, void (*kernel)(Params...), Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  // Every operation's signature starts with a tag byte (0: a kernel), and the
  // rest has a length the tag (with the kernel) fixes: no two sequences of
  // operations sign alike.
  enqueue(
      [&](Signature& s) {
        s.add_all(std::uint8_t(0), reinterpret_cast<const void*>(kernel), grid, block, shared, args...);
      },
      [=] {
        kernel<<<grid, block, shared, stream()>>>(args...);
        check(cudaGetLastError(), what);
      });
}
template <class... Params, class... Args>
void launch(const char* what, dim3 grid, dim3 block, void (*kernel)(Params...), Args... args) {
  launch(what, grid, block, 0u, kernel, args...);
}
template <class... Params, class... Args>
void launch(const char* what, Launch shape, void (*kernel)(Params...), Args... args) {
  launch(what, dim3(shape.blocks), dim3(shape.threads), kernel, args...);
}

// One warp (32 lanes) per row: `rows` rows in blocks of 8 warps.
inline Launch warp_per_row(long rows) {
  const long blocks = (rows + 7) / 8;
  return {static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256};
}

// Activations in kernels (BasicCudaBackend<A>): read as float32 with
// to_float, written with from_float<A>, which rounds to bfloat16 (to nearest,
// ties to even) for A = Bf16 and is the identity for float.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(Bf16 x) { return __bfloat162float(__ushort_as_bfloat16(x.bits)); }
template <class A>
__device__ __forceinline__ A from_float(float v) {
  if constexpr (std::is_same_v<A, Bf16>)
    return Bf16{__bfloat16_as_ushort(__float2bfloat16_rn(v))};
  else
    return v;
}

// W consecutive activations from p (W = 1, or kPack<A> of them: 16 bytes,
// one 128-bit access, p then 16-byte aligned) widened to float32, and back.
template <class A>
inline constexpr int kPack = 16 / int(sizeof(A));
template <class A, int W>
struct alignas(W * sizeof(A)) Packed {
  A v[W];
};
template <int W, class A>
__device__ __forceinline__ void load(const A* p, float (&out)[W]) {
  const Packed<A, W> in = *reinterpret_cast<const Packed<A, W>*>(p);
#pragma unroll
  for (int k = 0; k < W; ++k) out[k] = to_float(in.v[k]);
}
template <int W, class A>
__device__ __forceinline__ void store(A* p, const float (&values)[W]) {
  Packed<A, W> out;
#pragma unroll
  for (int k = 0; k < W; ++k) out.v[k] = from_float<A>(values[k]);
  *reinterpret_cast<Packed<A, W>*>(p) = out;
}
// Calls go(std::integral_constant<int, W>{}) with the width W an element-wise
// kernel takes over n activations at the pointers p...: kPack<A> with
// bfloat16 activations where n is a whole number of packs and every pointer
// is 16-byte aligned; 1 otherwise (CudaBackend's float kernels keep their
// one-element loop).
template <class A, class Go, class... P>
void with_pack_width(std::size_t n, Go&& go, const P*... p) {
  if constexpr (std::is_same_v<A, Bf16>)
    if (n % kPack<A> == 0 && ((reinterpret_cast<std::uintptr_t>(p) % 16 == 0) && ...))
      return go(std::integral_constant<int, kPack<A>>{});
  go(std::integral_constant<int, 1>{});
}

// Explicit instantiation of each file's members, once for each activation
// type: XFMR_CUDA_FOR_EACH_ACTIVATION(F) expands F(float) F(xfmr::Bf16).
#define XFMR_CUDA_FOR_EACH_ACTIVATION(F) F(float) F(::xfmr::Bf16)

// Grid-stride index range: for (auto i = first(); i < n; i += stride()).
__device__ inline std::size_t first_index() { return std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline std::size_t grid_stride() { return std::size_t(gridDim.x) * blockDim.x; }
__device__ inline long first_warp() { return long(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; }
__device__ inline long warp_stride() { return long(gridDim.x) * (blockDim.x / 32); }
__device__ inline int lane() { return threadIdx.x % 32; }

// Element-wise maps over n activations, W at a time (with_pack_width):
// y = F{}(x), or y = F{}(a, b), each value read as float32 and written once
// with from_float. F is an empty functor with a __device__ call operator on
// floats; it is a template argument, not a kernel argument, so a graph
// signature holds only the count and the pointers. y may be an input (each
// element is read before it is written).
template <class F, class A, int W>
__global__ void map_unary_kernel(std::size_t n, const A* x, A* y) {
  for (std::size_t i = first_index() * W; i < n; i += grid_stride() * W) {
    float v[W];
    load<W>(x + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = F{}(v[k]);
    store<W>(y + i, v);
  }
}
template <class F, class A, int W>
__global__ void map_binary_kernel(std::size_t n, const A* a, const A* b, A* y) {
  for (std::size_t i = first_index() * W; i < n; i += grid_stride() * W) {
    float u[W], v[W];
    load<W>(a + i, u);
    load<W>(b + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) u[k] = F{}(u[k], v[k]);
    store<W>(y + i, u);
  }
}
template <class F, class A>
void map_elements(const char* what, std::size_t n, const A* x, A* y) {
  with_pack_width<A>(
      n, [&](auto w) { launch(what, elementwise_launch(n / w), map_unary_kernel<F, A, w()>, n, x, y); }, x, y);
}
template <class F, class A>
void map_elements(const char* what, std::size_t n, const A* a, const A* b, A* y) {
  with_pack_width<A>(
      n, [&](auto w) { launch(what, elementwise_launch(n / w), map_binary_kernel<F, A, w()>, n, a, b, y); }, a, b,
      y);
}

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `shared` holds 32 values; safe to call repeatedly.
template <class T>
__device__ inline T block_sum(T v, T* shared) {
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading `shared`
  if (lane() == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  T total = T(0);
  for (int w = 0; w < warps; ++w) total += shared[w];  // same order in every thread
  return total;
}
__device__ inline float block_max(float v, float* shared) {
  v = warp_max(v);
  __syncthreads();
  if (lane() == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float m = shared[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, shared[w]);
  return m;
}

// Column sums of a row-major (rows, n) expression, parallel and repeatable
// (no atomics; the order of the additions depends on `rows` alone, never on
// the GPU). A block of 32 columns x LANES row lanes sums a chunk of rows:
// lane y takes rows y, y + LANES, ..., then the lanes add in order. Up to
// kColumnOnePassRows rows are one chunk of 32 lanes added straight into
// out[k][c]; more go in chunks of kColumnChunkRows with 8 lanes, and then one
// thread per column adds the chunks in order. Term: `__device__ void
// operator()(int r, int c, float* acc) const` adds row r's K terms of column c
// to acc[0..K).
constexpr int kColumnTile = 32, kColumnOnePassRows = 1024, kColumnChunkRows = 256;

template <int K>
struct ColumnOutputs {
  float* out[K];
};

// With one chunk (gridDim.y == 1) the sums go straight to `outputs`, else to
// partial[chunk][k][c].
template <int K, int LANES, class Term>
__global__ void column_chunk_sums_kernel(int rows, int n, int chunk_rows, Term term, float* partial,
                                         ColumnOutputs<K> outputs) {
  __shared__ float lanes[K][LANES][kColumnTile + 1];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int first = blockIdx.y * chunk_rows;
  const int last = min(rows, first + chunk_rows);
  float acc[K] = {};
  if (c < n)
    for (int r = first + threadIdx.y; r < last; r += LANES) term(r, c, acc);
  for (int k = 0; k < K; ++k) lanes[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < n)
    for (int k = 0; k < K; ++k) {
      float s = 0.0f;
      for (int y = 0; y < LANES; ++y) s += lanes[k][y][threadIdx.x];
      if (gridDim.y == 1)
        outputs.out[k][c] += s;
      else
        partial[(std::size_t(blockIdx.y) * K + k) * n + c] = s;
    }
}

template <int K>
__global__ void column_chunk_total_kernel(int chunks, int n, const float* partial, ColumnOutputs<K> outputs) {
  for (std::size_t c = first_index(); c < std::size_t(n); c += grid_stride())
    for (int k = 0; k < K; ++k) {
      float s = 0.0f;
      for (int chunk = 0; chunk < chunks; ++chunk) s += partial[(std::size_t(chunk) * K + k) * n + c];
      outputs.out[k][c] += s;
    }
}

// out[k][c] += sum over r of term k of (r, c); `scratch` holds the chunk sums.
template <int K, class Term>
void add_column_sums(const char* what, int rows, int n, Term term, ColumnOutputs<K> outputs,
                     DeviceArray<float>& scratch) {
  if (rows == 0 || n == 0) return;
  const unsigned tiles = (n + kColumnTile - 1) / kColumnTile;
  if (rows <= kColumnOnePassRows) {
    launch(what, dim3(tiles, 1), dim3(kColumnTile, 32), column_chunk_sums_kernel<K, 32, Term>, rows, n, rows, term,
           static_cast<float*>(nullptr), outputs);
    return;
  }
  const int chunks = (rows + kColumnChunkRows - 1) / kColumnChunkRows;
  require(chunks <= 65535, what, ": ", rows, " rows exceed the column sums' limit of ", 65535L * kColumnChunkRows);
  float* partial = scratch.reserve(std::size_t(chunks) * K * n);
  launch(what, dim3(tiles, chunks), dim3(kColumnTile, 8), column_chunk_sums_kernel<K, 8, Term>, rows, n,
         kColumnChunkRows, term, partial, outputs);
  launch(what, elementwise_launch(std::size_t(n)), column_chunk_total_kernel<K>, chunks, n,
         static_cast<const float*>(partial), outputs);
}

// The attention mask of mask.hpp, with the key padding in device memory.
struct DeviceMask {
  const std::uint8_t* key_padding;  // (B, Tk) or nullptr
  int causal;
  int unused = 0;  // no padding: kernel arguments go into graph signatures as bytes
  __device__ bool allowed(int b, int i, int j, int t_q, int t_kv) const {
    if (causal && j > i + (t_kv - t_q)) return false;
    if (key_padding && key_padding[long(b) * t_kv + j]) return false;
    return true;
  }
};

// Page-locked host staging for uploads, so that an upload is queued in order
// with the kernels instead of waiting for them (a copy from pageable memory
// first waits for all queued work). Outside graph steps the slots are used in
// turn, and a slot is refilled only after its previous copy has completed
// (its event). Inside a graph step the k-th upload of the step has slot k of
// its own set, so that a graph's copy node reads the same host address at
// every replay; the step waits for its previous replay before refilling them.
class UploadStaging {
 public:
  static constexpr int kSlots = 4;
  UploadStaging() = default;
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;
  ~UploadStaging();
  // Queues (or records) a copy of `bytes` from host_src to device_dst.
  void upload(void* device_dst, const void* host_src, std::size_t bytes);
  // A graph step begins: its uploads start again at step slot 0.
  void restart_step_slots() { next_step_slot_ = 0; }

 private:
  struct Slot {
    void* host = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t copied = nullptr;
  };
  static void fit(Slot& s, std::size_t bytes);
  Slot slots_[kSlots];
  int next_ = 0;
  std::vector<Slot> step_slots_;
  std::size_t next_step_slot_ = 0;
};

// A graph step's recorder, and the graphs of one kind of step (its key).
struct StepGraphs {
  struct Segment {
    Signature signature;
    cudaGraphExec_t exec = nullptr;
  };
  StepGraphs() = default;
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;
  ~StepGraphs();
  std::vector<Segment> segments;
};

class StepRecorder {
 public:
  StepRecorder() = default;
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;
  ~StepRecorder();

  // Starts recording on this thread for the graphs of `graphs`. Waits for
  // the last graph this recorder launched (its uploads' slots are reused).
  void begin(StepGraphs& graphs);
  void record(const std::function<void(Signature&)>& sign, std::function<void()> op);
  // Issues the pending segment: replays its graph or captures a new one.
  void flush();
  // Flushes and stops recording; abort() drops the pending operations.
  void end();
  void abort() noexcept;

  std::size_t captures() const { return captures_; }
  std::size_t replays() const { return replays_; }

 private:
  StepGraphs* graphs_ = nullptr;
  std::size_t segment_ = 0;
  Signature pending_signature_;
  std::vector<std::function<void()>> pending_;
  cudaEvent_t launched_ = nullptr;  // after the last graph launch
  std::size_t captures_ = 0, replays_ = 0;
};

}  // namespace xfmr::cuda::detail

namespace xfmr::cuda {

struct Context {
  cublasHandle_t blas = nullptr;
  cuda::DeviceArray<std::byte> blas_workspace;  // set explicitly, so that capture never allocates
  // cuBLASLt (CudaOptions::lt_epilogues): its handle, the algorithm its
  // heuristic chose for each kind of fused product (linear.cu's key; none:
  // it has none), and the count of each way they ran. Its products share
  // blas_workspace: they and cuBLAS's run one after another on one stream.
  cublasLtHandle_t lt = nullptr;
  std::map<std::array<long long, 14>, std::optional<cublasLtMatmulAlgo_t>> lt_algos;
  EpilogueStats epilogues;
  cuda::detail::StepRecorder recorder;
  std::map<std::string, cuda::detail::StepGraphs, std::less<>> graphs;  // by step key
  cuda::detail::UploadStaging staging;     // ids, targets and masks on their way in
  cuda::DeviceArray<std::uint8_t> mask;    // uploaded key padding / pooling exclusions
  cuda::DeviceArray<std::int32_t> ids;     // uploaded token ids or targets
  cuda::DeviceArray<std::int32_t> counts;  // per-sequence counts (pooling)
  cuda::DeviceArray<double> partial;       // per-block or per-row partial sums
  cuda::DeviceArray<std::uint64_t> keys;   // the dropout key of the launch queued next
  cuda::DeviceArray<float> step_scalars;   // AdamW's learning rate and bias corrections
  cuda::DeviceArray<float> scratch;        // attention backward's dS
  cuda::DeviceArray<float> dropped;        // attention dropout's dropped probabilities
  cuda::DeviceArray<float> column_partial; // add_column_sums' chunk sums
  cuda::DeviceArray<float> loss_probs;     // the unfused loss's probabilities (CudaOptions::fused_loss off)
  cuda::DeviceArray<Bf16> narrow;          // attention's probabilities (or dS) rounded, for bf16 products
  cuda::DeviceArray<Bf16> narrow_bias;     // a fused product's bias rounded (cuBLASLt reads it in D's type)
  std::vector<Bf16> host_narrow;           // host_view's download of bfloat16 values
  std::vector<double> host_partial;
  std::vector<std::int32_t> host_ids;      // embedding_backward's plan
  void* nccl = nullptr;                    // the ranks' ncclComm_t (cuda/nccl.cu), made on first use
};

}  // namespace xfmr::cuda
