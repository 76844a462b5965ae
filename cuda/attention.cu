// attention.cu: masked softmax (forward and backward, one warp per row) and
// scaled dot-product attention, two ways:
// - up to kFusedKeys keys and heads up to kFusedHeadDim wide (training at
//   small T, and every decoding step of such models): fused kernels, one
//   warp per query row (forward: scores, softmax, probabilities, output; the
//   backward's first kernel: dP, dS, dQ) and one warp per key row (dK, dV):
//   one launch for the forward and two for the backward, for all heads;
// - otherwise cuBLAS strided-batched GEMMs, one call per head batched over
//   the sequences (head h of sequence b starts at a fixed stride from head h
//   of sequence b - 1 in Q, K, V, the output and the (B, H, Tq, Tk)
//   probabilities), around the masked softmax kernels. Attention dropout
//   always goes this way: a kernel writes the dropped probabilities beside
//   the saved ones, and the backward replays the mask from the key.
// The tiled path (flash_attention_*): attention_tiled.cu on the CUDA cores,
// attention_bf16.cu on the tensor cores.
#include <cmath>

#include "attention.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

// Row r of (B, H, Tq) rows of length Tk; in and out may alias (each lane
// reads only the elements it writes). Rows with every key masked become 0.
__global__ void masked_softmax_kernel(int B, int H, int Tq, int Tk, const float* in, float* out, DeviceMask mask) {
  const long rows = long(B) * H * Tq;
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const int b = int(r / (long(H) * Tq)), i = int(r % Tq);
    const float* x = in + r * Tk;
    float* y = out + r * Tk;
    float mx = -INFINITY;
    for (int j = lane(); j < Tk; j += 32)
      if (mask.allowed(b, i, j, Tq, Tk)) mx = fmaxf(mx, x[j]);
    mx = warp_max(mx);
    if (mx == -INFINITY) {
      for (int j = lane(); j < Tk; j += 32) y[j] = 0.0f;
      continue;
    }
    float s = 0.0f;
    for (int j = lane(); j < Tk; j += 32) {
      const float e = mask.allowed(b, i, j, Tq, Tk) ? expf(x[j] - mx) : 0.0f;
      y[j] = e;
      s += e;
    }
    const float inv = 1.0f / warp_sum(s);
    for (int j = lane(); j < Tk; j += 32) y[j] *= inv;
  }
}

// ds = p * (dp - <dp, p>) per row; ds may alias dp.
__global__ void softmax_backward_kernel(int rows, int n, const float* probs, const float* dprobs, float* dscores) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const float* p = probs + r * n;
    const float* dp = dprobs + r * n;
    float dot = 0.0f;
    for (int j = lane(); j < n; j += 32) dot += dp[j] * p[j];
    dot = warp_sum(dot);
    float* ds = dscores + r * n;
    for (int j = lane(); j < n; j += 32) ds[j] = p[j] * (dp[j] - dot);
  }
}
// ---- attention dropout -----------------------------------------------------
// The keys are read from device memory, so that a graph step replays with the
// step's fresh keys.

// out = probs * keep / (1 - p) over n elements of (B, H, Tq, Tk).
__global__ void drop_probabilities_kernel(std::size_t n, float p, float scale, const std::uint64_t* key_in,
                                          const float* probs, float* out) {
  const std::uint64_t key = *key_in;
  for (std::size_t e = first_index(); e < n; e += grid_stride())
    out[e] = dropout_keeps(key, e, p) ? probs[e] * scale : 0.0f;
}

// The softmax backward under attention dropout, per row: dP = dP' keep /
// (1 - p) with the mask replayed from the key, then dS = P (dP - <dP, P>);
// ds may alias ddropped (each lane reads only the elements it writes).
__global__ void dropped_softmax_backward_kernel(int rows, int n, float p, float scale, const std::uint64_t* key_in,
                                                const float* probs, const float* ddropped, float* ds) {
  const std::uint64_t key = *key_in;
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const float* pr = probs + r * n;
    const float* dd = ddropped + r * n;
    float* dsr = ds + r * n;
    float dot = 0.0f;
    for (int j = lane(); j < n; j += 32) {
      const float dp = dropout_keeps(key, std::uint64_t(r * n + j), p) ? dd[j] * scale : 0.0f;
      dsr[j] = dp;
      dot += dp * pr[j];
    }
    dot = warp_sum(dot);
    for (int j = lane(); j < n; j += 32) dsr[j] = pr[j] * (dsr[j] - dot);
  }
}

