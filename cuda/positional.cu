// positional.cu: adding learned or sinusoidal position rows, and the table's
// gradient; rotary positions (turning pairs of query and key columns).
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
// One thread per (row, head, pair): the pair turned by its angle (sign -1:
// back), in place.
__global__ void rope_kernel(int B, int T, int offset, int H, int hd, const float* table, float* x, int ld,
                            float sign) {
  const int pairs = hd / 2;
  const std::size_t total = std::size_t(B) * T * H * pairs;
  for (std::size_t k = first_index(); k < total; k += grid_stride()) {
    const std::size_t r = k / (std::size_t(H) * pairs);
    const int h = int(k / pairs % H), i = 2 * int(k % pairs);
    const float* cs = table + std::size_t(offset + int(r % T)) * hd;
    const float c = cs[i], s = sign * cs[i + 1];
    float* v = x + r * ld + std::size_t(h) * hd;
    const float x0 = v[i], x1 = v[i + 1];
    v[i] = x0 * c - x1 * s;
    v[i + 1] = x0 * s + x1 * c;
  }
}
}  // namespace

void CudaBackend::rope_forward(int B, int T, int offset, int H, int hd, const S* table, S* x, int ld) {
  cuda::detail::launch("rope_forward", cuda::elementwise_launch(std::size_t(B) * T * H * (hd / 2)), rope_kernel, B,
                       T, offset, H, hd, table, x, ld, 1.0f);
}
void CudaBackend::rope_backward(int B, int T, int offset, int H, int hd, const S* table, S* dx, int ld) {
  cuda::detail::launch("rope_backward", cuda::elementwise_launch(std::size_t(B) * T * H * (hd / 2)), rope_kernel, B,
                       T, offset, H, hd, table, dx, ld, -1.0f);
}

void CudaBackend::add_positions_forward(int B, int T, int D, const S* x, const S* table, S* y) {
  cuda::detail::launch("add_positions_forward", cuda::elementwise_launch(std::size_t(B) * T * D),
                       add_positions_kernel, B, T, D, x, table, y);
}
void CudaBackend::add_positions_backward(int B, int T, int D, const S* dy, S* dtable) {
  cuda::detail::launch("add_positions_backward", cuda::elementwise_launch(std::size_t(T) * D),
                       add_positions_backward_kernel, B, T, D, dy, dtable);
}

}  // namespace xfmr
