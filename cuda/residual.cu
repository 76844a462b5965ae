// residual.cu: the elementwise sums and copies of Residual and the blocks.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
}  // namespace

template <class A>
void BasicCudaBackend<A>::add(std::size_t n, const A* a, const A* b, A* y) {
  map_elements<Sum>("add", n, a, b, y);  // y may be a or b
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
