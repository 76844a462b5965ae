// activation.cu: ReLU, GELU (tanh form), SwiGLU and GeGLU, forward and backward.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

// ReLU and GELU, element by element (common.cuh's map_elements).
struct Relu {
  __device__ float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct ReluGrad {
  __device__ float operator()(float x, float dy) const { return x > 0.0f ? dy : 0.0f; }
};
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
struct Gelu {
  __device__ float operator()(float x) const { return gelu_of(x); }
};
struct GeluGrad {
  __device__ float operator()(float x, float dy) const { return dy * gelu_slope(x); }
};
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
// GeluGrad's derivative (1 - tanh^2 through exp(-2|u|)).
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
  map_elements<Relu>("relu_forward", n, x, y);
}
template <class A>
void BasicCudaBackend<A>::relu_backward(std::size_t n, const A* x, const A* dy, A* dx) {
  map_elements<ReluGrad>("relu_backward", n, x, dy, dx);
}
template <class A>
void BasicCudaBackend<A>::gelu_forward(std::size_t n, const A* x, A* y) {
  map_elements<Gelu>("gelu_forward", n, x, y);
}
template <class A>
void BasicCudaBackend<A>::gelu_backward(std::size_t n, const A* x, const A* dy, A* dx) {
  map_elements<GeluGrad>("gelu_backward", n, x, dy, dx);
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
