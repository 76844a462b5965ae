// activation.cu: ReLU, GELU (tanh form), SwiGLU and GeGLU, forward and backward.
#include "common.cuh"

namespace xfmr {

namespace {
using cuda::detail::first_index;
using cuda::detail::grid_stride;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

__global__ void relu_forward_kernel(std::size_t n, const float* x, float* y) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
__global__ void relu_backward_kernel(std::size_t n, const float* x, const float* dy, float* dx) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}
__global__ void gelu_forward_kernel(std::size_t n, const float* x, float* y) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kGeluC * (v + 0.044715f * v * v * v)));
  }
}
// 1 - tanh(u)^2 as 4 e / (1 + e)^2 with e = exp(-2|u|), as on the CPU: from
// t itself it cancels as t nears +-1 (x < -4), where the derivative is 1e-5
// or less.
__global__ void gelu_backward_kernel(std::size_t n, const float* x, const float* dy, float* dx) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    const float u = kGeluC * (v + 0.044715f * v * v * v);
    const float t = tanhf(u), e = expf(-2.0f * fabsf(u));
    const float sech2 = 4.0f * e / ((1.0f + e) * (1.0f + e));
    const float dinner = kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * sech2 * dinner);
  }
}
// SwiGLU over rows of [gate | up] (h: rows x 2n), one thread per output.
__global__ void swiglu_forward_kernel(std::size_t total, int n, const float* h, float* y) {
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const std::size_t r = i / n, j = i % n;
    const float g = h[2 * r * n + j], u = h[2 * r * n + n + j];
    y[i] = g / (1.0f + expf(-g)) * u;
  }
}
__global__ void swiglu_backward_kernel(std::size_t total, int n, const float* h, const float* dy, float* dh) {
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const std::size_t r = i / n, j = i % n;
    const float g = h[2 * r * n + j], u = h[2 * r * n + n + j];
    const float s = 1.0f / (1.0f + expf(-g));
    dh[2 * r * n + j] = dy[i] * u * s * (1.0f + g * (1.0f - s));
    dh[2 * r * n + n + j] = dy[i] * g * s;
  }
}
// GeGLU over rows of [gate | up]: gelu(g) u, GELU's tanh form; backward as
// gelu_backward_kernel's derivative (1 - tanh^2 through exp(-2|u|)).
__device__ float gelu_of(float v) { return 0.5f * v * (1.0f + tanhf(kGeluC * (v + 0.044715f * v * v * v))); }
__device__ float gelu_slope(float v) {
  const float u = kGeluC * (v + 0.044715f * v * v * v);
  const float t = tanhf(u), e = expf(-2.0f * fabsf(u));
  const float sech2 = 4.0f * e / ((1.0f + e) * (1.0f + e));
  return 0.5f * (1.0f + t) + 0.5f * v * sech2 * kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
}
__global__ void geglu_forward_kernel(std::size_t total, int n, const float* h, float* y) {
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const std::size_t r = i / n, j = i % n;
    y[i] = gelu_of(h[2 * r * n + j]) * h[2 * r * n + n + j];
  }
}
__global__ void geglu_backward_kernel(std::size_t total, int n, const float* h, const float* dy, float* dh) {
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const std::size_t r = i / n, j = i % n;
    const float g = h[2 * r * n + j], u = h[2 * r * n + n + j];
    dh[2 * r * n + j] = dy[i] * u * gelu_slope(g);
    dh[2 * r * n + n + j] = dy[i] * gelu_of(g);
  }
}
}  // namespace

void CudaBackend::relu_forward(std::size_t n, const S* x, S* y) {
  cuda::detail::launch("relu_forward", cuda::elementwise_launch(n), relu_forward_kernel, n, x, y);
}
void CudaBackend::relu_backward(std::size_t n, const S* x, const S* dy, S* dx) {
  cuda::detail::launch("relu_backward", cuda::elementwise_launch(n), relu_backward_kernel, n, x, dy, dx);
}
void CudaBackend::gelu_forward(std::size_t n, const S* x, S* y) {
  cuda::detail::launch("gelu_forward", cuda::elementwise_launch(n), gelu_forward_kernel, n, x, y);
}
void CudaBackend::gelu_backward(std::size_t n, const S* x, const S* dy, S* dx) {
  cuda::detail::launch("gelu_backward", cuda::elementwise_launch(n), gelu_backward_kernel, n, x, dy, dx);
}

void CudaBackend::swiglu_forward(int rows, int n, const S* h, S* y) {
  const std::size_t total = std::size_t(rows) * n;
  cuda::detail::launch("swiglu_forward", cuda::elementwise_launch(total), swiglu_forward_kernel, total, n, h, y);
}
void CudaBackend::swiglu_backward(int rows, int n, const S* h, const S* dy, S* dh) {
  const std::size_t total = std::size_t(rows) * n;
  cuda::detail::launch("swiglu_backward", cuda::elementwise_launch(total), swiglu_backward_kernel, total, n, h, dy,
                       dh);
}

void CudaBackend::geglu_forward(int rows, int n, const S* h, S* y) {
  const std::size_t total = std::size_t(rows) * n;
  cuda::detail::launch("geglu_forward", cuda::elementwise_launch(total), geglu_forward_kernel, total, n, h, y);
}
void CudaBackend::geglu_backward(int rows, int n, const S* h, const S* dy, S* dh) {
  const std::size_t total = std::size_t(rows) * n;
  cuda::detail::launch("geglu_backward", cuda::elementwise_launch(total), geglu_backward_kernel, total, n, h, dy,
                       dh);
}

}  // namespace xfmr
