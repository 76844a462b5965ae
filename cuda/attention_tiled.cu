// attention_tiled.cu: the tiled attention on the CUDA cores
// (flash_attention_forward and _backward, where attention_plan.hpp's
// planner tiles): one warp a query row, and for the backward's dK and dV
// one a key row; the tensor-core tiles of attention_bf16.cu instead where
// bf16 products ask and they fit.
#include <cmath>

#include "attention.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

// The CPU's flash attention (cpu/attention_tiled.hpp) one warp per row, with
// keys (or queries) in chunks of 32, lane j % 32 taking j: the forward keeps
// a running maximum and sum across the chunks and the output in registers,
// and saves the row's log-sum-exp; the backward recomputes each probability
// from it (p = exp(s - lse)), with D = <dY_i, Y_i> in place of <dP_i, P_i>.
// Dropout: element ((b H + h) Tq + i) Tk + j of the probabilities, as the
// materialised path, from the key in device memory (graph replay).
// Memory: (B, H, Tq) saved, nothing of (Tq, Tk). Heads up to kFusedHeadDim.

template <class A>
__global__ void flash_rows_forward_kernel(KernelDims a, float scale, const A* q, int ldq, const A* k, int ldk,
                                          const A* v, int ldv, A* y, int ldy, float* lse, DeviceMask mask, float rate,
                                          float keep_scale, const std::uint64_t* key_in) {
  const long rows = long(a.B) * a.H * a.Tq, kv = a.KV_ROWS;
  const std::uint64_t key = rate > 0.0f ? *key_in : 0;
  for (long r = first_warp(); r < rows; r += warp_stride()) {  // r = (b H + h) Tq + i
    const auto [b, h, i] = split_row(r, a);
    const int g = a.kv_head(h), end = visible_end(a, mask, i);
    const A* qi = q + (long(b) * a.Tq + i) * ldq + long(h) * a.QK_DIM;
    const A* kb = k + long(b) * kv * ldk + long(g) * a.QK_DIM;
    const A* vb = v + long(b) * kv * ldv + long(g) * a.V_DIM;
    float m = -INFINITY, l = 0.0f, acc[kColsPerLane] = {};
    for (int j0 = 0; j0 < end; j0 += 32) {
      const int j = j0 + lane();
      float s = -INFINITY;
      if (j < end && mask.allowed(b, i, j, a.Tq, a.Tk)) s = scale * dot(qi, kb + long(j) * ldk, a.QK_DIM);
      const float top = fmaxf(m, warp_max(s));
      if (top == -INFINITY) continue;  // nothing visible yet (the same on every lane)
      const float p = s == -INFINITY ? 0.0f : expf(s - top), rescale = expf(m - top);  // 0 on the first
      l = l * rescale + warp_sum(p);
      m = top;
      const float w = dropped(p, rate, keep_scale, key, r * a.Tk + j);
#pragma unroll
      for (int u = 0; u < kColsPerLane; ++u) acc[u] *= rescale;
      for (int src = 0; src < 32 && j0 + src < end; ++src) {
        const float wj = __shfl_sync(0xffffffffu, w, src);
        if (wj == 0.0f) continue;
        const A* row = vb + long(j0 + src) * ldv;
#pragma unroll
        for (int u = 0; u < kColsPerLane; ++u)
          if (lane() + 32 * u < a.V_DIM) acc[u] += wj * to_float(row[lane() + 32 * u]);
      }
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    A* yi = y + (long(b) * a.Tq + i) * ldy + long(h) * a.V_DIM;
#pragma unroll
    for (int u = 0; u < kColsPerLane; ++u)
      if (lane() + 32 * u < a.V_DIM) yi[lane() + 32 * u] = from_float<A>(acc[u] * inv);
    if (lane() == 0) lse[r] = l > 0.0f ? m + logf(l) : -INFINITY;
  }
}

// Backward, one warp per query row: D_r = <dY_i, Y_i> (saved for the key
// rows), then over the visible keys dS = P (dP - D) and dQ_i = scale sum_j
// dS_ij K_j.
template <class A>
__global__ void flash_rows_backward_q_kernel(KernelDims a, float scale, const A* dy, int ldy, const A* y, int ldo,
                                             const A* q, int ldq, const A* k, int ldk, const A* v, int ldv,
                                             const float* lse, float* dsum, A* dq, DeviceMask mask, float rate,
                                             float keep_scale, const std::uint64_t* key_in) {
  const long rows = long(a.B) * a.H * a.Tq;
  const std::uint64_t key = rate > 0.0f ? *key_in : 0;
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const auto [b, h, i] = split_row(r, a);
    const int g = a.kv_head(h), end = visible_end(a, mask, i);
    const A* dyi = dy + (long(b) * a.Tq + i) * ldy + long(h) * a.V_DIM;
    const A* yi = y + (long(b) * a.Tq + i) * ldo + long(h) * a.V_DIM;
    const A* qi = q + (long(b) * a.Tq + i) * ldq + long(h) * a.QK_DIM;
    const A* kb = k + long(b) * a.Tk * ldk + long(g) * a.QK_DIM;
    const A* vb = v + long(b) * a.Tk * ldv + long(g) * a.V_DIM;
    float d = 0.0f;
    for (int c = lane(); c < a.V_DIM; c += 32) d += to_float(dyi[c]) * to_float(yi[c]);
    d = warp_sum(d);
    if (lane() == 0) dsum[r] = d;
    const float lse_r = lse[r];
    float acc[kColsPerLane] = {};
    for (int j0 = 0; j0 < end; j0 += 32) {
      const int j = j0 + lane();
      float ds = 0.0f;
      if (j < end && mask.allowed(b, i, j, a.Tq, a.Tk)) {
        const float p = recomputed(scale * dot(qi, kb + long(j) * ldk, a.QK_DIM), lse_r);
        if (p != 0.0f)
          ds = p * (dropped(dot(dyi, vb + long(j) * ldv, a.V_DIM), rate, keep_scale, key, r * a.Tk + j) - d);
      }
      for (int src = 0; src < 32 && j0 + src < end; ++src) {
        const float dsj = __shfl_sync(0xffffffffu, ds, src);
        if (dsj == 0.0f) continue;
        const A* row = kb + long(j0 + src) * ldk;
#pragma unroll
        for (int u = 0; u < kColsPerLane; ++u)
          if (lane() + 32 * u < a.QK_DIM) acc[u] += dsj * to_float(row[lane() + 32 * u]);
      }
    }
    A* dqi = dq + (long(b) * a.Tq + i) * ldq + long(h) * a.QK_DIM;
#pragma unroll
    for (int u = 0; u < kColsPerLane; ++u)
      if (lane() + 32 * u < a.QK_DIM) dqi[lane() + 32 * u] = from_float<A>(scale * acc[u]);
  }
}

