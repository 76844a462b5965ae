// attention.cuh: what the attention kernels of attention.cu and
// attention_tiled.cu (CUDA cores) and attention_bf16.cu (tensor cores)
// share: the warp-per-row kernels' row helpers, the sizes they read, the
// dropout of a probability, the keys a query row can see, a probability
// from its log-sum-exp; and the tensor cores' tiled forward and backward,
// which attention.cu's flash_attention_* launch where they fit.
#pragma once

#include "common.cuh"
#include "xfmr/core/rng.hpp"

namespace xfmr::cuda::detail {

// The sizes the kernels read: AttentionDims without its dropout fields
// (passed on their own), KV_ROWS and KV_H resolved; ints only, so it goes
// into graph signatures as bytes.
struct KernelDims {
  int B, H, Tq, Tk, QK_DIM, V_DIM, KV_ROWS, KV_H;
  __device__ int kv_head(int h) const { return h / (H / KV_H); }
};
inline KernelDims kernel_dims(const AttentionDims& a) {
  return {a.B, a.H, a.Tq, a.Tk, a.QK_DIM, a.V_DIM, a.kv_rows(), a.kv_heads()};
}

// The warp-per-row kernels' reach (attention_plan.hpp): heads up to
// kFusedHeadDim, lane l holding columns l, l + 32, ... (kColsPerLane).
constexpr int kFusedHeadDim = kCudaHeadDim, kColsPerLane = kFusedHeadDim / 32;

struct RowIndex {
  int b, h, i;  // sequence, head, query row of warp row r of (B, H, Tq)
};
__device__ inline RowIndex split_row(long r, const KernelDims& a) {
  return {int(r / (long(a.H) * a.Tq)), int(r / a.Tq % a.H), int(r % a.Tq)};
}

// <x, y> over n activations, in float32.
template <class A>
__device__ inline float dot(const A* x, const A* y, int n) {
  float s = 0.0f;
  for (int c = 0; c < n; ++c) s += to_float(x[c]) * to_float(y[c]);
  return s;
}

// The end of a key row's backward: dK_j = scale kacc and dV_j = vacc (the
// lanes' columns of key row j of key/value head g of sequence b), assigned.
template <class A>
__device__ inline void store_key_row(const KernelDims& a, int b, int g, int j, float scale,
                                     const float (&kacc)[kColsPerLane], const float (&vacc)[kColsPerLane], A* dk,
                                     int ldk, A* dv, int ldv) {
  A* dkj = dk + (long(b) * a.Tk + j) * ldk + long(g) * a.QK_DIM;
  A* dvj = dv + (long(b) * a.Tk + j) * ldv + long(g) * a.V_DIM;
#pragma unroll
  for (int u = 0; u < kColsPerLane; ++u) {
    const int c = lane() + 32 * u;
    if (c < a.QK_DIM) dkj[c] = from_float<A>(scale * kacc[u]);
    if (c < a.V_DIM) dvj[c] = from_float<A>(vacc[u]);
  }
}

// p * keep / (1 - rate) for probabilities element e (p itself without dropout).
__device__ inline float dropped(float p, float rate, float keep_scale, std::uint64_t key, long e) {
  if (rate <= 0.0f) return p;
  return dropout_keeps(key, std::uint64_t(e), rate) ? p * keep_scale : 0.0f;
}

// Keys [0, end) can be visible to query row i.
__device__ inline int visible_end(const KernelDims& a, const DeviceMask& mask, int i) {
  return mask.causal ? min(a.Tk, i + a.Tk - a.Tq + 1) : a.Tk;
}

// The probability of query row r (lse_r) and key j from its score s; 0
// where masked or where the row saw no key.
__device__ inline float recomputed(float s, float lse_r) {
  return s == -INFINITY || lse_r == -INFINITY ? 0.0f : expf(s - lse_r);
}

// The tiled attention on bf16 tensor cores (attention_bf16.cu): heads of 64
// or 128, as wide for values as for keys. The backward writes D = <dY, Y>
// per query row into dsum (B H Tq floats of scratch). Q, K, V, dY and Y are
// read as A (float32, rounded to bf16 on the way into shared memory, or
// bf16 already), and the outputs written as A.
inline bool bf16_tiles_fit(const AttentionDims& a) {
  return a.QK_DIM == a.V_DIM && (a.QK_DIM == 64 || a.QK_DIM == 128);
}
template <class A>
void bf16_tiled_attention_forward(const KernelDims& a, float scale, const A* q, int ldq, const A* k, int ldk,
                                  const A* v, int ldv, A* y, int ldy, float* lse, DeviceMask mask, float rate,
                                  float keep_scale, const std::uint64_t* key);
template <class A>
void bf16_tiled_attention_backward(const KernelDims& a, float scale, const A* dy, int ldy, const A* y, int ldo,
                                   const A* q, int ldq, const A* k, int ldk, const A* v, int ldv, const float* lse,
                                   float* dsum, A* dq, A* dk, A* dv, DeviceMask mask, float rate, float keep_scale,
                                   const std::uint64_t* key);

}  // namespace xfmr::cuda::detail
