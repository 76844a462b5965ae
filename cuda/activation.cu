// activation.cu: ReLU, GELU (tanh form), SwiGLU and GeGLU, forward and backward.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

// ReLU and GELU: W elements a thread at a time (common.cuh's with_pack_width).
template <class A, int W>
__global__ void relu_forward_kernel(std::size_t n, const A* x, A* y) {
  for (std::size_t i = first_index() * W; i < n; i += grid_stride() * W) {
    float v[W];
    load<W>(x + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = v[k] > 0.0f ? v[k] : 0.0f;
    store<W>(y + i, v);
  }
}
template <class A, int W>
__global__ void relu_backward_kernel(std::size_t n, const A* x, const A* dy, A* dx) {
  for (std::size_t i = first_index() * W; i < n; i += grid_stride() * W) {
    float v[W], d[W];
    load<W>(x + i, v);
    load<W>(dy + i, d);
#pragma unroll
    for (int k = 0; k < W; ++k) d[k] = v[k] > 0.0f ? d[k] : 0.0f;
    store<W>(dx + i, d);
  }
}
__device__ inline float gelu_of(float v) { return 0.5f * v * (1.0f + tanhf(kGeluC * (v + 0.044715f * v * v * v))); }
// 1 - tanh(u)^2 as 4 e / (1 + e)^2 with e = exp(-2|u|), as on the CPU: from
// t itself it cancels as t nears +-1 (x < -4), where the derivative is 1e-5
// or less.
__device__ inline float gelu_slope(float v) {
  const float u = kGeluC * (v + 0.044715f * v * v * v);
  const float t = tanhf(u), e = expf(-2.0f * fabsf(u));
  const float sech2 = 4.0f * e / ((1.0f + e) * (1.0f + e));
  return 0.5f * (1.0f + t) + 0.5f * v * sech2 * (kGeluC * (1.0f + 3.0f * 0.044715f * v * v));
}
template <class A, int W>
__global__ void gelu_forward_kernel(std::size_t n, const A* x, A* y) {
  for (std::size_t i = first_index() * W; i < n; i += grid_stride() * W) {
    float v[W];
    load<W>(x + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = gelu_of(v[k]);
    store<W>(y + i, v);
  }
}
template <class A, int W>
__global__ void gelu_backward_kernel(std::size_t n, const A* x, const A* dy, A* dx) {
  for (std::size_t i = first_index() * W; i < n; i += grid_stride() * W) {
    float v[W], d[W];
    load<W>(x + i, v);
    load<W>(dy + i, d);
#pragma unroll
    for (int k = 0; k < W; ++k) d[k] *= gelu_slope(v[k]);
    store<W>(dx + i, d);
  }
}
// SwiGLU over rows of [gate | up] (h: rows x 2n), one thread per output.
template <class A>
__global__ void swiglu_forward_kernel(std::size_t total, int n, const A* h, A* y) {
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const std::size_t r = i / n, j = i % n;
    const float g = to_float(h[2 * r * n + j]), u = to_float(h[2 * r * n + n + j]);
    y[i] = from_float<A>(g / (1.0f + expf(-g)) * u);
  }
}
template <class A>
__global__ void swiglu_backward_kernel(std::size_t total, int n, const A* h, const A* dy, A* dh) {
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const std::size_t r = i / n, j = i % n;
    const float g = to_float(h[2 * r * n + j]), u = to_float(h[2 * r * n + n + j]);
    const float s = 1.0f / (1.0f + expf(-g));
    const float d = to_float(dy[i]);
    dh[2 * r * n + j] = from_float<A>(d * u * s * (1.0f + g * (1.0f - s)));
    dh[2 * r * n + n + j] = from_float<A>(d * g * s);
  }
}
// GeGLU over rows of [gate | up]: gelu(g) u, GELU's tanh form; backward as
// gelu_backward_kernel's derivative (1 - tanh^2 through exp(-2|u|)).
template <class A>
__global__ void geglu_forward_kernel(std::size_t total, int n, const A* h, A* y) {
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const std::size_t r = i / n, j = i % n;
    y[i] = from_float<A>(gelu_of(to_float(h[2 * r * n + j])) * to_float(h[2 * r * n + n + j]));
  }
}
template <class A>
__global__ void geglu_backward_kernel(std::size_t total, int n, const A* h, const A* dy, A* dh) {
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const std::size_t r = i / n, j = i % n;
    const float g = to_float(h[2 * r * n + j]), u = to_float(h[2 * r * n + n + j]);
    const float d = to_float(dy[i]);
    dh[2 * r * n + j] = from_float<A>(d * u * gelu_slope(g));
    dh[2 * r * n + n + j] = from_float<A>(d * gelu_of(g));
  }
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::relu_forward(std::size_t n, const A* x, A* y) {
  with_pack_width<A>(
      n,
      [&](auto w) {
        launch("relu_forward", cuda::elementwise_launch(n / w), relu_forward_kernel<A, w()>, n, x, y);
      },
      x, y);
}
template <class A>
void BasicCudaBackend<A>::relu_backward(std::size_t n, const A* x, const A* dy, A* dx) {
  with_pack_width<A>(
      n,
      [&](auto w) {
        launch("relu_backward", cuda::elementwise_launch(n / w), relu_backward_kernel<A, w()>, n, x, dy, dx);
      },
      x, dy, dx);
}
template <class A>
void BasicCudaBackend<A>::gelu_forward(std::size_t n, const A* x, A* y) {
  with_pack_width<A>(
      n,
      [&](auto w) {
        launch("gelu_forward", cuda::elementwise_launch(n / w), gelu_forward_kernel<A, w()>, n, x, y);
      },
      x, y);
}
template <class A>
void BasicCudaBackend<A>::gelu_backward(std::size_t n, const A* x, const A* dy, A* dx) {
  with_pack_width<A>(
      n,
      [&](auto w) {
        launch("gelu_backward", cuda::elementwise_launch(n / w), gelu_backward_kernel<A, w()>, n, x, dy, dx);
      },
      x, dy, dx);
}

