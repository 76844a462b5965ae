// losses.cu: softmax cross-entropy with label smoothing, one block per row:
// forward (probabilities kept) and backward, and the two fused (the output
// head's classifier in training: two reads of each row and one write of its
// gradient, no probabilities). Targets are host memory: checked there,
// counted there, uploaded. The per-row losses come back to the host and are
// summed in row order in double, as on the CPU.
#include <cmath>

#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

constexpr unsigned kLossThreads = 256;

template <class A>
__global__ void cross_entropy_forward_kernel(int rows, int V, const A* logits, const std::int32_t* targets,
                                             int ignore_index, float smoothing, float* probs, double* row_loss) {
  __shared__ float shared[32];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const A* z = logits + std::size_t(r) * V;
    float* p = probs + std::size_t(r) * V;
    float mx = -INFINITY, zsum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float x = to_float(z[j]);
      mx = fmaxf(mx, x);
      zsum += x;
    }
    mx = block_max(mx, shared);
    zsum = block_sum(zsum, shared);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float e = expf(to_float(z[j]) - mx);
      p[j] = e;
      s += e;
    }
    s = block_sum(s, shared);
    const float inv = 1.0f / s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] *= inv;
    if (threadIdx.x == 0) {
      const int t = targets[r];
      row_loss[r] = t == ignore_index
                        ? 0.0
                        : double(logf(s)) + double(mx) - (1.0 - double(smoothing)) * double(to_float(z[t])) -
                              double(smoothing) * double(zsum) / double(V);
    }
  }
}

template <class A>
__global__ void cross_entropy_backward_kernel(int rows, int V, const float* probs, const std::int32_t* targets,
                                              int ignore_index, float scale, float smoothing, A* dlogits) {
  const std::size_t total = std::size_t(rows) * V;
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const int r = int(i / V), j = int(i % V), t = targets[r];
    if (t == ignore_index) {
      dlogits[i] = from_float<A>(0.0f);
      continue;
    }
    const float d = (probs[i] - smoothing / float(V)) * scale;
    dlogits[i] = from_float<A>(j == t ? d - (1.0f - smoothing) * scale : d);
  }
}

// A running (max, sum of exp(x - max)) pair, and two of them merged.
struct SoftmaxSum {
  float max, sum;
};
__device__ inline SoftmaxSum merge(SoftmaxSum a, SoftmaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}
__device__ inline SoftmaxSum block_softmax_sum(SoftmaxSum v, SoftmaxSum* shared) {
  for (int o = 16; o > 0; o >>= 1)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.max, o), __shfl_xor_sync(0xffffffffu, v.sum, o)});
  __syncthreads();
  if (lane() == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  SoftmaxSum total = shared[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w) total = merge(total, shared[w]);
  return total;
}

// One pass for the row's max and sum of exponentials (online: a larger
// value rescales the sum so far) and the sum of its logits; then each
// gradient written where its logit was read. z[t] is read before the
// reductions' barriers, so dlogits may be logits.
template <class A>
__global__ void cross_entropy_forward_backward_kernel(int rows, int V, const A* logits, const std::int32_t* targets,
                                                      int ignore_index, float smoothing, float scale, A* dlogits,
                                                      double* row_loss) {
  __shared__ SoftmaxSum pairs[32];
  __shared__ float sums[32];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const A* z = logits + std::size_t(r) * V;
    A* d = dlogits + std::size_t(r) * V;
    const int t = targets[r];
    if (t == ignore_index) {
      for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = from_float<A>(0.0f);
      if (threadIdx.x == 0) row_loss[r] = 0.0;
      continue;
    }
    const float zt = to_float(z[t]);
    SoftmaxSum mine{-INFINITY, 0.0f};
    float zsum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float x = to_float(z[j]);
      zsum += x;
      if (x > mine.max) {
        mine.sum = mine.sum * expf(mine.max - x) + 1.0f;
        mine.max = x;
      } else if (x != -INFINITY) {  // (a -inf logit adds nothing, even to an all -inf start)
        mine.sum += expf(x - mine.max);
      }
    }
    const SoftmaxSum all = block_softmax_sum(mine, pairs);
    zsum = block_sum(zsum, sums);
    const float inv = 1.0f / all.sum, off = smoothing / float(V);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float g = (expf(to_float(z[j]) - all.max) * inv - off) * scale;
      d[j] = from_float<A>(j == t ? g - (1.0f - smoothing) * scale : g);
    }
    if (threadIdx.x == 0)
      row_loss[r] = double(logf(all.sum)) + double(all.max) - (1.0 - double(smoothing)) * double(zt) -
                    double(smoothing) * double(zsum) / double(V);
  }
}

}  // namespace

