// attention.hpp: the CPU's scaled dot-product attention (layers/attention.hpp;
// CUDA: cuda/attention.cu), on the path attention_plan.hpp picks.
//
//  attention_kernels() -> AttentionKernels      what plan_attention weighs: cpu_attention_kernels()
//  attention_forward(dims, q, ldq, k, ldk, v, ldv, y, ldy, probs, mask)
//      per (b, h): probs = softmax(mask(Q K^T / sqrt(QK_DIM))); Y = probs V
//      (Y = dropped(probs) V under dims.dropout; probs saved undropped);
//      rows or heads path (attention_rows.hpp, attention_heads.hpp)
//  attention_backward(dims, dy, ldy, q, ldq, k, ldk, v, ldv, probs, dq, dk, dv)
//      dq, dk, dv assigned (they may be interleaved slices of one buffer);
//      dims as given to the forward (the same dropout key)
//  flash_attention_forward(dims, q, ldq, k, ldk, v, ldv, y, ldy, lse, mask)
//      the tiled path (attention_tiled.hpp): attention_forward's y without its
//      probabilities; lse (B, H, Tq) assigned, each query row's log of its
//      softmax sum (-inf: no key visible)
//  flash_attention_backward(dims, dy, ldy, y, ldo, q, ldq, k, ldk, v, ldv, lse, mask, dq, dk, dv)
//      attention_backward's gradients from y and lse of that forward (the
//      probabilities recomputed tile by tile); the same mask
//  attention_scratch_bytes()                   the per-thread tiles these hold, the most any call asked for
// Keys and values of sequence b start at row b * dims.kv_rows() (a KV cache);
// the backward needs them unstrided. In bf16 precision every product of the
// heads and tiled paths multiplies bfloat16-rounded operands, summing in
// float32; the rows path stays float32.
#pragma once

#include <type_traits>

#include "xfmr/backend/attention_plan.hpp"
#include "xfmr/backend/checks.hpp"
#include "xfmr/backend/cpu/attention_heads.hpp"
#include "xfmr/backend/cpu/attention_tiled.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr::detail {

template <class S>
class CpuAttention {
 public:
  explicit CpuAttention(const CpuOptions& opts = {}) : bf16_(opts.bf16 && std::is_same_v<S, float>) {}

  AttentionKernels attention_kernels() const { return cpu_attention_kernels(); }
  void attention_forward(const AttentionDims& a, const S* q, int ldq, const S* k, int ldk, const S* v, int ldv, S* y,
                         int ldy, S* probs, const AttentionMask& mask) {
    check_forward(a);
    cpu_ops<S>().attention_forward(a, q, ldq, k, ldk, v, ldv, y, ldy, probs, mask, rows_path(a),
                                   tiles(attention_forward_tiles(a)), bf16_);
  }
  void attention_backward(const AttentionDims& a, const S* dy, int ldy, const S* q, int ldq, const S* k, int ldk,
                          const S* v, int ldv, const S* probs, S* dq, S* dk, S* dv) {
    check_backward(a);
    cpu_ops<S>().attention_backward(a, dy, ldy, q, ldq, k, ldk, v, ldv, probs, dq, dk, dv, rows_path(a),
                                    tiles(attention_backward_tiles(a)), bf16_);
  }
  void flash_attention_forward(const AttentionDims& a, const S* q, int ldq, const S* k, int ldk, const S* v, int ldv,
                               S* y, int ldy, S* lse, const AttentionMask& mask) {
    check_forward(a);
    cpu_ops<S>().flash_attention_forward(a, q, ldq, k, ldk, v, ldv, y, ldy, lse, mask,
                                         tiles(flash_forward_tiles(bf16_)), bf16_);
  }
  void flash_attention_backward(const AttentionDims& a, const S* dy, int ldy, const S* y, int ldo, const S* q, int ldq,
                                const S* k, int ldk, const S* v, int ldv, const S* lse, const AttentionMask& mask,
                                S* dq, S* dk, S* dv) {
    check_backward(a);
    cpu_ops<S>().flash_attention_backward(a, dy, ldy, y, ldo, q, ldq, k, ldk, v, ldv, lse, mask, dq, dk, dv,
                                          tiles(flash_backward_tiles(bf16_)), bf16_);
  }
  std::size_t attention_scratch_bytes() const { return scratch_.size() * sizeof(S); }

 private:
  // The operations take their dimensions as checked here.
  static void check_forward(const AttentionDims& a) {
    check_dropout_rate(a.dropout);
    check_kv_heads(a);
  }
  static void check_backward(const AttentionDims& a) {
    check_unstrided_keys(a);
    check_forward(a);
  }
  // per_thread elements for each thread of a parallel region (none:
  // nullptr). Grows only, so steps of one shape allocate nothing.
  S* tiles(long per_thread);
  // The materialised forward's and backward's path: rows or heads.
  static bool rows_path(const AttentionDims& a) {
    return plan_attention(a, AttentionUse::probabilities, cpu_attention_kernels()) == AttentionPath::rows;
  }

  bool bf16_;
  AlignedVector<S> scratch_;  // per-thread tiles (tiles()); grows only
};

template <class S>
S* CpuAttention<S>::tiles(long per_thread) {
  if (per_thread == 0) return nullptr;
  const auto n = static_cast<std::size_t>(thread_count() * per_thread);
  if (scratch_.size() < n) scratch_.resize(n);
  return scratch_.data();
}

XFMR_CPU_FAMILY(CpuAttention);

}  // namespace xfmr::detail
