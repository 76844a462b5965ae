// positional.cu: adding learned or sinusoidal position rows, and the table's
// gradient.
#include "common.cuh"

namespace xfmr {

namespace {
using cuda::detail::first_index;
using cuda::detail::grid_stride;

// y[b,t,:] = x[b,t,:] + table[t,:]
__global__ void add_positions_kernel(int B, int T, int D, const float* x, const float* table, float* y) {
  const std::size_t total = std::size_t(B) * T * D;
  for (std::size_t i = first_index(); i < total; i += grid_stride()) y[i] = x[i] + table[i % (std::size_t(T) * D)];
}
// dtable[t,d] += sum over b of dy[b,t,d], b in order.
__global__ void add_positions_backward_kernel(int B, int T, int D, const float* dy, float* dtable) {
  const std::size_t td = std::size_t(T) * D;
  for (std::size_t i = first_index(); i < td; i += grid_stride()) {
    float s = 0.0f;
    for (int b = 0; b < B; ++b) s += dy[std::size_t(b) * td + i];
    dtable[i] += s;
  }
}
}  // namespace

void CudaBackend::add_positions_forward(int B, int T, int D, const S* x, const S* table, S* y) {
  cuda::detail::launch("add_positions_forward", cuda::elementwise_launch(std::size_t(B) * T * D),
                       add_positions_kernel, B, T, D, x, table, y);
}
void CudaBackend::add_positions_backward(int B, int T, int D, const S* dy, S* dtable) {
  cuda::detail::launch("add_positions_backward", cuda::elementwise_launch(std::size_t(T) * D),
                       add_positions_backward_kernel, B, T, D, dy, dtable);
}

}  // namespace xfmr
