// layer_norm.cu: LayerNorm forward and backward, one warp per row; the
// parameter gradients as chunked column sums (add_column_sums).
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

// A row's lanes take W consecutive columns at a time (common.cuh's
// with_pack_width: n a multiple of W): lane l columns W l .. W l + W - 1,
// then 32 W further on.
template <class A, int W>
__global__ void layer_norm_forward_kernel(int rows, int n, const A* x, const float* gamma, const float* beta,
                                          float eps, A* y, float* mean, float* rstd) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const A* xr = x + r * n;
    float s = 0.0f;
    for (int i = lane() * W; i < n; i += 32 * W) {
      float v[W];
      load<W>(xr + i, v);
#pragma unroll
      for (int k = 0; k < W; ++k) s += v[k];
    }
    const float m = warp_sum(s) / float(n);
    float var = 0.0f;
    for (int i = lane() * W; i < n; i += 32 * W) {
      float v[W];
      load<W>(xr + i, v);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float d = v[k] - m;
        var += d * d;
      }
    }
    const float rs = 1.0f / sqrtf(warp_sum(var) / float(n) + eps);
    A* yr = y + r * n;
    for (int i = lane() * W; i < n; i += 32 * W) {
      float v[W];
      load<W>(xr + i, v);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = (v[k] - m) * rs * gamma[i + k] + beta[i + k];
      store<W>(yr + i, v);
    }
    if (lane() == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gamma.
// Reads every dy of a row before writing dx, so dx may alias dy.
template <class A, int W>
__global__ void layer_norm_dx_kernel(int rows, int n, const A* dy, const A* x, const float* gamma,
                                     const float* mean, const float* rstd, A* dx) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const A* dyr = dy + r * n;
    const A* xr = x + r * n;
    const float m = mean[r], rs = rstd[r];
    float a = 0.0f, b = 0.0f;
    for (int i = lane() * W; i < n; i += 32 * W) {
      float d[W], v[W];
      load<W>(dyr + i, d);
      load<W>(xr + i, v);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float dxhat = d[k] * gamma[i + k];
        a += dxhat;
        b += dxhat * (v[k] - m) * rs;
      }
    }
    const float mean_dxhat = warp_sum(a) / float(n), mean_dxhat_xhat = warp_sum(b) / float(n);
    A* dxr = dx + r * n;
    for (int i = lane() * W; i < n; i += 32 * W) {
      float d[W], v[W];
      load<W>(dyr + i, d);
      load<W>(xr + i, v);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float xhat = (v[k] - m) * rs;
        d[k] = (d[k] * gamma[i + k] - mean_dxhat - xhat * mean_dxhat_xhat) * rs;
      }
      store<W>(dxr + i, d);
    }
  }
}

// Terms of dgamma (dy xhat) and dbeta (dy) for add_column_sums.
template <class A>
struct LayerNormParamTerms {
  const A *dy, *x;
  const float *mean, *rstd;
  int n;
  int unused = 0;  // no padding (graph signatures)
  __device__ void operator()(int r, int c, float* acc) const {
    const std::size_t i = std::size_t(r) * n + c;
    const float g = to_float(dy[i]);
    acc[0] += g * (to_float(x[i]) - mean[r]) * rstd[r];
    acc[1] += g;
  }
};
}  // namespace

template <class A>
void BasicCudaBackend<A>::layer_norm_forward(int rows, int n, const A* x, const S* gamma, const S* beta, S eps, A* y,
                                             S* mean, S* rstd) {
  with_pack_width<A>(
      std::size_t(n),
      [&](auto w) {
        launch("layer_norm_forward", warp_per_row(rows), layer_norm_forward_kernel<A, w()>, rows, n, x, gamma, beta,
               eps, y, mean, rstd);
      },
      x, y);
}

// The parameter gradients are reduced first (as on the CPU), so dx may alias dy.
template <class A>
void BasicCudaBackend<A>::layer_norm_backward(int rows, int n, const A* dy, const A* x, const S* gamma, const S* mean,
                                              const S* rstd, A* dx, S* dgamma, S* dbeta) {
  add_column_sums<2>("layer_norm_backward (parameters)", rows, n, LayerNormParamTerms<A>{dy, x, mean, rstd, n},
                     {{dgamma, dbeta}}, ctx_->column_partial);
  with_pack_width<A>(
      std::size_t(n),
      [&](auto w) {
        launch("layer_norm_backward (input)", warp_per_row(rows), layer_norm_dx_kernel<A, w()>, rows, n, dy, x, gamma,
               mean, rstd, dx);
      },
      dy, x, dx);
}

#define XFMR_INSTANTIATE(A)                                                                                        \
  template void BasicCudaBackend<A>::layer_norm_forward(int, int, const A*, const float*, const float*, float, A*, \
                                                        float*, float*);                                           \
  template void BasicCudaBackend<A>::layer_norm_backward(int, int, const A*, const A*, const float*, const float*, \
                                                         const float*, A*, float*, float*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
