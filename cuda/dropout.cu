// dropout.cu: inverted dropout with the counter-based draw of rng.hpp, so a
// mask depends only on (key, element index): the same bits as the CPU
// backend's, whatever the launch shape.
#include "common.cuh"
#include "xfmr/core/rng.hpp"

namespace xfmr {

namespace {
using cuda::detail::first_index;
using cuda::detail::grid_stride;

// The key is read from device memory, so that a graph step replays with the
// step's fresh keys.
__global__ void dropout_forward_kernel(std::size_t n, float p, float scale, const std::uint64_t* key_in,
                                       const float* x, float* y, std::uint8_t* keep) {
  const std::uint64_t key = *key_in;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const bool k = dropout_keeps(key, static_cast<std::uint64_t>(i), p);
    keep[i] = k ? 1 : 0;
    y[i] = k ? x[i] * scale : 0.0f;
  }
}
__global__ void dropout_backward_kernel(std::size_t n, float scale, const std::uint8_t* keep, const float* dy,
                                        float* dx) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
}
}  // namespace

void CudaBackend::dropout_forward(std::size_t n, float p, std::uint64_t key, const S* x, S* y, std::uint8_t* keep) {
  xfmr::detail::check_dropout_rate(p);
  if (n == 0) return;
  cuda::detail::launch("dropout_forward", cuda::elementwise_launch(n), dropout_forward_kernel, n, p,
                       1.0f / (1.0f - p), dropout_key(key), x, y, keep);
}

// The key in device memory for the launch queued next (uploads and launches
// are queued in order, so each launch reads its own key).
const std::uint64_t* CudaBackend::dropout_key(std::uint64_t key) {
  std::uint64_t* d_key = ctx_->keys.reserve(1);
  ctx_->staging.upload(d_key, &key, sizeof key);
  return d_key;
}
void CudaBackend::dropout_backward(std::size_t n, float p, const std::uint8_t* keep, const S* dy, S* dx) {
  cuda::detail::launch("dropout_backward", cuda::elementwise_launch(n), dropout_backward_kernel, n, 1.0f / (1.0f - p),
                       keep, dy, dx);
}

}  // namespace xfmr
