// classifier.hpp: the CPU's pooling over a sequence (models/classifier.hpp;
// CUDA: cuda/classifier.cu).
//
//  mean_pool_forward(B, T, D, x, exclude, y)     y[b,:] = mean of x[b,t,:] over t with !exclude[b,t]
//                                                (all t when exclude is null; none counted: zeros)
//  mean_pool_backward(B, T, D, dy, exclude, dx)  dx assigned: dy[b,:] / count where counted, 0 elsewhere
#pragma once

#include <Eigen/Core>
#include <cstdint>

#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

template <class S>
class CpuClassifier {
 public:
  void mean_pool_forward(int B, int T, int D, const S* x, const std::uint8_t* exclude, S* y) {
    cpu_ops<S>().mean_pool_forward(B, T, D, x, exclude, y);
  }
  void mean_pool_backward(int B, int T, int D, const S* dy, const std::uint8_t* exclude, S* dx) {
    cpu_ops<S>().mean_pool_backward(B, T, D, dy, exclude, dx);
  }
};

inline namespace XFMR_CPU_OPS_NS {

template <class S>
void mean_pool_forward(int B, int T, int D, const S* x, const std::uint8_t* exclude, S* y) {
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  parallel_ranges(long(B), long(B) * T * D > kParallelWork, [=](long lo, long hi) {
    for (int b = int(lo); b < int(hi); ++b) {
      Eigen::Map<Vec> yb(y + long(b) * D, D);
      yb.setZero();
      int n = 0;
      for (int t = 0; t < T; ++t)
        if (!exclude || !exclude[long(b) * T + t]) {
          yb += Eigen::Map<const Vec>(x + (long(b) * T + t) * D, D);
          ++n;
        }
      if (n) yb /= S(n);
    }
  });
}

template <class S>
void mean_pool_backward(int B, int T, int D, const S* dy, const std::uint8_t* exclude, S* dx) {
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  parallel_ranges(long(B), long(B) * T * D > kParallelWork, [=](long lo, long hi) {
    for (int b = int(lo); b < int(hi); ++b) {
      int n = 0;
      for (int t = 0; t < T; ++t) n += !exclude || !exclude[long(b) * T + t];
      for (int t = 0; t < T; ++t) {
        Eigen::Map<Vec> dxt(dx + (long(b) * T + t) * D, D);
        if (!exclude || !exclude[long(b) * T + t])
          dxt = Eigen::Map<const Vec>(dy + long(b) * D, D) / S(n);
        else
          dxt.setZero();
      }
    }
  });
}

}  // namespace XFMR_CPU_OPS_NS

XFMR_CPU_FAMILY(CpuClassifier);

}  // namespace xfmr::detail