template <class A>
double BasicCudaBackend<A>::cross_entropy_forward(int rows, int V, const A* logits, const std::int32_t* targets,
                                                  int ignore_index, S* probs, S smoothing) {
  xfmr::detail::check_targets(rows, V, targets, ignore_index);
  xfmr::detail::check_label_smoothing(smoothing);
  if (rows == 0) return 0.0;
  const std::int32_t* d_targets = upload_ids(targets, std::size_t(rows));
  double* row_loss = ctx_->partial.reserve(std::size_t(rows));
  const unsigned blocks = static_cast<unsigned>(rows < 65535 ? rows : 65535);
  launch("cross_entropy_forward", cuda::Launch{blocks, kLossThreads}, cross_entropy_forward_kernel<A>, rows, V, logits,
         d_targets, ignore_index, float(smoothing), probs, row_loss);
  auto& host = ctx_->host_partial;
  host.resize(std::size_t(rows));
  cuda::download(host.data(), row_loss, host.size() * sizeof(double));
  double total = 0.0;
  int counted = 0;
  for (int r = 0; r < rows; ++r) {
    total += host[r];
    counted += targets[r] != ignore_index;
  }
  return counted ? total / counted : 0.0;
}

template <class A>
void BasicCudaBackend<A>::cross_entropy_backward(int rows, int V, const S* probs, const std::int32_t* targets,
                                                 int ignore_index, S dloss, A* dlogits, S smoothing) {
  int counted = 0;
  for (int r = 0; r < rows; ++r) counted += targets[r] != ignore_index;
  const S scale = counted ? dloss / S(counted) : S(0);
  const std::int32_t* d_targets = upload_ids(targets, std::size_t(rows));
  launch("cross_entropy_backward", cuda::elementwise_launch(std::size_t(rows) * V), cross_entropy_backward_kernel<A>,
         rows, V, probs, d_targets, ignore_index, float(scale), float(smoothing), dlogits);
}

template <class A>
double BasicCudaBackend<A>::cross_entropy_forward_backward(int rows, int V, const A* logits,
                                                           const std::int32_t* targets, int ignore_index, S dloss,
                                                           A* dlogits, S smoothing) {
  if (!opts_.fused_loss) {  // until the fused kernel has run on a GPU
    float* probs = ctx_->loss_probs.reserve(std::size_t(rows) * V);
    const double loss = cross_entropy_forward(rows, V, logits, targets, ignore_index, probs, smoothing);
    cross_entropy_backward(rows, V, probs, targets, ignore_index, dloss, dlogits, smoothing);
    return loss;
  }
  xfmr::detail::check_targets(rows, V, targets, ignore_index);
  xfmr::detail::check_label_smoothing(smoothing);
  if (rows == 0) return 0.0;
  int counted = 0;
  for (int r = 0; r < rows; ++r) counted += targets[r] != ignore_index;
  const S scale = counted ? dloss / S(counted) : S(0);
  const std::int32_t* d_targets = upload_ids(targets, std::size_t(rows));
  double* row_loss = ctx_->partial.reserve(std::size_t(rows));
  const unsigned blocks = static_cast<unsigned>(rows < 65535 ? rows : 65535);
  launch("cross_entropy_forward_backward", cuda::Launch{blocks, kLossThreads}, cross_entropy_forward_backward_kernel<A>,
         rows, V, logits, d_targets, ignore_index, float(smoothing), float(scale), dlogits, row_loss);
  auto& host = ctx_->host_partial;
  host.resize(std::size_t(rows));
  cuda::download(host.data(), row_loss, host.size() * sizeof(double));
  double total = 0.0;
  for (int r = 0; r < rows; ++r) total += host[r];
  return counted ? total / counted : 0.0;
}

#define XFMR_INSTANTIATE(A)                                                                                           \
  template double BasicCudaBackend<A>::cross_entropy_forward(int, int, const A*, const std::int32_t*, int, float*,   \
                                                             float);                                                 \
  template void BasicCudaBackend<A>::cross_entropy_backward(int, int, const float*, const std::int32_t*, int, float, \
                                                            A*, float);                                              \
  template double BasicCudaBackend<A>::cross_entropy_forward_backward(int, int, const A*, const std::int32_t*, int,  \
                                                                      float, A*, float);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