template <class A>
void BasicCudaBackend<A>::swiglu_forward(int rows, int n, const A* h, A* y) {
  const std::size_t total = std::size_t(rows) * n;
  launch("swiglu_forward", cuda::elementwise_launch(total), swiglu_forward_kernel<A>, total, n, h, y);
}
template <class A>
void BasicCudaBackend<A>::swiglu_backward(int rows, int n, const A* h, const A* dy, A* dh) {
  const std::size_t total = std::size_t(rows) * n;
  launch("swiglu_backward", cuda::elementwise_launch(total), swiglu_backward_kernel<A>, total, n, h, dy, dh);
}

template <class A>
void BasicCudaBackend<A>::geglu_forward(int rows, int n, const A* h, A* y) {
  const std::size_t total = std::size_t(rows) * n;
  launch("geglu_forward", cuda::elementwise_launch(total), geglu_forward_kernel<A>, total, n, h, y);
}
template <class A>
void BasicCudaBackend<A>::geglu_backward(int rows, int n, const A* h, const A* dy, A* dh) {
  const std::size_t total = std::size_t(rows) * n;
  launch("geglu_backward", cuda::elementwise_launch(total), geglu_backward_kernel<A>, total, n, h, dy, dh);
}

#define XFMR_INSTANTIATE(A)                                                                  \
  template void BasicCudaBackend<A>::relu_forward(std::size_t, const A*, A*);              \
  template void BasicCudaBackend<A>::relu_backward(std::size_t, const A*, const A*, A*);   \
  template void BasicCudaBackend<A>::gelu_forward(std::size_t, const A*, A*);              \
  template void BasicCudaBackend<A>::gelu_backward(std::size_t, const A*, const A*, A*);   \
  template void BasicCudaBackend<A>::swiglu_forward(int, int, const A*, A*);               \
  template void BasicCudaBackend<A>::swiglu_backward(int, int, const A*, const A*, A*);    \
  template void BasicCudaBackend<A>::geglu_forward(int, int, const A*, A*);                \
  template void BasicCudaBackend<A>::geglu_backward(int, int, const A*, const A*, A*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
