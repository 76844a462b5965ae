// rms_norm.cu: RmsNorm forward and backward, one warp per row; the weight's
// gradient as chunked column sums (add_column_sums), as layer_norm.cu does.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

template <class A>
__global__ void rms_norm_forward_kernel(int rows, int n, const A* x, const float* gamma, float eps, A* y, float* rstd) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const A* xr = x + r * n;
    float s = 0.0f;
    for (int i = lane(); i < n; i += 32) {
      const float xi = to_float(xr[i]);
      s += xi * xi;
    }
    const float rs = 1.0f / sqrtf(warp_sum(s) / float(n) + eps);
    A* yr = y + r * n;
    for (int i = lane(); i < n; i += 32) yr[i] = from_float<A>(to_float(xr[i]) * rs * gamma[i]);
    if (lane() == 0) rstd[r] = rs;
  }
}

// dx = rstd (dxhat - xhat mean(dxhat xhat)), dxhat = dy gamma, xhat = x rstd.
// Reads every dy of a row before writing dx, so dx may alias dy.
template <class A>
__global__ void rms_norm_dx_kernel(int rows, int n, const A* dy, const A* x, const float* gamma, const float* rstd,
                                   A* dx) {
  for (long r = first_warp(); r < rows; r += warp_stride()) {
    const A* dyr = dy + r * n;
    const A* xr = x + r * n;
    const float rs = rstd[r];
    float b = 0.0f;
    for (int i = lane(); i < n; i += 32) b += to_float(dyr[i]) * gamma[i] * to_float(xr[i]) * rs;
    const float mean_dxhat_xhat = warp_sum(b) / float(n);
    A* dxr = dx + r * n;
    for (int i = lane(); i < n; i += 32)
      dxr[i] = from_float<A>((to_float(dyr[i]) * gamma[i] - to_float(xr[i]) * rs * mean_dxhat_xhat) * rs);
  }
}

// The term of dgamma (dy xhat) for add_column_sums.
template <class A>
struct RmsNormParamTerm {
  const A *dy, *x;
  const float* rstd;
  int n;
  int unused = 0;  // no padding (graph signatures)
  __device__ void operator()(int r, int c, float* acc) const {
    const std::size_t i = std::size_t(r) * n + c;
    acc[0] += to_float(dy[i]) * to_float(x[i]) * rstd[r];
  }
};
}  // namespace

template <class A>
void BasicCudaBackend<A>::rms_norm_forward(int rows, int n, const A* x, const S* gamma, S eps, A* y, S* rstd) {
  launch("rms_norm_forward", warp_per_row(rows), rms_norm_forward_kernel<A>, rows, n, x, gamma, eps, y, rstd);
}

// The weight's gradient is reduced first (as on the CPU), so dx may alias dy.
template <class A>
void BasicCudaBackend<A>::rms_norm_backward(int rows, int n, const A* dy, const A* x, const S* gamma, const S* rstd,
                                            A* dx, S* dgamma) {
  add_column_sums<1>("rms_norm_backward (weight)", rows, n, RmsNormParamTerm<A>{dy, x, rstd, n}, {{dgamma}},
                     ctx_->column_partial);
  launch("rms_norm_backward (input)", warp_per_row(rows), rms_norm_dx_kernel<A>, rows, n, dy, x, gamma, rstd, dx);
}

#define XFMR_INSTANTIATE(A)                                                                                          \
  template void BasicCudaBackend<A>::rms_norm_forward(int, int, const A*, const float*, float, A*, float*);         \
  template void BasicCudaBackend<A>::rms_norm_backward(int, int, const A*, const A*, const float*, const float*, A*, \
                                                       float*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
