// embedding.cu: token embedding gather and its gradient's scatter-add.
// Ids are host memory: checked there (CpuBackend's message), then uploaded.
#include <algorithm>
#include <vector>

#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

template <class A>
__global__ void embedding_forward_kernel(int n, int D, const std::int32_t* ids, const float* table, A* y) {
  const std::size_t total = std::size_t(n) * D;
  for (std::size_t i = first_index(); i < total; i += grid_stride())
    y[i] = from_float<A>(table[std::size_t(ids[i / D]) * D + i % D]);
}
// One block per distinct id (blockIdx.y), threads over the columns: each
// table entry adds its rows' gradients in input order, exactly as the CPU
// does, without atomics. `groups` is the host-built plan of
// embedding_backward, 3n + 2 entries whatever the ids (so that a graph step
// replays with new ids): the number of distinct ids, positions sorted by id
// (stable), then for every distinct id its value, then the offsets of its
// run of positions.
template <class A>
__global__ void embedding_backward_kernel(int n, int D, const std::int32_t* groups, const A* dy, float* dtable) {
  const int n_ids = groups[0];
  const std::int32_t* positions = groups + 1;
  const std::int32_t* id = positions + n;
  const std::int32_t* offset = id + n_ids;
  for (int g = blockIdx.y; g < n_ids; g += gridDim.y) {
    float* row = dtable + std::size_t(id[g]) * D;
    for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < D; d += gridDim.x * blockDim.x) {
      float s = row[d];
      for (int k = offset[g]; k < offset[g + 1]; ++k) s += to_float(dy[std::size_t(positions[k]) * D + d]);
      row[d] = s;
    }
  }
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::embedding_forward(int n, int V, int D, const std::int32_t* ids, const S* table, A* y) {
  xfmr::detail::check_token_ids(n, V, ids);
  const std::int32_t* d_ids = upload_ids(ids, std::size_t(n));
  launch("embedding_forward", cuda::elementwise_launch(std::size_t(n) * D), embedding_forward_kernel<A>, n, D, d_ids,
         table, y);
}

template <class A>
void BasicCudaBackend<A>::embedding_backward(int n, int D, const std::int32_t* ids, const A* dy, S* dtable) {
  if (n == 0) return;
  // Counting sort of the positions by id.
  auto& plan = ctx_->host_ids;
  const int V = *std::max_element(ids, ids + n) + 1;
  for (int i = 0; i < n; ++i) require(ids[i] >= 0, "token id ", ids[i], " at position ", i, " is negative");
  std::vector<std::int32_t> start(std::size_t(V) + 1, 0);
  for (int i = 0; i < n; ++i) ++start[std::size_t(ids[i]) + 1];
  int n_ids = 0;
  for (int v = 0; v < V; ++v) {
    n_ids += start[std::size_t(v) + 1] > 0;
    start[std::size_t(v) + 1] += start[std::size_t(v)];
  }
  plan.assign(3 * std::size_t(n) + 2, 0);
  plan[0] = n_ids;
  std::int32_t* positions = plan.data() + 1;
  std::int32_t* id = positions + n;
  std::int32_t* offset = id + n_ids;
  for (int v = 0, g = 0; v < V; ++v)
    if (start[std::size_t(v) + 1] > start[std::size_t(v)]) {
      id[g] = v;
      offset[g] = start[std::size_t(v)];
      offset[++g] = start[std::size_t(v) + 1];
    }
  for (int i = 0; i < n; ++i) positions[start[std::size_t(ids[i])]++] = i;
  const std::int32_t* groups = upload_ids(plan.data(), plan.size());
  const unsigned threads = 128;
  const dim3 grid((D + threads - 1) / threads, std::min(n, 65535));
  launch("embedding_backward", grid, dim3(threads), embedding_backward_kernel<A>, n, D, groups, dy, dtable);
}

#define XFMR_INSTANTIATE(A)                                                                                      \
  template void BasicCudaBackend<A>::embedding_forward(int, int, int, const std::int32_t*, const float*, A*); \
  template void BasicCudaBackend<A>::embedding_backward(int, int, const std::int32_t*, const A*, float*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
