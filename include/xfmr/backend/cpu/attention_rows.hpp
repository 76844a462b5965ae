// attention_rows.hpp: CpuBackend's per-row attention kernels: the masked
// softmax of one score row, its backward, and one query row attending to its
// visible keys with its backward (the rows path of attention_plan.hpp:
// decoding steps and sequences of up to kCpuRowQueries), and attention
// dropout on a tile of probabilities. Serial; the backend threads over
// (sequence, head).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "xfmr/backend/backend.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/backend/cpu/row_references.hpp"
#include "xfmr/core/mask.hpp"
#include "xfmr/core/rng.hpp"

namespace xfmr::detail {
inline namespace XFMR_CPU_OPS_NS {

template <class S>
using RowVector = Eigen::Matrix<S, 1, Eigen::Dynamic>;

// Keys [0, n) that the causal part of the mask leaves to query row i.
inline int visible_keys(const AttentionMask& mask, int i, int Tq, int Tk) {
  return mask.causal ? std::clamp(i + Tk - Tq + 1, 0, Tk) : Tk;
}

// One row of a masked softmax; in and out may alias. All-masked rows -> 0.
// Masked keys get exactly zero. In float, the kernels' level's softmax_row.
template <class S>
void masked_softmax_row(int b, int i, int Tq, int Tk, const S* in, S* out, const AttentionMask& mask) {
  const int n = visible_keys(mask, i, Tq, Tk);
  const std::uint8_t* pad = mask.key_padding ? mask.key_padding + long(b) * Tk : nullptr;
  if constexpr (std::is_same_v<S, float>) cpu_kernels().softmax_row(in, out, n, Tk, pad);
  else softmax_row_reference(in, out, n, Tk, pad);
}

// Query row i of one (sequence, head): scores against the visible keys,
// masked softmax into p (Tk), y (V_DIM) = p V. DQ and DV are the head sizes
// when known at compile time (Eigen::Dynamic otherwise): a fixed 16-wide
// dot product is one vector multiply and one horizontal sum, and in float
// the kernels' gemv_rows share one horizontal sum among 8 or 16 keys.
template <class S, int DQ, int DV>
void attend_row(int b, int i, const AttentionDims& a, S scale, const S* qi, const S* k, int ldk, const S* v, int ldv,
                S* p, S* y, const AttentionMask& mask) {
  using RowQ = Eigen::Matrix<S, 1, DQ>;
  using RowV = Eigen::Matrix<S, 1, DV>;
  const int n = visible_keys(mask, i, a.Tq, a.Tk);
  const Eigen::Map<const RowQ> query(qi, a.QK_DIM);
  if constexpr (std::is_same_v<S, float> && DQ != Eigen::Dynamic && DQ % 16 == 0) {
    cpu_kernels().gemv_rows(0, n, DQ, k, ldk, qi, p);  // the keys are the rows
    Eigen::Map<RowVector<S>>(p, n) *= scale;
  } else {
    for (int j = 0; j < n; ++j) p[j] = scale * query.dot(Eigen::Map<const RowQ>(k + long(j) * ldk, a.QK_DIM));
  }
  masked_softmax_row(b, i, a.Tq, a.Tk, p, p, mask);
  Eigen::Map<RowV> out(y, a.V_DIM);
  out.setZero();
  for (int j = 0; j < n; ++j) out += p[j] * Eigen::Map<const RowV>(v + long(j) * ldv, a.V_DIM);
}

// ds = p * (dp - <dp, p>); ds may alias dp.
template <class S>
void softmax_backward_row(int n, const S* p, const S* dp, S* ds) {
  S dot = 0;
  for (int j = 0; j < n; ++j) dot += dp[j] * p[j];
  for (int j = 0; j < n; ++j) ds[j] = p[j] * (dp[j] - dot);
}

// Backward of attend_row for query row i, given its probabilities p (Tk)
// and output gradient dyi: dS = softmax'(dY V^T), dQ_i = scale dS K, and
// dK_j += scale dS_j Q_i, dV_j += p_j dY_i for the keys it attended to.
// Keys past the last one with p_j != 0 (the causal part of the mask) add
// exact zeros, so they are skipped. ds: Tk scratch.
template <class S, int DQ, int DV>
void attend_row_backward(const AttentionDims& a, S scale, const S* dyi, const S* qi, const S* k, int ldk,
                         const S* v, int ldv, const S* p, S* ds, S* dqi, S* dk, S* dv) {
  using RowQ = Eigen::Matrix<S, 1, DQ>;
  using RowV = Eigen::Matrix<S, 1, DV>;
  int n = a.Tk;
  while (n > 0 && p[n - 1] == S(0)) --n;
  const Eigen::Map<const RowV> dy(dyi, a.V_DIM);
  for (int j = 0; j < n; ++j) ds[j] = dy.dot(Eigen::Map<const RowV>(v + long(j) * ldv, a.V_DIM));
  softmax_backward_row(n, p, ds, ds);
  const Eigen::Map<const RowQ> q(qi, a.QK_DIM);
  Eigen::Map<RowQ> dq(dqi, a.QK_DIM);
  dq.setZero();
  for (int j = 0; j < n; ++j) {
    const S g = scale * ds[j];
    dq += g * Eigen::Map<const RowQ>(k + long(j) * ldk, a.QK_DIM);
    Eigen::Map<RowQ>(dk + long(j) * ldk, a.QK_DIM) += g * q;
    Eigen::Map<RowV>(dv + long(j) * ldv, a.V_DIM) += p[j] * dy;
  }
}

// Attention dropout (AttentionDims::dropout) on n probabilities that start
// at element `first` of (B, H, Tq, Tk): out = p * keep / (1 - rate).
template <class S>
void drop_probabilities(const AttentionDims& a, long first, long n, const S* p, S* out) {
  const S scale = S(1) / (S(1) - S(a.dropout));
  for (long e = 0; e < n; ++e)
    out[e] = dropout_keeps(a.dropout_key, std::uint64_t(first + e), a.dropout) ? p[e] * scale : S(0);
}
// Its backward, in place: the gradient of the dropped probabilities becomes
// the gradient of the probabilities (times keep / (1 - rate)).
template <class S>
void undrop_gradient(const AttentionDims& a, long first, long n, S* d) {
  const S scale = S(1) / (S(1) - S(a.dropout));
  for (long e = 0; e < n; ++e)
    d[e] = dropout_keeps(a.dropout_key, std::uint64_t(first + e), a.dropout) ? d[e] * scale : S(0);
}

// Calls f with the head width as a compile-time constant: 16, 32 or 64 when
// the query/key and value heads have that width, else Eigen::Dynamic.
template <class F>
auto with_head_width(const AttentionDims& a, F&& f) {
  if (a.QK_DIM == a.V_DIM) {
    if (a.QK_DIM == 16) return f(std::integral_constant<int, 16>{});
    if (a.QK_DIM == 32) return f(std::integral_constant<int, 32>{});
    if (a.QK_DIM == 64) return f(std::integral_constant<int, 64>{});
  }
  return f(std::integral_constant<int, Eigen::Dynamic>{});
}

template <class S>
using AttendRow = void (*)(int, int, const AttentionDims&, S, const S*, const S*, int, const S*, int, S*, S*,
                           const AttentionMask&);
template <class S>
using AttendRowBackward = void (*)(const AttentionDims&, S, const S*, const S*, const S*, int, const S*, int,
                                   const S*, S*, S*, S*, S*);

// attend_row and its backward for these heads: fixed-size kernels for 16,
// 32 and 64 wide heads.
template <class S>
AttendRow<S> row_kernel(const AttentionDims& a) {
  return with_head_width(a, [](auto w) -> AttendRow<S> { return &attend_row<S, w(), w()>; });
}
template <class S>
AttendRowBackward<S> row_backward_kernel(const AttentionDims& a) {
  return with_head_width(a, [](auto w) -> AttendRowBackward<S> { return &attend_row_backward<S, w(), w()>; });
}

}  // namespace XFMR_CPU_OPS_NS
}  // namespace xfmr::detail
