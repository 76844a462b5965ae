// dropout.cu: inverted dropout with the counter-based draw of rng.hpp, so a
// mask depends only on (key, element index): the same bits as the CPU
// backend's, whatever the launch shape.
#include "common.cuh"
#include "xfmr/core/rng.hpp"

namespace xfmr {

namespace {
using namespace cuda::detail;

// The key is read from device memory, so that a graph step replays with the
// step's fresh keys.
// W elements a thread at a time (common.cuh's with_pack_width).
template <class A, int W>
__global__ void dropout_forward_kernel(std::size_t n, float p, float scale, const std::uint64_t* key_in, const A* x,
                                       A* y, std::uint8_t* keep) {
  const std::uint64_t key = *key_in;
  for (std::size_t i = first_index() * W; i < n; i += grid_stride() * W) {
    float v[W];
    load<W>(x + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const bool kept = dropout_keeps(key, static_cast<std::uint64_t>(i + k), p);
      keep[i + k] = kept ? 1 : 0;
      v[k] = kept ? v[k] * scale : 0.0f;
    }
    store<W>(y + i, v);
  }
}
template <class A, int W>
__global__ void dropout_backward_kernel(std::size_t n, float scale, const std::uint8_t* keep, const A* dy, A* dx) {
  for (std::size_t i = first_index() * W; i < n; i += grid_stride() * W) {
    float d[W];
    load<W>(dy + i, d);
#pragma unroll
    for (int k = 0; k < W; ++k) d[k] = keep[i + k] ? d[k] * scale : 0.0f;
    store<W>(dx + i, d);
  }
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::dropout_forward(std::size_t n, float p, std::uint64_t key, const A* x, A* y,
                                          std::uint8_t* keep) {
  xfmr::detail::check_dropout_rate(p);
  if (n == 0) return;
  const std::uint64_t* d_key = dropout_key(key);
  with_pack_width<A>(
      n,
      [&](auto w) {
        launch("dropout_forward", cuda::elementwise_launch(n / w), dropout_forward_kernel<A, w()>, n, p,
               1.0f / (1.0f - p), d_key, x, y, keep);
      },
      x, y);
}

// The key in device memory for the launch queued next (uploads and launches
// are queued in order, so each launch reads its own key).
template <class A>
const std::uint64_t* BasicCudaBackend<A>::dropout_key(std::uint64_t key) {
  std::uint64_t* d_key = ctx_->keys.reserve(1);
  ctx_->staging.upload(d_key, &key, sizeof key);
  return d_key;
}
template <class A>
void BasicCudaBackend<A>::dropout_backward(std::size_t n, float p, const std::uint8_t* keep, const A* dy, A* dx) {
  with_pack_width<A>(
      n,
      [&](auto w) {
        launch("dropout_backward", cuda::elementwise_launch(n / w), dropout_backward_kernel<A, w()>, n,
               1.0f / (1.0f - p), keep, dy, dx);
      },
      dy, dx);
}

#define XFMR_INSTANTIATE(A)                                                                                         \
  template void BasicCudaBackend<A>::dropout_forward(std::size_t, float, std::uint64_t, const A*, A*, std::uint8_t*); \
  template const std::uint64_t* BasicCudaBackend<A>::dropout_key(std::uint64_t);                                    \
  template void BasicCudaBackend<A>::dropout_backward(std::size_t, float, const std::uint8_t*, const A*, A*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