// ---- fused attention for short rows ----------------------------------------
constexpr int kFusedKeys = kCudaRowKeys;  // attention_plan.hpp
constexpr int kKeysPerLane = kFusedKeys / 32;

// out[c] = sum over keys j < Tk of w_j * rows[j * ld + c] for the lanes'
// columns c = lane + 32 u, where lane j % 32 holds w_j in w[j / 32].
template <int KEYS, class A>
__device__ inline void weighted_rows(const float (&w)[KEYS], int Tk, const A* rows, long ld, int cols, A* out,
                                     float scale) {
  float acc[kColsPerLane] = {};
#pragma unroll
  for (int t = 0; t < KEYS; ++t)
    for (int src = 0; src < 32; ++src) {
      const int j = 32 * t + src;
      if (j >= Tk) break;  // uniform across the warp
      const float wj = __shfl_sync(0xffffffffu, w[t], src);
      if (wj == 0.0f) continue;
      const A* row = rows + j * ld;
#pragma unroll
      for (int u = 0; u < kColsPerLane; ++u)
        if (lane() + 32 * u < cols) acc[u] += wj * to_float(row[lane() + 32 * u]);
    }
#pragma unroll
  for (int u = 0; u < kColsPerLane; ++u)
    if (lane() + 32 * u < cols) out[lane() + 32 * u] = from_float<A>(scale * acc[u]);
}

// One warp per query row: scores against the visible keys (lane j % 32 takes
// key j), the masked softmax in registers, the probabilities row, and the
// output row (lanes over its columns). A row with every key masked gets zero
// probabilities and a zero output, as on the CPU.
template <int KEYS, class A>
__global__ void attention_rows_forward_kernel(KernelDims a, float scale, const A* q, int ldq, const A* k, int ldk,
                                              const A* v, int ldv, A* y, int ldy, float* probs, DeviceMask mask) {
  const long rows = long(a.B) * a.H * a.Tq, kv = a.KV_ROWS;
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const auto [b, h, i] = split_row(r, a);
    const int g = a.kv_head(h);
    const A* qi = q + (long(b) * a.Tq + i) * ldq + long(h) * a.QK_DIM;
    const A* kb = k + long(b) * kv * ldk + long(g) * a.QK_DIM;
    float p[KEYS];
    float mx = -INFINITY;
#pragma unroll
    for (int t = 0; t < KEYS; ++t) {
      const int j = lane() + 32 * t;
      p[t] = -INFINITY;
      if (j < a.Tk && mask.allowed(b, i, j, a.Tq, a.Tk)) {
        p[t] = scale * dot(qi, kb + long(j) * ldk, a.QK_DIM);
        mx = fmaxf(mx, p[t]);
      }
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < KEYS; ++t) {
      p[t] = p[t] == -INFINITY ? 0.0f : expf(p[t] - mx);
      sum += p[t];
    }
    sum = warp_sum(sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    float* pr = probs + r * a.Tk;
#pragma unroll
    for (int t = 0; t < KEYS; ++t) {
      p[t] *= inv;
      if (lane() + 32 * t < a.Tk) pr[lane() + 32 * t] = p[t];
    }
    weighted_rows(p, a.Tk, v + long(b) * kv * ldv + long(g) * a.V_DIM, ldv, a.V_DIM,
                  y + (long(b) * a.Tq + i) * ldy + long(h) * a.V_DIM, 1.0f);
  }
}

