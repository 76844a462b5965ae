// rms_norm.cu: RmsNorm forward and backward, one warp per row; the weight's
// gradient as chunked column sums (add_column_sums), as layer_norm.cu does.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

__global__ void rms_norm_forward_kernel(int rows, int n, const float* x, const float* gamma, float eps, float* y,
                                        float* rstd) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const float* xr = x + r * n;
    float s = 0.0f;
    for (int i = lane(); i < n; i += 32) s += xr[i] * xr[i];
    const float rs = 1.0f / sqrtf(warp_sum(s) / float(n) + eps);
    float* yr = y + r * n;
    for (int i = lane(); i < n; i += 32) yr[i] = xr[i] * rs * gamma[i];
    if (lane() == 0) rstd[r] = rs;
  }
}

// dx = rstd (dxhat - xhat mean(dxhat xhat)), dxhat = dy gamma, xhat = x rstd.
// Reads every dy of a row before writing dx, so dx may alias dy.
__global__ void rms_norm_dx_kernel(int rows, int n, const float* dy, const float* x, const float* gamma,
                                   const float* rstd, float* dx) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const float* dyr = dy + r * n;
    const float* xr = x + r * n;
    const float rs = rstd[r];
    float b = 0.0f;
    for (int i = lane(); i < n; i += 32) b += dyr[i] * gamma[i] * xr[i] * rs;
    const float mean_dxhat_xhat = warp_sum(b) / float(n);
    float* dxr = dx + r * n;
    for (int i = lane(); i < n; i += 32) dxr[i] = (dyr[i] * gamma[i] - xr[i] * rs * mean_dxhat_xhat) * rs;
  }
}

// The term of dgamma (dy xhat) for add_column_sums.
struct RmsNormParamTerm {
  const float *dy, *x, *rstd;
  int n;
  int unused = 0;  // no padding (graph signatures)
  __device__ void operator()(int r, int c, float* acc) const {
    const std::size_t i = std::size_t(r) * n + c;
    acc[0] += dy[i] * x[i] * rstd[r];
  }
};
}  // namespace

void CudaBackend::rms_norm_forward(int rows, int n, const S* x, const S* gamma, S eps, S* y, S* rstd) {
  launch("rms_norm_forward", warp_per_row(rows), rms_norm_forward_kernel, rows, n, x, gamma, eps, y, rstd);
}

// The weight's gradient is reduced first (as on the CPU), so dx may alias dy.
void CudaBackend::rms_norm_backward(int rows, int n, const S* dy, const S* x, const S* gamma, const S* rstd, S* dx,
                                    S* dgamma) {
  add_column_sums<1>("rms_norm_backward (weight)", rows, n, RmsNormParamTerm{dy, x, rstd, n}, {{dgamma}},
                     ctx_->column_partial);
  launch("rms_norm_backward (input)", warp_per_row(rows), rms_norm_dx_kernel, rows, n, dy, x, gamma, rstd, dx);
}

}  // namespace xfmr
