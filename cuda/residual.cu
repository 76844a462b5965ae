// residual.cu: the elementwise sums and copies of Residual and the blocks.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

// W elements a thread at a time (common.cuh's with_pack_width); y may be
// a or b (each element is read before it is written).
template <class A, int W>
__global__ void add_kernel(std::size_t n, const A* a, const A* b, A* y) {
  for (std::size_t i = first_index() * W; i < n; i += grid_stride() * W) {
    float x[W], z[W];
    load<W>(a + i, x);
    load<W>(b + i, z);
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] += z[k];
    store<W>(y + i, x);
  }
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::add(std::size_t n, const A* a, const A* b, A* y) {
  with_pack_width<A>(
      n, [&](auto w) { launch("add", cuda::elementwise_launch(n / w), add_kernel<A, w()>, n, a, b, y); }, a, b, y);
}
template <class A>
void BasicCudaBackend<A>::add_to(std::size_t n, const A* x, A* y) {
  add(n, y, x, y);  // y + x, in place
}
template <class A>
void BasicCudaBackend<A>::copy(std::size_t n, const A* x, A* y) {
  cuda::copy_on_device(y, x, n * sizeof(A));
}

#define XFMR_INSTANTIATE(A)                                                      \
  template void BasicCudaBackend<A>::add(std::size_t, const A*, const A*, A*); \
  template void BasicCudaBackend<A>::add_to(std::size_t, const A*, A*);        \
  template void BasicCudaBackend<A>::copy(std::size_t, const A*, A*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
