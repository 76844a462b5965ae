// optimizers.cu: fused AdamW and SGD updates, and the gradient utilities'
// sum of squares (fixed launch shape, partial sums added on the host in
// block order: repeatable) and scaling.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

constexpr unsigned kSumBlocks = 256, kSumThreads = 256;

__global__ void adamw_kernel(std::size_t n, float* p, const float* g, float* m, float* v, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float step_size, float rbc2) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float pi = p[i];
    pi -= lr * weight_decay * pi;
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (sqrtf(vi) * rbc2 + eps);
  }
}
__global__ void sgd_kernel(std::size_t n, float* p, const float* g, float* buf, float lr, float momentum,
                           float weight_decay) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float d = g[i] + weight_decay * p[i];
    const float b = momentum * buf[i] + d;
    buf[i] = b;
    p[i] -= lr * b;
  }
}
__global__ void scale_kernel(std::size_t n, float alpha, float* x) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] *= alpha;
}
__global__ void sum_squares_kernel(std::size_t n, const float* x, double* partial) {
  __shared__ double shared[32];
  double s = 0.0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) s += double(x[i]) * double(x[i]);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
}  // namespace

void CudaBackend::adamw_step(std::size_t n, S* p, const S* g, S* m, S* v, S lr, S beta1, S beta2, S eps,
                             S weight_decay, S bias_correction1, S bias_correction2) {
  launch("adamw_step", cuda::elementwise_launch(n), adamw_kernel, n, p, g, m, v, lr, beta1, beta2, eps, weight_decay,
         lr / bias_correction1, 1.0f / std::sqrt(bias_correction2));
}

void CudaBackend::sgd_step(std::size_t n, S* p, const S* g, S* buf, S lr, S momentum, S weight_decay) {
  launch("sgd_step", cuda::elementwise_launch(n), sgd_kernel, n, p, g, buf, lr, momentum, weight_decay);
}

void CudaBackend::scale(std::size_t n, S alpha, S* x) {
  launch("scale", cuda::elementwise_launch(n), scale_kernel, n, alpha, x);
}

double CudaBackend::sum_squares(std::size_t n, const S* x) {
  if (n == 0) return 0.0;
  double* partial = ctx_->partial.reserve(kSumBlocks);
  launch("sum_squares", cuda::Launch{kSumBlocks, kSumThreads}, sum_squares_kernel, n, x, partial);
  auto& host = ctx_->host_partial;
  host.resize(kSumBlocks);
  cuda::download(host.data(), partial, kSumBlocks * sizeof(double));
  double total = 0.0;
  for (double s : host) total += s;
  return total;
}

}  // namespace xfmr
