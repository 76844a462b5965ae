// optimizers.cu: the multi-tensor AdamW update and SGD, and the gradient
// utilities' sum of squares (fixed launch shape, partial sums added on the
// host in block order: repeatable) and scaling.
#include <algorithm>
#include <cmath>

#include "common.cuh"

namespace xfmr {

namespace {
using namespace cuda::detail;

constexpr unsigned kSumBlocks = 256, kSumThreads = 256;

// Up to kAdamWBatch tensors per launch, passed by value (about 1.7 KB of
// kernel parameters): block b updates kAdamWBlockValues values of the tensor
// whose block range holds b. The step's scalars come from device memory, so
// that a graph step replays with each step's learning rate and bias
// corrections.
constexpr int kAdamWBatch = 32;
constexpr unsigned kAdamWThreads = 256, kAdamWPerThread = 4, kAdamWBlockValues = kAdamWThreads * kAdamWPerThread;
struct AdamWSlot {  // AdamWTensor<float> without its tail padding
  std::size_t n;
  float* p;
  const float* g;
  float *m, *v;
  float weight_decay;
  float unused;
};
struct AdamWBatch {
  unsigned first_block[kAdamWBatch + 2];  // tensor k: blocks [first_block[k], first_block[k + 1]); even count
  AdamWSlot t[kAdamWBatch];
};
struct AdamWScalars {
  float lr, beta1, beta2, eps, step_size, rbc2;
};
}  // namespace
}  // namespace xfmr

namespace xfmr::cuda::detail {
static_assert(sizeof(AdamWSlot) == 48 && sizeof(AdamWBatch) == (kAdamWBatch + 2) * 4 + kAdamWBatch * 48);
template <>
inline constexpr bool kPaddingFree<AdamWBatch> = true;  // checked just above
}  // namespace xfmr::cuda::detail