// Backward, one warp per query row: dP_ij = dY_i . V_j, dS = P (dP - <dP, P>)
// (kept in ds for the key rows), dQ_i = scale sum_j dS_ij K_j.
template <int KEYS, class A>
__global__ void attention_rows_backward_q_kernel(KernelDims a, float scale, const A* dy, int ldy, const A* k, int ldk,
                                                 const A* v, int ldv, const float* probs, float* ds, A* dq, int ldq) {
  const long rows = long(a.B) * a.H * a.Tq;
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const auto [b, h, i] = split_row(r, a);
    const A* dyi = dy + (long(b) * a.Tq + i) * ldy + long(h) * a.V_DIM;
    const A* vb = v + long(b) * a.Tk * ldv + long(a.kv_head(h)) * a.V_DIM;
    const float* pr = probs + r * a.Tk;
    float p[KEYS], d[KEYS];
    float pd = 0.0f;
#pragma unroll
    for (int t = 0; t < KEYS; ++t) {
      const int j = lane() + 32 * t;
      p[t] = j < a.Tk ? pr[j] : 0.0f;
      d[t] = p[t] != 0.0f ? dot(dyi, vb + long(j) * ldv, a.V_DIM) : 0.0f;
      pd += p[t] * d[t];
    }
    pd = warp_sum(pd);
    float* dsr = ds + r * a.Tk;
#pragma unroll
    for (int t = 0; t < KEYS; ++t) {
      d[t] = p[t] * (d[t] - pd);
      if (lane() + 32 * t < a.Tk) dsr[lane() + 32 * t] = d[t];
    }
    weighted_rows(d, a.Tk, k + long(b) * a.Tk * ldk + long(a.kv_head(h)) * a.QK_DIM, ldk, a.QK_DIM,
                  dq + (long(b) * a.Tq + i) * ldq + long(h) * a.QK_DIM, scale);
  }
}

// Backward, one warp per key row j of key/value head g: dV_j = sum P_ij dY_i
// and dK_j = scale sum dS_ij Q_i over the query heads h sharing g, in order,
// and their query rows i in order; lanes over columns.
template <class A>
__global__ void attention_rows_backward_kv_kernel(KernelDims a, float scale, const A* dy, int ldy, const A* q, int ldq,
                                                  const float* probs, const float* ds, A* dk, int ldk, A* dv,
                                                  int ldv) {
  const long rows = long(a.B) * a.KV_H * a.Tk;
  const int group = a.H / a.KV_H;
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const int b = int(r / (long(a.KV_H) * a.Tk)), g = int(r / a.Tk % a.KV_H), j = int(r % a.Tk);
    float kacc[kColsPerLane] = {}, vacc[kColsPerLane] = {};
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const long tile = (long(b) * a.H + h) * a.Tq * a.Tk;  // (b, h)'s (Tq, Tk) block
      for (int i = 0; i < a.Tq; ++i) {
        const float pij = probs[tile + long(i) * a.Tk + j], dsij = ds[tile + long(i) * a.Tk + j];
        if (pij == 0.0f && dsij == 0.0f) continue;
        const A* qi = q + (long(b) * a.Tq + i) * ldq + long(h) * a.QK_DIM;
        const A* dyi = dy + (long(b) * a.Tq + i) * ldy + long(h) * a.V_DIM;
#pragma unroll
        for (int u = 0; u < kColsPerLane; ++u) {
          const int c = lane() + 32 * u;
          if (c < a.QK_DIM) kacc[u] += dsij * to_float(qi[c]);
          if (c < a.V_DIM) vacc[u] += pij * to_float(dyi[c]);
        }
      }
    }
    store_key_row(a, b, g, j, scale, kacc, vacc, dk, ldk, dv, ldv);
  }
}

bool fused_attention(const AttentionDims& a) {
  return plan_attention(a, AttentionUse::probabilities, cuda_attention_kernels(false)) == AttentionPath::rows;
}

