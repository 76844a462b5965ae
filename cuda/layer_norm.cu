// layer_norm.cu: LayerNorm forward and backward, one warp per row; the
// parameter gradients as chunked column sums (add_column_sums).
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

template <class A>
__global__ void layer_norm_forward_kernel(int rows, int n, const A* x, const float* gamma, const float* beta,
                                          float eps, A* y, float* mean, float* rstd) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const A* xr = x + r * n;
    float s = 0.0f;
    for (int i = lane(); i < n; i += 32) s += to_float(xr[i]);
    const float m = warp_sum(s) / float(n);
    float v = 0.0f;
    for (int i = lane(); i < n; i += 32) {
      const float d = to_float(xr[i]) - m;
      v += d * d;
    }
    const float rs = 1.0f / sqrtf(warp_sum(v) / float(n) + eps);
    A* yr = y + r * n;
    for (int i = lane(); i < n; i += 32) yr[i] = from_float<A>((to_float(xr[i]) - m) * rs * gamma[i] + beta[i]);
    if (lane() == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gamma.
// Reads every dy of a row before writing dx, so dx may alias dy.
template <class A>
__global__ void layer_norm_dx_kernel(int rows, int n, const A* dy, const A* x, const float* gamma,
                                     const float* mean, const float* rstd, A* dx) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const A* dyr = dy + r * n;
    const A* xr = x + r * n;
    const float m = mean[r], rs = rstd[r];
    float a = 0.0f, b = 0.0f;
    for (int i = lane(); i < n; i += 32) {
      const float dxhat = to_float(dyr[i]) * gamma[i];
      a += dxhat;
      b += dxhat * (to_float(xr[i]) - m) * rs;
    }
    const float mean_dxhat = warp_sum(a) / float(n), mean_dxhat_xhat = warp_sum(b) / float(n);
    A* dxr = dx + r * n;
    for (int i = lane(); i < n; i += 32) {
      const float xhat = (to_float(xr[i]) - m) * rs;
      dxr[i] = from_float<A>((to_float(dyr[i]) * gamma[i] - mean_dxhat - xhat * mean_dxhat_xhat) * rs);
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
  launch("layer_norm_forward", warp_per_row(rows), layer_norm_forward_kernel<A>, rows, n, x, gamma, beta, eps, y,
         mean, rstd);
}

// The parameter gradients are reduced first (as on the CPU), so dx may alias dy.
template <class A>
void BasicCudaBackend<A>::layer_norm_backward(int rows, int n, const A* dy, const A* x, const S* gamma, const S* mean,
                                              const S* rstd, A* dx, S* dgamma, S* dbeta) {
  add_column_sums<2>("layer_norm_backward (parameters)", rows, n, LayerNormParamTerms<A>{dy, x, mean, rstd, n},
                     {{dgamma, dbeta}}, ctx_->column_partial);
  launch("layer_norm_backward (input)", warp_per_row(rows), layer_norm_dx_kernel<A>, rows, n, dy, x, gamma, mean,
         rstd, dx);
}

#define XFMR_INSTANTIATE(A)                                                                                        \
  template void BasicCudaBackend<A>::layer_norm_forward(int, int, const A*, const float*, const float*, float, A*, \
                                                        float*, float*);                                           \
  template void BasicCudaBackend<A>::layer_norm_backward(int, int, const A*, const A*, const float*, const float*, \
                                                         const float*, A*, float*, float*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
