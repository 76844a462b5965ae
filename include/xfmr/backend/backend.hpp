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

// The contract of a backend, in one place: every operation the layers,
// models, losses and optimizers call, by family (each family's CPU file,
// backend/cpu/<family>.hpp, states what it computes; sizes are run-time
// ints, S is Scalar and A is Activation, pointers are the backend's
// memory except ids and masks). Assign-or-accumulate follows the names:
// *_forward and *_backward assign their outputs unless the family's
// contract says accumulate (parameter gradients, dtable, dgamma, dbias).
// CpuBackend, the CUDA backends and the tests' SplitBackend are checked
// against it where they are defined, and each model checks its backend, so
// a backend that lacks an operation fails with the requirement it misses.
// Optional, and asked for with `if constexpr (requires ...)`: the tiled
// attention pair (attention_kernels, flash_attention_forward/backward),
// sum_squares_each (the gradient norms in one host read, CUDA's) and
// graph_step (run_step below).
template <class Be>
concept Backend = requires(Be& be, const Be& cbe, typename Be::Activation* a, const typename Be::Activation* ca,
                           typename Be::Scalar* s, const typename Be::Scalar* cs, typename Be::Scalar k, int i,
                           std::size_t n, float p, std::uint64_t key, std::uint8_t* keep, const std::uint8_t* ckeep,
                           const std::int32_t* ids, const AttentionDims& dims, const AttentionMask& mask,
                           std::span<const AdamWTensor<typename Be::Scalar>> adamw,
                           std::vector<typename Be::Scalar>& staging) {
  // Types: parameters (Scalar), activations (Activation), their tensors and buffers.
  typename Be::Scalar;
  typename Be::Activation;
  typename Be::Tensor;
  typename Be::template Buffer<std::uint8_t>;
  typename Be::template Buffer<typename Be::Activation>;
  // Host access and scratch.
  be.synchronize();
  { be.host_view(std::span<const typename Be::Activation>(), staging) }
      -> std::convertible_to<std::span<const typename Be::Scalar>>;
  be.workspace().frame();
  // linear: C = alpha op(A) op(B) + beta C, into activations or (parameter gradients) parameters.
  be.gemm(true, false, i, i, i, k, ca, i, ca, i, k, a, i);
  be.gemm(true, false, i, i, i, k, ca, i, ca, i, k, s, i);
  be.bias_add(i, i, cs, a);
  be.bias_grad(i, i, ca, s);
  be.linear_forward(i, i, i, ca, ca, cs, a);
  be.linear_gelu_forward(i, i, i, ca, ca, cs, a, a);
  be.linear_dgelu_input_grad(i, i, i, ca, ca, ca, a);
  // residual
  be.add(n, ca, ca, a);
  be.add_to(n, ca, a);
  be.copy(n, ca, a);
  // positional
  be.add_positions_forward(i, i, i, ca, cs, a);
  be.add_positions_backward(i, i, i, ca, s);
  be.rope_forward(i, i, i, i, i, cs, a, i);
  be.rope_backward(i, i, i, i, i, cs, a, i);
  // layer_norm, rms_norm
  be.layer_norm_forward(i, i, ca, cs, cs, k, a, s, s);
  be.layer_norm_backward(i, i, ca, ca, cs, cs, cs, a, s, s);
  be.rms_norm_forward(i, i, ca, cs, k, a, s);
  be.rms_norm_backward(i, i, ca, ca, cs, cs, a, s);
  // activation
  be.relu_forward(n, ca, a);
  be.relu_backward(n, ca, ca, a);
  be.gelu_forward(n, ca, a);
  be.gelu_backward(n, ca, ca, a);
  be.swiglu_forward(i, i, ca, a);
  be.swiglu_backward(i, i, ca, ca, a);
  be.geglu_forward(i, i, ca, a);
  be.geglu_backward(i, i, ca, ca, a);
  // dropout
  be.dropout_forward(n, p, key, ca, a, keep);
  be.dropout_backward(n, p, ckeep, ca, a);
  // embedding
  be.embedding_forward(i, i, i, ids, cs, a);
  be.embedding_backward(i, i, ids, ca, s);
  // classifier (pooling)
  be.mean_pool_forward(i, i, i, ca, ckeep, a);
  be.mean_pool_backward(i, i, i, ca, ckeep, a);
  // losses
  { be.cross_entropy_forward(i, i, ca, ids, i, s, k) } -> std::convertible_to<double>;
  be.cross_entropy_backward(i, i, cs, ids, i, k, a, k);
  { be.cross_entropy_forward_backward(i, i, ca, ids, i, k, a, k) } -> std::convertible_to<double>;
  // optimizers
  { be.sum_squares(n, cs) } -> std::convertible_to<double>;
  { be.sum_squares(n, ca) } -> std::convertible_to<double>;
  be.scale(n, k, s);
  be.adamw_step(adamw, k, k, k, k, k, k);
  be.sgd_step(n, s, cs, s, k, k, k);
  // attention (materialised probabilities in Scalar)
  be.attention_forward(dims, ca, i, ca, i, ca, i, a, i, s, mask);
  be.attention_backward(dims, ca, i, ca, i, ca, i, ca, i, cs, a, a, a);
  (void)cbe;
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
