// layer_norm.hpp: the CPU's layer norm (layers/layer_norm.hpp; CUDA:
// cuda/layer_norm.cu).
//
//  layer_norm_forward(rows, n, x, gamma, beta, eps, y, mean, rstd)   saves mean, rstd (rows)
//  layer_norm_backward(rows, n, dy, x, gamma, mean, rstd, dx, dgamma, dbeta)
//      dx assigned (may alias dy), dgamma/dbeta accumulated
#pragma once

#include <Eigen/Core>
#include <cmath>

#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

template <class S>
class CpuLayerNorm {
 public:
  void layer_norm_forward(int rows, int n, const S* x, const S* gamma, const S* beta, S eps, S* y, S* mean, S* rstd) {
    cpu_ops<S>().layer_norm_forward(rows, n, x, gamma, beta, eps, y, mean, rstd);
  }
  void layer_norm_backward(int rows, int n, const S* dy, const S* x, const S* gamma, const S* mean, const S* rstd,
                           S* dx, S* dgamma, S* dbeta) {
    cpu_ops<S>().layer_norm_backward(rows, n, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  }
};

inline namespace XFMR_CPU_OPS_NS {

template <class S>
void layer_norm_forward(int rows, int n, const S* x, const S* gamma, const S* beta, S eps, S* y, S* mean, S* rstd) {
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  const Eigen::Map<const Vec> g(gamma, n), bt(beta, n);
  parallel_ranges(long(rows), long(rows) * n > kLightParallelWork, [=](long lo, long hi) {
    for (int r = int(lo); r < int(hi); ++r) {
      const Eigen::Map<const Vec> xr(x + long(r) * n, n);
      const S m = xr.mean();
      const S var = (xr.array() - m).square().mean();
      const S rs = S(1) / std::sqrt(var + eps);
      Eigen::Map<Vec>(y + long(r) * n, n) = ((xr.array() - m) * rs * g.array() + bt.array()).matrix();
      mean[r] = m;
      rstd[r] = rs;
    }
  });
}

// dgamma/dbeta are reduced first, so dx may alias dy.
template <class S>
void layer_norm_backward(int rows, int n, const S* dy, const S* x, const S* gamma, const S* mean, const S* rstd, S* dx,
                         S* dgamma, S* dbeta) {
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  // Split over columns, rows added in order: the same sums on any thread count.
  parallel_ranges(long(n), long(rows) * n > kParallelWork, [=](long lo, long hi) {
    const long w = hi - lo;
    Eigen::Map<Vec> dg(dgamma + lo, w), db(dbeta + lo, w);
    for (int r = 0; r < rows; ++r) {
      const Eigen::Map<const Vec> dyr(dy + long(r) * n + lo, w);
      dg.array() += dyr.array() * (Eigen::Map<const Vec>(x + long(r) * n + lo, w).array() - mean[r]) * rstd[r];
      db += dyr;
    }
  }, 16);
  const Eigen::Map<const Vec> g(gamma, n);
  parallel_ranges(long(rows), long(rows) * n > kParallelWork, [=](long lo, long hi) {
    for (int r = int(lo); r < int(hi); ++r) {
      const auto xhat = (Eigen::Map<const Vec>(x + long(r) * n, n).array() - mean[r]) * rstd[r];
      const auto dxhat = Eigen::Map<const Vec>(dy + long(r) * n, n).array() * g.array();
      const S mean_dxhat = dxhat.mean();
      const S mean_dxhat_xhat = (dxhat * xhat).mean();
      Eigen::Map<Vec>(dx + long(r) * n, n) = ((dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * rstd[r]).matrix();
    }
  });
}

}  // namespace XFMR_CPU_OPS_NS

XFMR_CPU_FAMILY(CpuLayerNorm);

}  // namespace xfmr::detail
