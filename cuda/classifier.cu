// classifier.cu: mean pooling over the unmasked positions of each sequence.
// The exclusion mask is host memory; the per-sequence counts are computed
// there and uploaded with it.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

__device__ inline bool counted(const std::uint8_t* exclude, int b, int T, int t) {
  return !exclude || !exclude[std::size_t(b) * T + t];
}

// y[b,d] = mean over counted t of x[b,t,d] (zeros when none is counted).
template <class A>
__global__ void mean_pool_forward_kernel(int B, int T, int D, const A* x, const std::uint8_t* exclude,
                                         const std::int32_t* counts, A* y) {
  const std::size_t total = std::size_t(B) * D;
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const int b = int(i / D), d = int(i % D);
    float s = 0.0f;
    for (int t = 0; t < T; ++t)
      if (counted(exclude, b, T, t)) s += to_float(x[(std::size_t(b) * T + t) * D + d]);
    y[i] = from_float<A>(counts[b] ? s / float(counts[b]) : 0.0f);
  }
}
template <class A>
__global__ void mean_pool_backward_kernel(int B, int T, int D, const A* dy, const std::uint8_t* exclude,
                                          const std::int32_t* counts, A* dx) {
  const std::size_t total = std::size_t(B) * T * D;
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const int d = int(i % D), t = int(i / D % T), b = int(i / (std::size_t(T) * D));
    dx[i] = from_float<A>(counted(exclude, b, T, t) ? to_float(dy[std::size_t(b) * D + d]) / float(counts[b]) : 0.0f);
  }
}

// Counted positions per sequence, computed on the host and uploaded.
const std::int32_t* upload_counts(cuda::Context& ctx, int B, int T, const std::uint8_t* exclude) {
  std::vector<std::int32_t> counts(B, T);
  if (exclude)
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) counts[b] -= exclude[std::size_t(b) * T + t] != 0;
  std::int32_t* d = ctx.counts.reserve(counts.size());
  ctx.staging.upload(d, counts.data(), counts.size() * sizeof(std::int32_t));
  return d;
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::mean_pool_forward(int B, int T, int D, const A* x, const std::uint8_t* exclude, A* y) {
  const std::int32_t* d_counts = upload_counts(*ctx_, B, T, exclude);
  const std::uint8_t* d_exclude = upload_mask(exclude, std::size_t(B) * T);
  launch("mean_pool_forward", cuda::elementwise_launch(std::size_t(B) * D), mean_pool_forward_kernel<A>, B, T, D, x,
         d_exclude, d_counts, y);
}

template <class A>
void BasicCudaBackend<A>::mean_pool_backward(int B, int T, int D, const A* dy, const std::uint8_t* exclude, A* dx) {
  const std::int32_t* d_counts = upload_counts(*ctx_, B, T, exclude);
  const std::uint8_t* d_exclude = upload_mask(exclude, std::size_t(B) * T);
  launch("mean_pool_backward", cuda::elementwise_launch(std::size_t(B) * T * D), mean_pool_backward_kernel<A>, B, T,
         D, dy, d_exclude, d_counts, dx);
}

#define XFMR_INSTANTIATE(A)                                                                                        \
  template void BasicCudaBackend<A>::mean_pool_forward(int, int, int, const A*, const std::uint8_t*, A*); \
  template void BasicCudaBackend<A>::mean_pool_backward(int, int, int, const A*, const std::uint8_t*, A*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
