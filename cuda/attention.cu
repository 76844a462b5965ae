// attention.cu: masked softmax (forward and backward, one warp per row) and
// scaled dot-product attention. The products are cuBLAS strided-batched
// GEMMs, one call per head batched over the sequences: head h of sequence b
// starts at a fixed stride from head h of sequence b - 1 in Q, K, V, the
// output and the (B, H, Tq, Tk) probabilities, which is what the
// strided-batched call needs.
#include <cmath>

#include "common.cuh"

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
}  // namespace

void CudaBackend::softmax_forward(int B, int H, int Tq, int Tk, const S* scores, S* probs,
                                  const AttentionMask& mask) {
  const DeviceMask m{mask.causal, upload_mask(mask.key_padding, std::size_t(B) * Tk)};
  launch("softmax_forward", warp_per_row(long(B) * H * Tq), masked_softmax_kernel, B, H, Tq, Tk, scores, probs, m);
}

void CudaBackend::softmax_backward(int rows, int n, const S* probs, const S* dprobs, S* dscores) {
  launch("softmax_backward", warp_per_row(rows), softmax_backward_kernel, rows, n, probs, dprobs, dscores);
}

void CudaBackend::attention_forward(const AttentionDims& a, const S* q, int ldq, const S* k, int ldk, const S* v,
                                    int ldv, S* y, int ldy, S* probs, const AttentionMask& mask) {
  const S scale = S(1) / std::sqrt(S(a.QK_DIM));
  const long tile = long(a.Tq) * a.Tk, kv = a.kv_rows();
  for (int h = 0; h < a.H; ++h)  // scores (Tq, Tk) = scale Q K^T
    gemm_strided_batched(false, true, a.Tq, a.Tk, a.QK_DIM, scale, q + long(h) * a.QK_DIM, ldq, long(a.Tq) * ldq,
                         k + long(h) * a.QK_DIM, ldk, kv * ldk, S(0), probs + h * tile, a.Tk, long(a.H) * tile, a.B);
  softmax_forward(a.B, a.H, a.Tq, a.Tk, probs, probs, mask);
  for (int h = 0; h < a.H; ++h)  // Y (Tq, V_DIM) = P V
    gemm_strided_batched(false, false, a.Tq, a.V_DIM, a.Tk, S(1), probs + h * tile, a.Tk, long(a.H) * tile,
                         v + long(h) * a.V_DIM, ldv, kv * ldv, S(0), y + long(h) * a.V_DIM, ldy, long(a.Tq) * ldy,
                         a.B);
}

void CudaBackend::attention_backward(const AttentionDims& a, const S* dy, int ldy, const S* q, int ldq, const S* k,
                                     int ldk, const S* v, int ldv, const S* probs, S* dq, S* dk, S* dv) {
  require(a.kv_rows() == a.Tk, "attention backward needs unstrided keys (KV_ROWS ", a.KV_ROWS, ", Tk ", a.Tk, ")");
  const S scale = S(1) / std::sqrt(S(a.QK_DIM));
  const long tile = long(a.Tq) * a.Tk, bh = long(a.H) * tile;
  S* ds = ctx_->scratch.reserve(std::size_t(a.B) * bh);
  for (int h = 0; h < a.H; ++h) {
    const S* dy_h = dy + long(h) * a.V_DIM;
    const S* v_h = v + long(h) * a.V_DIM;
    // dV (Tk, V_DIM) = P^T dY
    gemm_strided_batched(true, false, a.Tk, a.V_DIM, a.Tq, S(1), probs + h * tile, a.Tk, bh, dy_h, ldy,
                         long(a.Tq) * ldy, S(0), dv + long(h) * a.V_DIM, ldv, long(a.Tk) * ldv, a.B);
    // dP (Tq, Tk) = dY V^T
    gemm_strided_batched(false, true, a.Tq, a.Tk, a.V_DIM, S(1), dy_h, ldy, long(a.Tq) * ldy, v_h, ldv,
                         long(a.Tk) * ldv, S(0), ds + h * tile, a.Tk, bh, a.B);
  }
  softmax_backward(a.B * a.H * a.Tq, a.Tk, probs, ds, ds);  // dS, in place
  for (int h = 0; h < a.H; ++h) {
    const S* q_h = q + long(h) * a.QK_DIM;
    const S* k_h = k + long(h) * a.QK_DIM;
    // dQ (Tq, QK_DIM) = scale dS K
    gemm_strided_batched(false, false, a.Tq, a.QK_DIM, a.Tk, scale, ds + h * tile, a.Tk, bh, k_h, ldk,
                         long(a.Tk) * ldk, S(0), dq + long(h) * a.QK_DIM, ldq, long(a.Tq) * ldq, a.B);
    // dK (Tk, QK_DIM) = scale dS^T Q
    gemm_strided_batched(true, false, a.Tk, a.QK_DIM, a.Tq, scale, ds + h * tile, a.Tk, bh, q_h, ldq,
                         long(a.Tq) * ldq, S(0), dk + long(h) * a.QK_DIM, ldk, long(a.Tk) * ldk, a.B);
  }
}

}  // namespace xfmr
