// positional.cu: adding learned or sinusoidal position rows, and the table's
// gradient; rotary positions (turning pairs of query and key columns).
#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

// y[b,t,:] = x[b,t,:] + table[t,:]
template <class A>
__global__ void add_positions_kernel(int B, int T, int D, const A* x, const float* table, A* y) {
  const std::size_t total = std::size_t(B) * T * D;
  for (std::size_t i = first_index(); i < total; i += grid_stride())
    y[i] = from_float<A>(to_float(x[i]) + table[i % (std::size_t(T) * D)]);
}
// dtable[t,d] += sum over b of dy[b,t,d], b in order.
template <class A>
__global__ void add_positions_backward_kernel(int B, int T, int D, const A* dy, float* dtable) {
  const std::size_t td = std::size_t(T) * D;
  for (std::size_t i = first_index(); i < td; i += grid_stride()) {
    float s = 0.0f;
    for (int b = 0; b < B; ++b) s += to_float(dy[std::size_t(b) * td + i]);
    dtable[i] += s;
  }
}
// One thread per (row, head, pair): the pair turned by its angle (sign -1:
// back), in place.
template <class A>
__global__ void rope_kernel(int B, int T, int offset, int H, int hd, const float* table, A* x, int ld, float sign) {
  const int pairs = hd / 2;
  const std::size_t total = std::size_t(B) * T * H * pairs;
  for (std::size_t k = first_index(); k < total; k += grid_stride()) {
    const std::size_t r = k / (std::size_t(H) * pairs);
    const int h = int(k / pairs % H), i = 2 * int(k % pairs);
    const float* cs = table + std::size_t(offset + int(r % T)) * hd;
    const float c = cs[i], s = sign * cs[i + 1];
    A* v = x + r * ld + std::size_t(h) * hd;
    const float x0 = to_float(v[i]), x1 = to_float(v[i + 1]);
    v[i] = from_float<A>(x0 * c - x1 * s);
    v[i + 1] = from_float<A>(x0 * s + x1 * c);
  }
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::rope_forward(int B, int T, int offset, int H, int hd, const S* table, A* x, int ld) {
  launch("rope_forward", cuda::elementwise_launch(std::size_t(B) * T * H * (hd / 2)), rope_kernel<A>, B, T, offset, H,
         hd, table, x, ld, 1.0f);
}
template <class A>
void BasicCudaBackend<A>::rope_backward(int B, int T, int offset, int H, int hd, const S* table, A* dx, int ld) {
  launch("rope_backward", cuda::elementwise_launch(std::size_t(B) * T * H * (hd / 2)), rope_kernel<A>, B, T, offset,
         H, hd, table, dx, ld, -1.0f);
}

template <class A>
void BasicCudaBackend<A>::add_positions_forward(int B, int T, int D, const A* x, const S* table, A* y) {
  launch("add_positions_forward", cuda::elementwise_launch(std::size_t(B) * T * D), add_positions_kernel<A>, B, T, D,
         x, table, y);
}
template <class A>
void BasicCudaBackend<A>::add_positions_backward(int B, int T, int D, const A* dy, S* dtable) {
  launch("add_positions_backward", cuda::elementwise_launch(std::size_t(T) * D), add_positions_backward_kernel<A>, B,
         T, D, dy, dtable);
}

#define XFMR_INSTANTIATE(A)                                                                                 \
  template void BasicCudaBackend<A>::rope_forward(int, int, int, int, int, const float*, A*, int);         \
  template void BasicCudaBackend<A>::rope_backward(int, int, int, int, int, const float*, A*, int);        \
  template void BasicCudaBackend<A>::add_positions_forward(int, int, int, const A*, const float*, A*);     \
  template void BasicCudaBackend<A>::add_positions_backward(int, int, int, const A*, float*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
