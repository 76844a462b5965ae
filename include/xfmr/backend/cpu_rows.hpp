// cpu_rows.hpp: CpuBackend's per-row attention kernels: the masked softmax
// of one score row, its backward, and one query row attending to its visible
// keys (the decoding path). Serial; the backend threads over rows.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <limits>

#include "xfmr/backend/backend.hpp"
#include "xfmr/core/mask.hpp"

namespace xfmr::detail {

template <class S>
using RowVector = Eigen::Matrix<S, 1, Eigen::Dynamic>;

// Keys [0, n) that the causal part of the mask leaves to query row i.
inline int visible_keys(const AttentionMask& mask, int i, int Tq, int Tk) {
  return mask.causal ? std::clamp(i + Tk - Tq + 1, 0, Tk) : Tk;
}

// One row of a masked softmax; in and out may alias. All-masked rows -> 0.
// Masked keys get exactly zero; the exponentials are Eigen's vectorised ones.
template <class S>
void masked_softmax_row(int b, int i, int Tq, int Tk, const S* in, S* out, const AttentionMask& mask) {
  const int n = visible_keys(mask, i, Tq, Tk);
  const std::uint8_t* pad = mask.key_padding ? mask.key_padding + long(b) * Tk : nullptr;
  S mx = -std::numeric_limits<S>::infinity();
  if (!pad) {
    if (n > 0) mx = Eigen::Map<const RowVector<S>>(in, n).maxCoeff();
  } else {
    for (int j = 0; j < n; ++j)
      if (!pad[j]) mx = std::max(mx, in[j]);
  }
  std::fill(out + n, out + Tk, S(0));
  if (mx == -std::numeric_limits<S>::infinity()) {
    std::fill(out, out + n, S(0));
    return;
  }
  Eigen::Map<RowVector<S>> e(out, n);
  e = (Eigen::Map<const RowVector<S>>(in, n).array() - mx).exp().matrix();
  if (pad)
    for (int j = 0; j < n; ++j)
      if (pad[j]) out[j] = S(0);
  e *= S(1) / e.sum();
}

// Query row i of one (sequence, head): scores against the visible keys,
// masked softmax into p (Tk), y (V_DIM) = p V. DQ and DV are the head sizes
// when known at compile time (Eigen::Dynamic otherwise): a fixed 16-wide
// dot product is one vector multiply and one horizontal sum.
template <class S, int DQ, int DV>
void attend_row(int b, int i, const AttentionDims& a, S scale, const S* qi, const S* k, int ldk, const S* v, int ldv,
                S* p, S* y, const AttentionMask& mask) {
  using RowQ = Eigen::Matrix<S, 1, DQ>;
  using RowV = Eigen::Matrix<S, 1, DV>;
  const int n = visible_keys(mask, i, a.Tq, a.Tk);
  const Eigen::Map<const RowQ> query(qi, a.QK_DIM);
  for (int j = 0; j < n; ++j) p[j] = scale * query.dot(Eigen::Map<const RowQ>(k + long(j) * ldk, a.QK_DIM));
  masked_softmax_row(b, i, a.Tq, a.Tk, p, p, mask);
  Eigen::Map<RowV> out(y, a.V_DIM);
  out.setZero();
  for (int j = 0; j < n; ++j) out += p[j] * Eigen::Map<const RowV>(v + long(j) * ldv, a.V_DIM);
}

template <class S>
using AttendRow = void (*)(int, int, const AttentionDims&, S, const S*, const S*, int, const S*, int, S*, S*,
                           const AttentionMask&);

// attend_row for these head sizes: fixed-size kernels for 16, 32 and 64.
template <class S>
AttendRow<S> row_kernel(const AttentionDims& a) {
  if (a.QK_DIM == a.V_DIM) {
    if (a.QK_DIM == 16) return &attend_row<S, 16, 16>;
    if (a.QK_DIM == 32) return &attend_row<S, 32, 32>;
    if (a.QK_DIM == 64) return &attend_row<S, 64, 64>;
  }
  return &attend_row<S, Eigen::Dynamic, Eigen::Dynamic>;
}

// ds = p * (dp - <dp, p>); ds may alias dp.
template <class S>
void softmax_backward_row(int n, const S* p, const S* dp, S* ds) {
  S dot = 0;
  for (int j = 0; j < n; ++j) dot += dp[j] * p[j];
  for (int j = 0; j < n; ++j) ds[j] = p[j] * (dp[j] - dot);
}

}  // namespace xfmr::detail