namespace xfmr {
namespace {
__global__ void adamw_kernel(AdamWBatch batch, const AdamWScalars* scalars) {
  const float lr = scalars->lr, beta1 = scalars->beta1, beta2 = scalars->beta2, eps = scalars->eps;
  const float step_size = scalars->step_size, rbc2 = scalars->rbc2;
  int k = 0;
  while (blockIdx.x >= batch.first_block[k + 1]) ++k;
  const AdamWSlot& t = batch.t[k];
  std::size_t i = std::size_t(blockIdx.x - batch.first_block[k]) * kAdamWBlockValues + threadIdx.x;
  for (unsigned j = 0; j < kAdamWPerThread; ++j, i += kAdamWThreads) {
    if (i >= t.n) return;
    float pi = t.p[i];
    pi -= lr * t.weight_decay * pi;
    const float gi = t.g[i];
    const float mi = beta1 * t.m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * t.v[i] + (1.0f - beta2) * gi * gi;
    t.m[i] = mi;
    t.v[i] = vi;
    t.p[i] = pi - step_size * mi / (sqrtf(vi) * rbc2 + eps);
  }
}
__global__ void sgd_kernel(std::size_t n, float* p, const float* g, float* buf, float lr, float momentum,
                           float weight_decay) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float d = g[i] + weight_decay * p[i];
    const float b = momentum * buf[i] + d;
    buf[i] = b;
    p[i] -= lr * b;
  }
}
__global__ void scale_kernel(std::size_t n, float alpha, float* x) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] *= alpha;
}
// Block b of kSumBlocks adds the squares of elements b * threads + thread,
// striding by kSumBlocks * threads; partial[b] is its sum. The same for every
// tensor, so that sum_squares_each gives sum_squares's sums bit for bit.
template <class T>
__device__ double sum_squares_block(std::size_t n, const T* x, unsigned block, double* shared) {
  double s = 0.0;
  for (std::size_t i = std::size_t(block) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(kSumBlocks) * blockDim.x) {
    const double v = to_float(x[i]);
    s += v * v;
  }
  return block_sum(s, shared);
}
template <class T>
__global__ void sum_squares_kernel(std::size_t n, const T* x, double* partial) {
  __shared__ double shared[32];
  const double s = sum_squares_block(n, x, blockIdx.x, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
// Up to kSquaresBatch tensors per launch, kSumBlocks blocks each.
constexpr int kSquaresBatch = 32;
struct SquaresBatch {
  const float* x[kSquaresBatch];
  std::size_t n[kSquaresBatch];
};
__global__ void sum_squares_each_kernel(SquaresBatch batch, double* partial) {
  __shared__ double shared[32];
  const unsigned t = blockIdx.x / kSumBlocks, b = blockIdx.x % kSumBlocks;
  const double s = sum_squares_block(batch.n[t], batch.x[t], b, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// The sum of squares of n values of x (float32 or bfloat16), summed as
// sum_squares_each sums each of its tensors.
template <class T>
double sum_squares_of(cuda::Context& ctx, std::size_t n, const T* x) {
  if (n == 0) return 0.0;
  double* partial = ctx.partial.reserve(kSumBlocks);
  launch("sum_squares", cuda::Launch{kSumBlocks, kSumThreads}, sum_squares_kernel<T>, n, x, partial);
  auto& host = ctx.host_partial;
  host.resize(kSumBlocks);
  cuda::download(host.data(), partial, kSumBlocks * sizeof(double));
  double total = 0.0;
  for (double s : host) total += s;
  return total;
}
}  // namespace

template <class A>
void BasicCudaBackend<A>::adamw_step(std::span<const AdamWTensor<S>> tensors, S lr, S beta1, S beta2, S eps,
                                     S bias_correction1, S bias_correction2) {
  if (tensors.empty()) return;
  const AdamWScalars scalars{lr, beta1, beta2, eps, lr / bias_correction1, 1.0f / std::sqrt(bias_correction2)};
  float* d_scalars = ctx_->step_scalars.reserve(sizeof scalars / sizeof(float));
  ctx_->staging.upload(d_scalars, &scalars, sizeof scalars);
  for (std::size_t first = 0; first < tensors.size(); first += kAdamWBatch) {
    AdamWBatch batch{};
    const int count = int(std::min<std::size_t>(kAdamWBatch, tensors.size() - first));
    unsigned blocks = 0;
    for (int k = 0; k < count; ++k) {
      const AdamWTensor<S>& t = tensors[first + k];
      batch.t[k] = {t.n, t.p, t.g, t.m, t.v, t.weight_decay, 0.0f};
      batch.first_block[k] = blocks;
      const std::size_t need = (t.n + kAdamWBlockValues - 1) / kAdamWBlockValues;
      require(need <= 0x7fffffffu - blocks, "adamw_step: ", t.n, " values are too many for one launch");
      blocks += unsigned(need);
    }
    for (int k = count; k < kAdamWBatch + 2; ++k) batch.first_block[k] = blocks;
    launch("adamw_step", cuda::Launch{blocks, kAdamWThreads}, adamw_kernel, batch,
           reinterpret_cast<const AdamWScalars*>(static_cast<const float*>(d_scalars)));
  }
}

template <class A>
void BasicCudaBackend<A>::sgd_step(std::size_t n, S* p, const S* g, S* buf, S lr, S momentum, S weight_decay) {
  launch("sgd_step", cuda::elementwise_launch(n), sgd_kernel, n, p, g, buf, lr, momentum, weight_decay);
}

template <class A>
void BasicCudaBackend<A>::scale(std::size_t n, S alpha, S* x) {
  launch("scale", cuda::elementwise_launch(n), scale_kernel, n, alpha, x);
}

template <class A>
void BasicCudaBackend<A>::sum_squares_each(std::span<const SquaresTensor<S>> tensors, std::span<double> sums) {
  require(sums.size() == tensors.size(), "sum_squares_each: ", sums.size(), " sums for ", tensors.size(), " tensors");
  if (tensors.empty()) return;
  double* partial = ctx_->partial.reserve(tensors.size() * kSumBlocks);
  for (std::size_t first = 0; first < tensors.size(); first += kSquaresBatch) {
    SquaresBatch batch{};
    const std::size_t count = std::min<std::size_t>(kSquaresBatch, tensors.size() - first);
    for (std::size_t k = 0; k < count; ++k) batch.x[k] = tensors[first + k].x, batch.n[k] = tensors[first + k].n;
    launch("sum_squares_each", cuda::Launch{unsigned(count * kSumBlocks), kSumThreads}, sum_squares_each_kernel, batch,
           partial + first * kSumBlocks);
  }
  auto& host = ctx_->host_partial;
  host.resize(tensors.size() * kSumBlocks);
  cuda::download(host.data(), partial, host.size() * sizeof(double));
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    double total = 0.0;  // block order, as sum_squares
    for (unsigned b = 0; b < kSumBlocks; ++b) total += host[t * kSumBlocks + b];
    sums[t] = total;
  }
}

template <class A>
double BasicCudaBackend<A>::sum_squares(std::size_t n, const S* x) {
  return sum_squares_of(*ctx_, n, x);
}
template <class A>
double BasicCudaBackend<A>::sum_squares(std::size_t n, const NarrowA* x) {
  return sum_squares_of(*ctx_, n, x);
}

#define XFMR_INSTANTIATE(A)                                                                                        \
  template void BasicCudaBackend<A>::adamw_step(std::span<const AdamWTensor<float>>, float, float, float, float,  \
                                                float, float);                                                     \
  template void BasicCudaBackend<A>::sgd_step(std::size_t, float*, const float*, float*, float, float, float);    \
  template void BasicCudaBackend<A>::scale(std::size_t, float, float*);                                            \
  template void BasicCudaBackend<A>::sum_squares_each(std::span<const SquaresTensor<float>>, std::span<double>);   \
  template double BasicCudaBackend<A>::sum_squares(std::size_t, const float*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE
template double BasicCudaBackend<Bf16>::sum_squares(std::size_t, const Bf16*);

}  // namespace xfmr