// Attention's float32 probabilities (or dS) as operands of a product with
// activations: themselves, or rounded to bfloat16 into the context's scratch.
template <class A>
const A* as_operand(cuda::Context& ctx, const float* x, std::size_t n) {
  if constexpr (std::is_same_v<A, float>) {
    return x;
  } else {
    A* rounded = ctx.narrow.reserve(n);
    cuda::round_to_bf16(n, x, rounded);
    return rounded;
  }
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::softmax_forward(int B, int H, int Tq, int Tk, const S* scores, S* probs,
                                          const AttentionMask& mask) {
  const DeviceMask m{upload_mask(mask.key_padding, std::size_t(B) * Tk), mask.causal};
  launch("softmax_forward", warp_per_row(long(B) * H * Tq), masked_softmax_kernel, B, H, Tq, Tk, scores, probs, m);
}

template <class A>
void BasicCudaBackend<A>::softmax_backward(int rows, int n, const S* probs, const S* dprobs, S* dscores) {
  launch("softmax_backward", warp_per_row(rows), softmax_backward_kernel, rows, n, probs, dprobs, dscores);
}

// The heads path: the scores and the probabilities in float32; with
// bfloat16 activations the probabilities are rounded for P V (as the tiled
// kernels round them).
template <class A>
void BasicCudaBackend<A>::attention_forward(const AttentionDims& a, const A* q, int ldq, const A* k, int ldk,
                                            const A* v, int ldv, A* y, int ldy, S* probs, const AttentionMask& mask) {
  xfmr::detail::check_dropout_rate(a.dropout);
  xfmr::detail::check_kv_heads(a);
  const S scale = S(1) / std::sqrt(S(a.QK_DIM));
  if (fused_attention(a)) {
    const DeviceMask m{upload_mask(mask.key_padding, std::size_t(a.B) * a.Tk), mask.causal};
    auto* kernel =
        a.Tk <= 32 ? attention_rows_forward_kernel<1, A> : attention_rows_forward_kernel<kKeysPerLane, A>;
    launch("attention_forward", warp_per_row(long(a.B) * a.H * a.Tq), kernel, kernel_dims(a), scale, q, ldq, k, ldk,
           v, ldv, y, ldy, probs, m);
    return;
  }
  const long tile = long(a.Tq) * a.Tk, kv = a.kv_rows();
  for (int h = 0; h < a.H; ++h)  // scores (Tq, Tk) = scale Q K^T, with query head h's key head
    gemm_strided_batched(false, true, a.Tq, a.Tk, a.QK_DIM, scale, q + long(h) * a.QK_DIM, ldq, long(a.Tq) * ldq,
                         k + long(a.kv_head(h)) * a.QK_DIM, ldk, kv * ldk, S(0), probs + h * tile, a.Tk,
                         long(a.H) * tile, a.B);
  softmax_forward(a.B, a.H, a.Tq, a.Tk, probs, probs, mask);
  const A* weights = as_operand<A>(*ctx_, a.dropout > 0.0f ? drop_probabilities(a, probs) : probs,
                                   std::size_t(a.B) * a.H * tile);
  for (int h = 0; h < a.H; ++h)  // Y (Tq, V_DIM) = P V
    gemm_strided_batched(false, false, a.Tq, a.V_DIM, a.Tk, S(1), weights + h * tile, a.Tk, long(a.H) * tile,
                         v + long(a.kv_head(h)) * a.V_DIM, ldv, kv * ldv, S(0), y + long(h) * a.V_DIM, ldy,
                         long(a.Tq) * ldy, a.B);
}

template <class A>
void BasicCudaBackend<A>::attention_backward(const AttentionDims& a, const A* dy, int ldy, const A* q, int ldq,
                                             const A* k, int ldk, const A* v, int ldv, const S* probs, A* dq, A* dk,
                                             A* dv) {
  xfmr::detail::check_unstrided_keys(a);
  xfmr::detail::check_dropout_rate(a.dropout);
  xfmr::detail::check_kv_heads(a);
  const S scale = S(1) / std::sqrt(S(a.QK_DIM));
  const long tile = long(a.Tq) * a.Tk, bh = long(a.H) * tile;
  const int group = a.H / a.kv_heads();
  S* ds = ctx_->scratch.reserve(std::size_t(a.B) * bh);
  if (fused_attention(a)) {
    auto* q_kernel =
        a.Tk <= 32 ? attention_rows_backward_q_kernel<1, A> : attention_rows_backward_q_kernel<kKeysPerLane, A>;
    const KernelDims kd = kernel_dims(a);
    launch("attention_backward (queries)", warp_per_row(long(a.B) * a.H * a.Tq), q_kernel, kd, scale, dy, ldy, k,
           ldk, v, ldv, probs, ds, dq, ldq);
    launch("attention_backward (keys)", warp_per_row(long(a.B) * a.kv_heads() * a.Tk),
           attention_rows_backward_kv_kernel<A>, kd, scale, dy, ldy, q, ldq, probs, static_cast<const S*>(ds), dk,
           ldk, dv, ldv);
    return;
  }
  const bool drop = a.dropout > 0.0f;
  const std::size_t n = std::size_t(a.B) * bh;
  // The forward's weights, the mask replayed (with bfloat16 activations: rounded).
  const A* weights = as_operand<A>(*ctx_, drop ? drop_probabilities(a, probs) : probs, n);
  // A key/value head's dK and dV: assigned by the first query head of its
  // group, added to by the others in order (queued, so in stream order).
  for (int h = 0; h < a.H; ++h) {
    const A* dy_h = dy + long(h) * a.V_DIM;
    const A* v_h = v + long(a.kv_head(h)) * a.V_DIM;
    const S into = h % group == 0 ? S(0) : S(1);
    // dV (Tk, V_DIM) (+)= P^T dY
    gemm_strided_batched(true, false, a.Tk, a.V_DIM, a.Tq, S(1), weights + h * tile, a.Tk, bh, dy_h, ldy,
                         long(a.Tq) * ldy, into, dv + long(a.kv_head(h)) * a.V_DIM, ldv, long(a.Tk) * ldv, a.B);
    // dP (Tq, Tk) = dY V^T
    gemm_strided_batched(false, true, a.Tq, a.Tk, a.V_DIM, S(1), dy_h, ldy, long(a.Tq) * ldy, v_h, ldv,
                         long(a.Tk) * ldv, S(0), ds + h * tile, a.Tk, bh, a.B);
  }
  if (drop)  // dS, in place, through the mask
    launch("attention_backward (dropout)", warp_per_row(long(a.B) * a.H * a.Tq), dropped_softmax_backward_kernel,
           a.B * a.H * a.Tq, a.Tk, a.dropout, 1.0f / (1.0f - a.dropout), dropout_key(a.dropout_key), probs,
           static_cast<const S*>(ds), ds);
  else
    softmax_backward(a.B * a.H * a.Tq, a.Tk, probs, ds, ds);  // dS, in place
  const A* ds_operand = as_operand<A>(*ctx_, ds, n);
  for (int h = 0; h < a.H; ++h) {
    const A* q_h = q + long(h) * a.QK_DIM;
    const A* k_h = k + long(a.kv_head(h)) * a.QK_DIM;
    const S into = h % group == 0 ? S(0) : S(1);
    // dQ (Tq, QK_DIM) = scale dS K
    gemm_strided_batched(false, false, a.Tq, a.QK_DIM, a.Tk, scale, ds_operand + h * tile, a.Tk, bh, k_h, ldk,
                         long(a.Tk) * ldk, S(0), dq + long(h) * a.QK_DIM, ldq, long(a.Tq) * ldq, a.B);
    // dK (Tk, QK_DIM) (+)= scale dS^T Q
    gemm_strided_batched(true, false, a.Tk, a.QK_DIM, a.Tq, scale, ds_operand + h * tile, a.Tk, bh, q_h, ldq,
                         long(a.Tq) * ldq, into, dk + long(a.kv_head(h)) * a.QK_DIM, ldk, long(a.Tk) * ldk, a.B);
  }
}

// Attention dropout's weights: probs * keep / (1 - p), in a buffer of their own.
template <class A>
auto BasicCudaBackend<A>::drop_probabilities(const AttentionDims& a, const S* probs) -> const S* {
  const std::size_t n = std::size_t(a.B) * a.H * a.Tq * a.Tk;
  S* dropped = ctx_->dropped.reserve(n);
  launch("attention dropout", cuda::elementwise_launch(n), drop_probabilities_kernel, n, a.dropout,
         1.0f / (1.0f - a.dropout), dropout_key(a.dropout_key), probs, dropped);
  return dropped;
}

#define XFMR_INSTANTIATE(A)                                                                                           \
  template void BasicCudaBackend<A>::softmax_forward(int, int, int, int, const float*, float*,                       \
                                                     const AttentionMask&);                                          \
  template void BasicCudaBackend<A>::softmax_backward(int, int, const float*, const float*, float*);                 \
  template void BasicCudaBackend<A>::attention_forward(const AttentionDims&, const A*, int, const A*, int, const A*, \
                                                       int, A*, int, float*, const AttentionMask&);                  \
  template void BasicCudaBackend<A>::attention_backward(const AttentionDims&, const A*, int, const A*, int,          \
                                                        const A*, int, const A*, int, const float*, A*, A*, A*);     \
  template const float* BasicCudaBackend<A>::drop_probabilities(const AttentionDims&, const float*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
