// embedding.cu: token embedding gather and its gradient's scatter-add.
// Ids are host memory: checked there (CpuBackend's message), then uploaded.
#include "common.cuh"

namespace xfmr {

namespace {
using cuda::detail::first_index;
using cuda::detail::grid_stride;

__global__ void embedding_forward_kernel(int n, int D, const std::int32_t* ids, const float* table, float* y) {
  const std::size_t total = std::size_t(n) * D;
  for (std::size_t i = first_index(); i < total; i += grid_stride())
    y[i] = table[std::size_t(ids[i / D]) * D + i % D];
}
// One thread per column d, rows in input order: rows sharing an id add in
// the same order as on the CPU, without atomics, so results are repeatable.
__global__ void embedding_backward_kernel(int n, int D, const std::int32_t* ids, const float* dy, float* dtable) {
  for (std::size_t d = first_index(); d < std::size_t(D); d += grid_stride())
    for (int i = 0; i < n; ++i) dtable[std::size_t(ids[i]) * D + d] += dy[std::size_t(i) * D + d];
}
}  // namespace

void CudaBackend::embedding_forward(int n, int V, int D, const std::int32_t* ids, const S* table, S* y) {
  for (int i = 0; i < n; ++i)
    require(ids[i] >= 0 && ids[i] < V, "token id ", ids[i], " at position ", i, " out of range [0, ", V, ")");
  const std::int32_t* d_ids = upload_ids(ids, std::size_t(n));
  cuda::detail::launch("embedding_forward", cuda::elementwise_launch(std::size_t(n) * D), embedding_forward_kernel, n,
                       D, d_ids, table, y);
}

void CudaBackend::embedding_backward(int n, int D, const std::int32_t* ids, const S* dy, S* dtable) {
  const std::int32_t* d_ids = upload_ids(ids, std::size_t(n));
  cuda::detail::launch("embedding_backward", cuda::elementwise_launch(std::size_t(D)), embedding_backward_kernel, n, D,
                       d_ids, dy, dtable);
}

}  // namespace xfmr
