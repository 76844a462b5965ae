// backend.hpp: the operations every backend provides, documented once.
//
// Layers call only these; a backend is a policy class passed by reference to
// every forward/backward. All matrices are row-major, all pointers address
// backend memory (host for CpuBackend, device for CudaBackend), and sizes are
// runtime ints. The rule for outputs, as in each layer header:
//   - "assign" outputs are overwritten (their prior contents never read);
//   - "accumulate" outputs (+=) are parameter gradients, cleared by zero_grad.
//
//  gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
//      C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C; beta == 0 never reads C.
//  bias_add(rows, n, bias, y)                y[r,:] += bias                  (accumulate)
//  bias_grad(rows, n, dy, dbias)             dbias += sum_r dy[r,:]          (accumulate)
//  add(n, a, b, y)                           y = a + b                       (assign; y may alias a or b)
//  add_to(n, x, y)                           y += x                          (accumulate)
//  copy(n, x, y)                             y = x
//  add_positions_forward(B, T, D, x, table, y)     y[b,t,:] = x[b,t,:] + table[t,:]
//  add_positions_backward(B, T, D, dy, dtable)     dtable[t,:] += sum_b dy[b,t,:]
//  rope_forward(B, T, offset, H, hd, table, x, ld)  rotary positions, in place: in row b*T + t, head h
//      (columns h*hd..), pair (2i, 2i+1) turns by the angle of position offset + t, pair i:
//      (cos, sin) = table[(offset + t) * hd + 2i, + 1]
//  rope_backward(B, T, offset, H, hd, table, dx, ld)   the transpose (turns back), in place
//  layer_norm_forward(rows, n, x, gamma, beta, eps, y, mean, rstd)   saves mean, rstd (rows)
//  layer_norm_backward(rows, n, dy, x, gamma, mean, rstd, dx, dgamma, dbeta)
//      dx assigned, dgamma/dbeta accumulated
//  rms_norm_forward(rows, n, x, gamma, eps, y, rstd)      saves rstd (rows)
//  rms_norm_backward(rows, n, dy, x, gamma, rstd, dx, dgamma)
//      dx assigned (may alias dy), dgamma accumulated
//  softmax_forward(B, H, Tq, Tk, scores, probs, mask)   masked row softmax over (B,H,Tq,Tk)
//  softmax_backward(rows, n, probs, dprobs, dscores)    dscores assigned
//  relu_forward(n, x, y), relu_backward(n, x, dy, dx)
//  gelu_forward(n, x, y), gelu_backward(n, x, dy, dx)   tanh approximation
//  swiglu_forward(rows, n, h, y)             y[r,j] = silu(h[r,j]) h[r,n+j]; h (rows, 2n) = [gate | up]
//  swiglu_backward(rows, n, h, dy, dh)       dh (rows, 2n) assigned
//  dropout_forward(n, p, key, x, y, keep)    keep[i] = dropout_keeps(key, i, p)
//  dropout_backward(n, p, keep, dy, dx)
//  embedding_forward(n, V, D, ids, table, y) checks every id in [0, V)
//  embedding_backward(n, D, ids, dy, dtable) dtable[ids[i],:] += dy[i,:]
//  mean_pool_forward(B, T, D, x, exclude, y)     y[b,:] = mean over t with !exclude[b,t]
//  mean_pool_backward(B, T, D, dy, exclude, dx)  dx assigned
//  cross_entropy_forward(rows, V, logits, targets, ignore_index, probs, smoothing) -> mean loss
//  cross_entropy_backward(rows, V, probs, targets, ignore_index, dloss, dlogits, smoothing)
//      target distribution (1 - smoothing) onehot + smoothing / V; dlogits assigned:
//      dloss * (probs - target distribution) / (number of counted rows)
//  sum_squares(n, x) -> double              in a fixed order
//  scale(n, alpha, x)                        x *= alpha
//  adamw_step(tensors, lr, beta1, beta2, eps, bc1, bc2)   every AdamWTensor
//      in one pass (one parallel region on the CPU, one launch per 32
//      tensors on a GPU); each tensor has its own weight decay
//  sgd_step(n, p, g, buf, lr, momentum, weight_decay)
//  attention_forward(dims, q, ldq, k, ldk, v, ldv, y, ldy, probs, mask)
//      per (b, h): probs = softmax(mask(Q K^T / sqrt(QK_DIM))); Y = probs V
//      (Y = dropped(probs) V under dims.dropout; probs saved undropped)
//  attention_backward(dims, dy, ldy, q, ldq, k, ldk, v, ldv, probs, dq, dk, dv)
//      dq, dk, dv assigned (they may be interleaved slices of one buffer);
//      dims as given to the forward (the same dropout key)
//  host_view(x, staging) -> span               x readable on the host (copied
//      into staging when x is device memory): logits for sampling, accuracy
//  synchronize()                             waits for queued work (timing)
//
// Optional (models test for it with a requires-expression):
//  sum_squares_each(tensors, sums)           sums[t] = sum_squares(tensors[t])
//      for a list of SquaresTensor, bit for bit, with one read by the host
//      (gradient_norm uses it where a backend has it)
//  tiled_attention(dims) -> bool             whether a training forward of these
//      dims goes through the two below (attention.hpp's layers ask)
//  flash_attention_forward(dims, q, ldq, k, ldk, v, ldv, y, ldy, lse, mask)
//      attention_forward's y without its probabilities: lse (B, H, Tq)
//      assigned, each query row's log of its softmax sum (-inf: no key visible)
//  flash_attention_backward(dims, dy, ldy, y, ldo, q, ldq, k, ldk, v, ldv, lse, mask, dq, dk, dv)
//      attention_backward's gradients from y and lse of that forward (the
//      probabilities recomputed tile by tile); the same mask
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
concept Backend = requires(Be& be, typename Be::Scalar* p, const typename Be::Scalar* cp,
                           const std::int32_t* ids, std::uint8_t* keep, const AttentionMask& mask,
                           AttentionDims dims, int i, std::size_t n, typename Be::Scalar s) {
  typename Be::Scalar;
  typename Be::Tensor;
  be.gemm(true, false, i, i, i, s, cp, i, cp, i, s, p, i);
  be.bias_add(i, i, cp, p);
  be.bias_grad(i, i, cp, p);
  be.add(n, cp, cp, p);
  be.add_to(n, cp, p);
  be.copy(n, cp, p);
  be.add_positions_forward(i, i, i, cp, cp, p);
  be.add_positions_backward(i, i, i, cp, p);
  be.rope_forward(i, i, i, i, i, cp, p, i);
  be.rope_backward(i, i, i, i, i, cp, p, i);
  be.layer_norm_forward(i, i, cp, cp, cp, s, p, p, p);
  be.layer_norm_backward(i, i, cp, cp, cp, cp, cp, p, p, p);
  be.rms_norm_forward(i, i, cp, cp, s, p, p);
  be.rms_norm_backward(i, i, cp, cp, cp, cp, p, p);
  be.softmax_forward(i, i, i, i, cp, p, mask);
  be.softmax_backward(i, i, cp, cp, p);
  be.relu_forward(n, cp, p);
  be.relu_backward(n, cp, cp, p);
  be.gelu_forward(n, cp, p);
  be.gelu_backward(n, cp, cp, p);
  be.swiglu_forward(i, i, cp, p);
  be.swiglu_backward(i, i, cp, cp, p);
  be.dropout_forward(n, 0.1f, std::uint64_t{1}, cp, p, keep);
  be.dropout_backward(n, 0.1f, keep, cp, p);
  be.embedding_forward(i, i, i, ids, cp, p);
  be.embedding_backward(i, i, ids, cp, p);
  be.mean_pool_forward(i, i, i, cp, keep, p);
  be.mean_pool_backward(i, i, i, cp, keep, p);
  { be.cross_entropy_forward(i, i, cp, ids, i, p, s) } -> std::convertible_to<double>;
  be.cross_entropy_backward(i, i, cp, ids, i, s, p, s);
  { be.sum_squares(n, cp) } -> std::convertible_to<double>;
  be.scale(n, s, p);
  be.adamw_step(std::span<const AdamWTensor<typename Be::Scalar>>(), s, s, s, s, s, s);
  be.sgd_step(n, p, cp, p, s, s, s);
  be.attention_forward(dims, cp, i, cp, i, cp, i, p, i, p, mask);
  be.attention_backward(dims, cp, i, cp, i, cp, i, cp, i, cp, p, p, p);
  be.synchronize();
  { be.host_view(std::span<const typename Be::Scalar>(), std::declval<std::vector<typename Be::Scalar>&>()) }
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
