// residual.cu: the elementwise sums and copies of Residual and the blocks.
#include "common.cuh"

namespace xfmr {

namespace {
using cuda::detail::first_index;
using cuda::detail::grid_stride;

__global__ void add_kernel(std::size_t n, const float* a, const float* b, float* y) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) y[i] = a[i] + b[i];
}
__global__ void add_to_kernel(std::size_t n, const float* x, float* y) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) y[i] += x[i];
}
}  // namespace

void CudaBackend::add(std::size_t n, const S* a, const S* b, S* y) {
  cuda::detail::launch("add", cuda::elementwise_launch(n), add_kernel, n, a, b, y);
}
void CudaBackend::add_to(std::size_t n, const S* x, S* y) {
  cuda::detail::launch("add_to", cuda::elementwise_launch(n), add_to_kernel, n, x, y);
}
void CudaBackend::copy(std::size_t n, const S* x, S* y) { cuda::copy_on_device(y, x, n * sizeof(S)); }

}  // namespace xfmr
