// backend.hpp: what every backend provides, and the conventions its
// operations follow.
//
// Layers call a backend's operations; a backend is a policy class passed by
// reference to every forward/backward. All matrices are row-major, all
// pointers address backend memory (host for CpuBackend, device for
// CudaBackend), and sizes are runtime ints. The rule for outputs, as in
// each layer header:
//   - "assign" outputs are overwritten (their prior contents never read);
//   - "accumulate" outputs (+=) are parameter gradients, cleared by zero_grad.
//
// The operations come in families, one for each family of layers, and each
// family's contract is written once, at the top of its CPU file, the
// reference implementation: backend/cpu/<family>.hpp (linear, residual,
// positional, layer_norm, rms_norm, activation, dropout, embedding,
// classifier, losses, optimizers, attention); CudaBackend has the same
// members (cuda.hpp), defined in cuda/<family>.cu. What every backend has
// besides, checked by the Backend concept below:
//
//  Scalar, Tensor (parameters, gradients), Buffer<T> (activations, saved state)
//  Activation          the element type of activations and their gradients
//      (Buffer<Activation>, Rows<Activation, N>, the workspace's scratch,
//      logits); Scalar is that of parameters, their gradients, saved
//      statistics (norms' means and reciprocal deviations, log-sum-exps,
//      attention probabilities) and scalar arguments. Every backend has the
//      two the same today; the layers keep them apart, so that a backend may
//      store activations narrower (bfloat16) than its float32 parameters,
//      whose Tensor's product_data() then holds the weights in the
//      activations' type for products (test/backend/activation_types.cpp
//      compiles a Decoder so, and fails on a mix-up).
//  gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)   (cpu/linear.hpp)
//  host_view(x, staging) -> span               x readable on the host (copied
//      into staging when x is device memory, widened to Scalar): logits for
//      sampling, accuracy (x of Activation); attention maps (x of Scalar)
//  synchronize()                             waits for queued work (timing)
//
// Optional (callers test for them with a requires-expression):
//  sum_squares_each(tensors, sums)           sums[t] = sum_squares(tensors[t])
//      for a list of SquaresTensor, bit for bit, with one read by the host
//      (gradient_norm uses it where a backend has it)
//  attention_kernels() -> AttentionKernels   the reach of its attention kernels
//      (attention_plan.hpp); without it, attention is never tiled
//  graph_step(key, step)                     runs step() with its device work
//      replayed as recorded graphs (CudaBackend: CUDA graphs); run_step()
//      below calls it where a backend has it, and step() directly otherwise
//
// Token ids, targets and masks (key_padding, exclude) are always host memory,
// whatever the backend: they come from the caller's batch. Dropout's `keep`
// is backend memory (a Buffer<std::uint8_t>).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "xfmr/core/mask.hpp"

namespace xfmr {

// One tensor of sum_squares_each: n values at x.
template <class S>
struct SquaresTensor {
  const S* x;
  std::size_t n;
};

// One parameter tensor of an AdamW update: n values p, their gradients g and
// first and second moments m, v (backend memory), and the tensor's decoupled
// weight decay.
template <class S>
struct AdamWTensor {
  std::size_t n;
  S* p;
  const S* g;
  S* m;
  S* v;
  S weight_decay;
};

// Sizes of one scaled dot-product attention call. Head h of a row reads
// q[row*ldq + h*QK_DIM .. +QK_DIM) and writes y[row*ldy + h*V_DIM .. +V_DIM).
// Sequence b's keys and values start at row b*KV_ROWS (KV_ROWS = 0: Tk), so
// they can live in a cache of capacity KV_ROWS of which Tk rows are filled.
// Grouped-query attention: KV_H key/value heads (0: H), each shared by
// H / KV_H consecutive query heads; k and v rows hold KV_H heads.
// Dropout on the probabilities (training): with dropout > 0 the output is
// (P * keep / (1 - dropout)) V, where element e of the (B, H, Tq, Tk)
// probabilities is kept when dropout_keeps(dropout_key, e, dropout); the
// saved probabilities stay undropped, and the backward replays the mask
// from the same key.
struct AttentionDims {
  int B = 0, H = 0, Tq = 0, Tk = 0, QK_DIM = 0, V_DIM = 0, KV_ROWS = 0, KV_H = 0;
  float dropout = 0.0f;
  std::uint64_t dropout_key = 0;
  int kv_rows() const { return KV_ROWS ? KV_ROWS : Tk; }
  int kv_heads() const { return KV_H ? KV_H : H; }
  int kv_head(int h) const { return h / (H / kv_heads()); }  // the key/value head of query head h
};

template <class Be>
concept Backend = requires(Be& be, typename Be::Activation* p, const typename Be::Activation* cp, int i,
                           typename Be::Scalar s) {
  typename Be::Scalar;
  typename Be::Activation;
  typename Be::Tensor;
  typename Be::template Buffer<std::uint8_t>;
  be.gemm(true, false, i, i, i, s, cp, i, cp, i, s, p, i);
  be.synchronize();
  { be.host_view(std::span<const typename Be::Activation>(), std::declval<std::vector<typename Be::Scalar>&>()) }
      -> std::convertible_to<std::span<const typename Be::Scalar>>;
};

// Runs step() (host code calling `be`: a training step, say) through the
// backend's graph_step where it has one, directly otherwise. `key` names the
// kind of step, whose shape should repeat from call to call.
template <class Be, class F>
void run_step(Be& be, std::string_view key, F&& step) {
  if constexpr (requires { be.graph_step(key, step); })
    be.graph_step(key, std::forward<F>(step));
  else
    std::forward<F>(step)();
}

}  // namespace xfmr
