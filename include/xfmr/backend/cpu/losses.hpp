// losses.hpp: the CPU's softmax cross-entropy (train/losses.hpp; CUDA:
// cuda/losses.cu).
//
//  cross_entropy_forward(rows, V, logits, targets, ignore_index, probs, smoothing) -> mean loss
//      against the target distribution (1 - smoothing) onehot(target) + smoothing / V (torch's
//      label_smoothing), averaged over rows whose target != ignore_index (0 when every row is
//      ignored); saves probs (rows, V) for the backward.
//  cross_entropy_backward(rows, V, probs, targets, ignore_index, dloss, dlogits, smoothing)
//      dlogits assigned: dloss * (probs - target distribution) / (number of counted rows)
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <vector>

#include "xfmr/backend/checks.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

template <class S>
class CpuLosses {
 public:
  double cross_entropy_forward(int rows, int V, const S* logits, const std::int32_t* targets, int ignore_index,
                               S* probs, S smoothing = S(0));
  void cross_entropy_backward(int rows, int V, const S* probs, const std::int32_t* targets, int ignore_index,
                              S dloss, S* dlogits, S smoothing = S(0));

 private:
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  std::vector<double> row_loss_;  // per-row loss before the ordered sum; grows only
};

template <class S>
double CpuLosses<S>::cross_entropy_forward(int rows, int V, const S* logits, const std::int32_t* targets,
                                           int ignore_index, S* probs, S smoothing) {
  check_targets(rows, V, targets, ignore_index);
  check_label_smoothing(smoothing);
  row_loss_.resize(static_cast<std::size_t>(rows));
  double* row_loss = row_loss_.data();
  parallel_ranges(long(rows), long(rows) * V > kParallelWork, [=](long lo, long hi) {
    for (int r = int(lo); r < int(hi); ++r) {
      const Eigen::Map<const Vec> z(logits + long(r) * V, V);
      Eigen::Map<Vec> p(probs + long(r) * V, V);
      const S zmax = z.maxCoeff();
      p = (z.array() - zmax).exp().matrix();
      const S sum = p.sum();
      p /= sum;
      const int t = targets[r];
      if (t == ignore_index) {
        row_loss[r] = 0.0;
        continue;
      }
      const double lse = double(std::log(sum)) + double(zmax);
      row_loss[r] = lse - (1.0 - double(smoothing)) * double(z[t]) - double(smoothing) * double(z.mean());
    }
  });
  double total = 0.0;
  int counted = 0;
  for (int r = 0; r < rows; ++r) {
    total += row_loss_[r];
    counted += targets[r] != ignore_index;
  }
  return counted ? total / counted : 0.0;
}

template <class S>
void CpuLosses<S>::cross_entropy_backward(int rows, int V, const S* probs, const std::int32_t* targets,
                                          int ignore_index, S dloss, S* dlogits, S smoothing) {
  int counted = 0;
  for (int r = 0; r < rows; ++r) counted += targets[r] != ignore_index;
  const S scale = counted ? dloss / S(counted) : S(0);
  parallel_ranges(long(rows), long(rows) * V > kParallelWork, [=](long lo, long hi) {
    for (int r = int(lo); r < int(hi); ++r) {
      Eigen::Map<Vec> d(dlogits + long(r) * V, V);
      if (targets[r] == ignore_index) {
        d.setZero();
        continue;
      }
      d = (Eigen::Map<const Vec>(probs + long(r) * V, V).array() - smoothing / S(V)).matrix() * scale;
      d[targets[r]] -= (S(1) - smoothing) * scale;
    }
  });
}

XFMR_CPU_FAMILY(CpuLosses);

}  // namespace xfmr::detail
