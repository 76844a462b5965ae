// row_references.hpp: the row kernels of cpu/kernels.hpp written in Eigen,
// for any scalar: the double backend's single rows and softmax rows, and the
// float ones of the portable level (src/kernels/portable.cpp).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <limits>

#include "xfmr/backend/cpu/family.hpp"

namespace xfmr::detail {
inline namespace XFMR_CPU_OPS_NS {

// Rows [n0, n1) of y = W x, W (N, K) row-major with leading dimension ldw:
// Eigen's row-major GEMV.
template <class S>
void gemv_rows_reference(int n0, int n1, int K, const S* W, long ldw, const S* x, S* y) {
  using Col = Eigen::Matrix<S, Eigen::Dynamic, 1>;
  using Rows = Eigen::Map<const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                          Eigen::OuterStride<>>;
  Eigen::Map<Col>(y + n0, n1 - n0).noalias() =
      Rows(W + long(n0) * ldw, n1 - n0, K, Eigen::OuterStride<>(ldw)) * Eigen::Map<const Col>(x, K);
}

// out[0, Tk) = the softmax of in[0, n) over the keys that pad (Tk bytes or
// null) leaves, zero at padded keys and from n on; all zero when no key is
// left; in and out may alias. Eigen's exponentials.
template <class S>
void softmax_row_reference(const S* in, S* out, int n, int Tk, const std::uint8_t* pad) {
  S mx = -std::numeric_limits<S>::infinity();
  using Row = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  if (!pad) {
    if (n > 0) mx = Eigen::Map<const Row>(in, n).maxCoeff();
  } else {
    for (int j = 0; j < n; ++j)
      if (!pad[j]) mx = std::max(mx, in[j]);
  }
  std::fill(out + n, out + Tk, S(0));
  if (mx == -std::numeric_limits<S>::infinity()) {
    std::fill(out, out + n, S(0));
    return;
  }
  Eigen::Map<Row> e(out, n);
  e = (Eigen::Map<const Row>(in, n).array() - mx).exp().matrix();
  if (pad)
    for (int j = 0; j < n; ++j)
      if (pad[j]) out[j] = S(0);
  e *= S(1) / e.sum();
}

}  // namespace XFMR_CPU_OPS_NS
}  // namespace xfmr::detail
