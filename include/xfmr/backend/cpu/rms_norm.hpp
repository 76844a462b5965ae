// rms_norm.hpp: the CPU's RMS norm (layers/rms_norm.hpp; CUDA:
// cuda/rms_norm.cu).
//
//  rms_norm_forward(rows, n, x, gamma, eps, y, rstd)      saves rstd (rows)
//  rms_norm_backward(rows, n, dy, x, gamma, rstd, dx, dgamma)
//      dx assigned (may alias dy), dgamma accumulated
#pragma once

#include <Eigen/Core>
#include <cmath>

#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

template <class S>
class CpuRmsNorm {
 public:
  void rms_norm_forward(int rows, int n, const S* x, const S* gamma, S eps, S* y, S* rstd) {
    cpu_ops<S>().rms_norm_forward(rows, n, x, gamma, eps, y, rstd);
  }
  void rms_norm_backward(int rows, int n, const S* dy, const S* x, const S* gamma, const S* rstd, S* dx, S* dgamma) {
    cpu_ops<S>().rms_norm_backward(rows, n, dy, x, gamma, rstd, dx, dgamma);
  }
};

inline namespace XFMR_CPU_OPS_NS {

template <class S>
void rms_norm_forward(int rows, int n, const S* x, const S* gamma, S eps, S* y, S* rstd) {
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  const Eigen::Map<const Vec> g(gamma, n);
  parallel_ranges(long(rows), long(rows) * n > kLightParallelWork, [=](long lo, long hi) {
    for (int r = int(lo); r < int(hi); ++r) {
      const Eigen::Map<const Vec> xr(x + long(r) * n, n);
      const S rs = S(1) / std::sqrt(xr.array().square().mean() + eps);
      Eigen::Map<Vec>(y + long(r) * n, n) = (xr.array() * rs * g.array()).matrix();
      rstd[r] = rs;
    }
  });
}

// dx = rstd (dxhat - xhat mean(dxhat xhat)), dxhat = dy gamma, xhat = x
// rstd; dgamma is reduced first (over columns, rows in order), so dx may
// alias dy.
template <class S>
void rms_norm_backward(int rows, int n, const S* dy, const S* x, const S* gamma, const S* rstd, S* dx, S* dgamma) {
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  parallel_ranges(long(n), long(rows) * n > kParallelWork, [=](long lo, long hi) {
    const long w = hi - lo;
    Eigen::Map<Vec> dg(dgamma + lo, w);
    for (int r = 0; r < rows; ++r)
      dg.array() += Eigen::Map<const Vec>(dy + long(r) * n + lo, w).array() *
                    Eigen::Map<const Vec>(x + long(r) * n + lo, w).array() * rstd[r];
  }, 16);
  const Eigen::Map<const Vec> g(gamma, n);
  parallel_ranges(long(rows), long(rows) * n > kParallelWork, [=](long lo, long hi) {
    for (int r = int(lo); r < int(hi); ++r) {
      const auto xhat = Eigen::Map<const Vec>(x + long(r) * n, n).array() * rstd[r];
      const auto dxhat = Eigen::Map<const Vec>(dy + long(r) * n, n).array() * g.array();
      const S mean_dxhat_xhat = (dxhat * xhat).mean();
      Eigen::Map<Vec>(dx + long(r) * n, n) = ((dxhat - xhat * mean_dxhat_xhat) * rstd[r]).matrix();
    }
  });
}

}  // namespace XFMR_CPU_OPS_NS

XFMR_CPU_FAMILY(CpuRmsNorm);

}  // namespace xfmr::detail