// Backward, one warp per key row j of key/value head g: over the query heads
// sharing g and the query rows that see j (32 at a time, lane i % 32),
// dV_j = sum dropped(P_ij) dY_i and dK_j = scale sum dS_ij Q_i, assigned.
template <class A>
__global__ void flash_rows_backward_kv_kernel(KernelDims a, float scale, const A* dy, int ldy, const A* q, int ldq,
                                              const A* k, int ldk, const A* v, int ldv, const float* lse,
                                              const float* dsum, A* dk, A* dv, DeviceMask mask, float rate,
                                              float keep_scale, const std::uint64_t* key_in) {
  const long rows = long(a.B) * a.KV_H * a.Tk;
  const int group = a.H / a.KV_H;
  const std::uint64_t key = rate > 0.0f ? *key_in : 0;
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const int b = int(r / (long(a.KV_H) * a.Tk)), g = int(r / a.Tk % a.KV_H), j = int(r % a.Tk);
    const A* kj = k + (long(b) * a.Tk + j) * ldk + long(g) * a.QK_DIM;
    const A* vj = v + (long(b) * a.Tk + j) * ldv + long(g) * a.V_DIM;
    const int first = mask.causal ? max(0, j - (a.Tk - a.Tq)) : 0;  // the first query row that sees j
    const bool padded = mask.key_padding && mask.key_padding[long(b) * a.Tk + j];
    float kacc[kColsPerLane] = {}, vacc[kColsPerLane] = {};
    for (int h = g * group; h < (g + 1) * group && !padded; ++h) {
      const long row0 = (long(b) * a.H + h) * a.Tq;  // (b, h)'s query rows in (B, H, Tq)
      for (int i0 = first; i0 < a.Tq; i0 += 32) {
        const int i = i0 + lane();
        float pd = 0.0f, ds = 0.0f;
        if (i < a.Tq) {
          const A* qi = q + (long(b) * a.Tq + i) * ldq + long(h) * a.QK_DIM;
          const A* dyi = dy + (long(b) * a.Tq + i) * ldy + long(h) * a.V_DIM;
          const float p = recomputed(scale * dot(qi, kj, a.QK_DIM), lse[row0 + i]);
          if (p != 0.0f) {
            const long e = (row0 + i) * a.Tk + j;
            pd = dropped(p, rate, keep_scale, key, e);
            ds = p * (dropped(dot(dyi, vj, a.V_DIM), rate, keep_scale, key, e) - dsum[row0 + i]);
          }
        }
        for (int src = 0; src < 32 && i0 + src < a.Tq; ++src) {
          const float pds = __shfl_sync(0xffffffffu, pd, src), dss = __shfl_sync(0xffffffffu, ds, src);
          if (pds == 0.0f && dss == 0.0f) continue;
          const A* qs = q + (long(b) * a.Tq + i0 + src) * ldq + long(h) * a.QK_DIM;
          const A* dys = dy + (long(b) * a.Tq + i0 + src) * ldy + long(h) * a.V_DIM;
#pragma unroll
          for (int u = 0; u < kColsPerLane; ++u) {
            const int c = lane() + 32 * u;
            if (c < a.QK_DIM) kacc[u] += dss * to_float(qs[c]);
            if (c < a.V_DIM) vacc[u] += pds * to_float(dys[c]);
          }
        }
      }
    }
    store_key_row(a, b, g, j, scale, kacc, vacc, dk, ldk, dv, ldv);
  }
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::flash_attention_forward(const AttentionDims& a, const A* q, int ldq, const A* k, int ldk,
                                                  const A* v, int ldv, A* y, int ldy, S* lse,
                                                  const AttentionMask& mask) {
  xfmr::detail::check_dropout_rate(a.dropout);
  xfmr::detail::check_kv_heads(a);
  require(a.QK_DIM <= kFusedHeadDim && a.V_DIM <= kFusedHeadDim, "tiled attention: heads of ", a.QK_DIM, " and ",
          a.V_DIM, " exceed ", kFusedHeadDim);
  const bool drop = a.dropout > 0.0f;
  const DeviceMask m{upload_mask(mask.key_padding, std::size_t(a.B) * a.Tk), mask.causal};
  const float scale = 1.0f / std::sqrt(float(a.QK_DIM)), keep_scale = drop ? 1.0f / (1.0f - a.dropout) : 1.0f;
  const std::uint64_t* key = drop ? dropout_key(a.dropout_key) : nullptr;
  if (opts_.bf16 && bf16_tiles_fit(a))  // bf16 products: the tensor cores (attention_bf16.cu)
    return bf16_tiled_attention_forward(kernel_dims(a), scale, q, ldq, k, ldk, v, ldv, y, ldy, lse, m, a.dropout,
                                        keep_scale, key);
  launch("flash_attention_forward", warp_per_row(long(a.B) * a.H * a.Tq), flash_rows_forward_kernel<A>,
         kernel_dims(a), scale, q, ldq, k, ldk, v, ldv, y, ldy, lse, m, a.dropout, keep_scale, key);
}

