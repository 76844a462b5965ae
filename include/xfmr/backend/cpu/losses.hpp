// losses.hpp: the CPU's softmax cross-entropy (layers/losses.hpp; CUDA:
// cuda/losses.cu).
//
//  cross_entropy_forward(rows, V, logits, targets, ignore_index, probs, smoothing) -> mean loss
//      against the target distribution (1 - smoothing) onehot(target) + smoothing / V (torch's
//      label_smoothing), averaged over rows whose target != ignore_index (0 when every row is
//      ignored); saves probs (rows, V) for the backward.
//  cross_entropy_backward(rows, V, probs, targets, ignore_index, dloss, dlogits, smoothing)
//      dlogits assigned: dloss * (probs - target distribution) / (number of counted rows)
//  cross_entropy_forward_backward(rows, V, logits, targets, ignore_index, dloss, dlogits, smoothing)
//      -> mean loss: the two above fused, row by row, with no probabilities kept (the output
//      head's classifier in training); the same loss and dlogits bit for bit (with buffers of
//      one alignment, as the backend's are: a row's sums start at its first aligned element).
//      dlogits may be logits (in place).
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
                               S* probs, S smoothing = S(0)) {
    check_targets(rows, V, targets, ignore_index);
    check_label_smoothing(smoothing);
    cpu_ops<S>().cross_entropy_forward(rows, V, logits, targets, ignore_index, probs, smoothing, row_losses(rows));
    return mean_of_rows(rows, targets, ignore_index);
  }
  void cross_entropy_backward(int rows, int V, const S* probs, const std::int32_t* targets, int ignore_index, S dloss,
                              S* dlogits, S smoothing = S(0)) {
    cpu_ops<S>().cross_entropy_backward(rows, V, probs, targets, ignore_index, dloss, dlogits, smoothing);
  }
  double cross_entropy_forward_backward(int rows, int V, const S* logits, const std::int32_t* targets, int ignore_index,
                                        S dloss, S* dlogits, S smoothing = S(0)) {
    check_targets(rows, V, targets, ignore_index);
    check_label_smoothing(smoothing);
    cpu_ops<S>().cross_entropy_forward_backward(rows, V, logits, targets, ignore_index, dloss, dlogits, smoothing,
                                                row_losses(rows));
    return mean_of_rows(rows, targets, ignore_index);
  }

 private:
  double* row_losses(int rows) {
    row_loss_.resize(static_cast<std::size_t>(rows));
    return row_loss_.data();
  }
  // The per-row losses summed in row order, over the counted rows.
  double mean_of_rows(int rows, const std::int32_t* targets, int ignore_index) const {
    double total = 0.0;
    int counted = 0;
    for (int r = 0; r < rows; ++r) {
      total += row_loss_[r];
      counted += targets[r] != ignore_index;
    }
    return counted ? total / counted : 0.0;
  }

  std::vector<double> row_loss_;  // per-row loss before the ordered sum; grows only
};

inline namespace XFMR_CPU_OPS_NS {

// The targets and smoothing already checked; row_loss (rows) each row's
// loss (0 where ignored), which the caller sums in order.
template <class S>
void cross_entropy_forward(int rows, int V, const S* logits, const std::int32_t* targets, int ignore_index, S* probs,
                           S smoothing, double* row_loss) {
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
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
}

template <class S>
void cross_entropy_backward(int rows, int V, const S* probs, const std::int32_t* targets, int ignore_index, S dloss,
                            S* dlogits, S smoothing) {
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
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

// Each row as forward then backward compute it, with the row's
// probabilities held in its dlogits row between the two (so in place works:
// the loss's terms are read from the logits before they are overwritten).
template <class S>
void cross_entropy_forward_backward(int rows, int V, const S* logits, const std::int32_t* targets, int ignore_index,
                                    S dloss, S* dlogits, S smoothing, double* row_loss) {
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  int counted = 0;
  for (int r = 0; r < rows; ++r) counted += targets[r] != ignore_index;
  const S scale = counted ? dloss / S(counted) : S(0);
  parallel_ranges(long(rows), long(rows) * V > kParallelWork, [=](long lo, long hi) {
    for (int r = int(lo); r < int(hi); ++r) {
      const Eigen::Map<const Vec> z(logits + long(r) * V, V);
      Eigen::Map<Vec> d(dlogits + long(r) * V, V);
      const int t = targets[r];
      if (t == ignore_index) {
        row_loss[r] = 0.0;
        d.setZero();
        continue;
      }
      const S zmax = z.maxCoeff(), zt = z[t], zmean = z.mean();
      d = (z.array() - zmax).exp().matrix();
      const S sum = d.sum();
      d /= sum;
      row_loss[r] = double(std::log(sum)) + double(zmax) - (1.0 - double(smoothing)) * double(zt) -
                    double(smoothing) * double(zmean);
      d = (d.array() - smoothing / S(V)).matrix() * scale;
      d[t] -= (S(1) - smoothing) * scale;
    }
  });
}

}  // namespace XFMR_CPU_OPS_NS

XFMR_CPU_FAMILY(CpuLosses);

}  // namespace xfmr::detail
