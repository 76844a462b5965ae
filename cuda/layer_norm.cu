// layer_norm.cu: LayerNorm forward and backward, one warp per row; the
// parameter gradients as chunked column sums (add_column_sums).
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

__global__ void layer_norm_forward_kernel(int rows, int n, const float* x, const float* gamma, const float* beta,
                                          float eps, float* y, float* mean, float* rstd) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const float* xr = x + r * n;
    float s = 0.0f;
    for (int i = lane(); i < n; i += 32) s += xr[i];
    const float m = warp_sum(s) / float(n);
    float v = 0.0f;
    for (int i = lane(); i < n; i += 32) {
      const float d = xr[i] - m;
      v += d * d;
    }
    const float rs = 1.0f / sqrtf(warp_sum(v) / float(n) + eps);
    float* yr = y + r * n;
    for (int i = lane(); i < n; i += 32) yr[i] = (xr[i] - m) * rs * gamma[i] + beta[i];
    if (lane() == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gamma.
// Reads every dy of a row before writing dx, so dx may alias dy.
__global__ void layer_norm_dx_kernel(int rows, int n, const float* dy, const float* x, const float* gamma,
                                     const float* mean, const float* rstd, float* dx) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const float* dyr = dy + r * n;
    const float* xr = x + r * n;
    const float m = mean[r], rs = rstd[r];
    float a = 0.0f, b = 0.0f;
    for (int i = lane(); i < n; i += 32) {
      const float dxhat = dyr[i] * gamma[i];
      a += dxhat;
      b += dxhat * (xr[i] - m) * rs;
    }
    const float mean_dxhat = warp_sum(a) / float(n), mean_dxhat_xhat = warp_sum(b) / float(n);
    float* dxr = dx + r * n;
    for (int i = lane(); i < n; i += 32) {
      const float xhat = (xr[i] - m) * rs;
      dxr[i] = (dyr[i] * gamma[i] - mean_dxhat - xhat * mean_dxhat_xhat) * rs;
    }
  }
}

// Terms of dgamma (dy xhat) and dbeta (dy) for add_column_sums.
struct LayerNormParamTerms {
  const float *dy, *x, *mean, *rstd;
  int n;
  int unused = 0;  // no padding (graph signatures)
  __device__ void operator()(int r, int c, float* acc) const {
    const std::size_t i = std::size_t(r) * n + c;
    acc[0] += dy[i] * (x[i] - mean[r]) * rstd[r];
    acc[1] += dy[i];
  }
};
}  // namespace

void CudaBackend::layer_norm_forward(int rows, int n, const S* x, const S* gamma, const S* beta, S eps, S* y, S* mean,
                                     S* rstd) {
  launch("layer_norm_forward", warp_per_row(rows), layer_norm_forward_kernel, rows, n, x, gamma, beta, eps, y, mean,
         rstd);
}

// The parameter gradients are reduced first (as on the CPU), so dx may alias dy.
void CudaBackend::layer_norm_backward(int rows, int n, const S* dy, const S* x, const S* gamma, const S* mean,
                                      const S* rstd, S* dx, S* dgamma, S* dbeta) {
  add_column_sums<2>("layer_norm_backward (parameters)", rows, n, LayerNormParamTerms{dy, x, mean, rstd, n},
                     {{dgamma, dbeta}}, ctx_->column_partial);
  launch("layer_norm_backward (input)", warp_per_row(rows), layer_norm_dx_kernel, rows, n, dy, x, gamma, mean, rstd,
         dx);
}

}  // namespace xfmr