template <class A>
void BasicCudaBackend<A>::flash_attention_backward(const AttentionDims& a, const A* dy, int ldy, const A* y, int ldo,
                                                   const A* q, int ldq, const A* k, int ldk, const A* v, int ldv,
                                                   const S* lse, const AttentionMask& mask, A* dq, A* dk, A* dv) {
  xfmr::detail::check_unstrided_keys(a);
  xfmr::detail::check_dropout_rate(a.dropout);
  xfmr::detail::check_kv_heads(a);
  require(a.QK_DIM <= kFusedHeadDim && a.V_DIM <= kFusedHeadDim, "tiled attention: heads of ", a.QK_DIM, " and ",
          a.V_DIM, " exceed ", kFusedHeadDim);
  const bool drop = a.dropout > 0.0f;
  const float scale = 1.0f / std::sqrt(float(a.QK_DIM)), keep_scale = drop ? 1.0f / (1.0f - a.dropout) : 1.0f;
  const std::uint64_t* key = drop ? dropout_key(a.dropout_key) : nullptr;
  const DeviceMask m{upload_mask(mask.key_padding, std::size_t(a.B) * a.Tk), mask.causal};
  S* dsum = ctx_->scratch.reserve(std::size_t(a.B) * a.H * a.Tq);  // D per query row
  const KernelDims kd = kernel_dims(a);
  if (opts_.bf16 && bf16_tiles_fit(a))  // bf16 products: the tensor cores (attention_bf16.cu)
    return bf16_tiled_attention_backward(kd, scale, dy, ldy, y, ldo, q, ldq, k, ldk, v, ldv, lse, dsum, dq, dk, dv, m,
                                         a.dropout, keep_scale, key);
  launch("flash_attention_backward (queries)", warp_per_row(long(a.B) * a.H * a.Tq), flash_rows_backward_q_kernel<A>,
         kd, scale, dy, ldy, y, ldo, q, ldq, k, ldk, v, ldv, lse, dsum, dq, m, a.dropout, keep_scale, key);
  launch("flash_attention_backward (keys)", warp_per_row(long(a.B) * a.kv_heads() * a.Tk),
         flash_rows_backward_kv_kernel<A>, kd, scale, dy, ldy, q, ldq, k, ldk, v, ldv, lse,
         static_cast<const S*>(dsum), dk, dv, m, a.dropout, keep_scale, key);
}

#define XFMR_INSTANTIATE(A)                                                                                          \
  template void BasicCudaBackend<A>::flash_attention_forward(const AttentionDims&, const A*, int, const A*, int,    \
                                                             const A*, int, A*, int, float*, const AttentionMask&); \
  template void BasicCudaBackend<A>::flash_attention_backward(const AttentionDims&, const A*, int, const A*, int,   \
                                                              const A*, int, const A*, int, const A*, int,          \
                                                              const float*, const AttentionMask&, A*, A*, A*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
