// common.cuh: what every cuda/*.cu file shares: error checking, launch
// helpers, warp and block reductions, and the backend's context.
// Internal to xfmr_cuda (not installed).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "xfmr/backend/cuda.hpp"
#include "xfmr/core/error.hpp"

namespace xfmr::cuda::detail {

// Throws xfmr::Error("<what>: <CUDA message>") unless err is cudaSuccess.
void check(cudaError_t err, const char* what);
void check_cublas(cublasStatus_t status, const char* what);

// Launches kernel<<<shape>>>(args...) on the default stream and checks the
// launch (the configuration and any earlier asynchronous error).
template <class... Params, class... Args>
void launch(const char* what, Launch shape, void (*kernel)(Params...), Args... args) {
  if (shape.blocks == 0) return;
  kernel<<<shape.blocks, shape.threads>>>(args...);
  check(cudaGetLastError(), what);
}

// One warp (32 lanes) per row: `rows` rows in blocks of 8 warps.
inline Launch warp_per_row(long rows) {
  const long blocks = (rows + 7) / 8;
  return {static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256};
}

// Grid-stride index range: for (auto i = first(); i < n; i += stride()).
__device__ inline std::size_t first_index() { return std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline std::size_t grid_stride() { return std::size_t(gridDim.x) * blockDim.x; }
__device__ inline long first_warp() { return long(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; }
__device__ inline long warp_stride() { return long(gridDim.x) * (blockDim.x / 32); }
__device__ inline int lane() { return threadIdx.x % 32; }

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

// The attention mask of mask.hpp, with the key padding in device memory.
struct DeviceMask {
  bool causal;
  const std::uint8_t* key_padding;  // (B, Tk) or nullptr
  __device__ bool allowed(int b, int i, int j, int t_q, int t_kv) const {
    if (causal && j > i + (t_kv - t_q)) return false;
    if (key_padding && key_padding[long(b) * t_kv + j]) return false;
    return true;
  }
};

}  // namespace xfmr::cuda::detail

namespace xfmr {

struct CudaBackend::Context {
  cublasHandle_t blas = nullptr;
  cuda::DeviceArray<std::uint8_t> mask;    // uploaded key padding / pooling exclusions
  cuda::DeviceArray<std::int32_t> ids;     // uploaded token ids or targets
  cuda::DeviceArray<std::int32_t> counts;  // per-sequence counts (pooling)
  cuda::DeviceArray<double> partial;       // per-block or per-row partial sums
  cuda::DeviceArray<float> scratch;        // attention backward's dS
  std::vector<double> host_partial;
};

}  // namespace xfmr
