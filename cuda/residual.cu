// residual.cu: the elementwise sums and copies of Residual and the blocks.
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

template <class A>
__global__ void add_kernel(std::size_t n, const A* a, const A* b, A* y) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) y[i] = from_float<A>(to_float(a[i]) + to_float(b[i]));
}
template <class A>
__global__ void add_to_kernel(std::size_t n, const A* x, A* y) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) y[i] = from_float<A>(to_float(y[i]) + to_float(x[i]));
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::add(std::size_t n, const A* a, const A* b, A* y) {
  launch("add", cuda::elementwise_launch(n), add_kernel<A>, n, a, b, y);
}
template <class A>
void BasicCudaBackend<A>::add_to(std::size_t n, const A* x, A* y) {
  launch("add_to", cuda::elementwise_launch(n), add_to_kernel<A>, n, x, y);
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
