// residual.hpp: the CPU's elementwise sums and copies
// (blocks/residual.hpp; CUDA: cuda/residual.cu).
//
//  add(n, a, b, y)       y = a + b      (assign; y may alias a or b)
//  add_to(n, x, y)       y += x         (accumulate)
//  copy(n, x, y)         y = x
#pragma once

#include <algorithm>
#include <cstddef>

#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

template <class S>
class CpuResidual {
 public:
  void add(std::size_t n, const S* a, const S* b, S* y) { cpu_ops<S>().add(n, a, b, y); }
  void add_to(std::size_t n, const S* x, S* y) { cpu_ops<S>().add_to(n, x, y); }
  void copy(std::size_t n, const S* x, S* y) {
    if (x != y) std::copy(x, x + n, y);
  }
};

inline namespace XFMR_CPU_OPS_NS {

template <class S>
void add(std::size_t n, const S* a, const S* b, S* y) {
  const long ln = static_cast<long>(n);
  parallel_ranges(ln, ln > kLightParallelWork, [=](long lo, long hi) {
    for (long i = lo; i < hi; ++i) y[i] = a[i] + b[i];
  });
}

template <class S>
void add_to(std::size_t n, const S* x, S* y) {
  const long ln = static_cast<long>(n);
  parallel_ranges(ln, ln > kLightParallelWork, [=](long lo, long hi) {
    for (long i = lo; i < hi; ++i) y[i] += x[i];
  });
}

}  // namespace XFMR_CPU_OPS_NS

XFMR_CPU_FAMILY(CpuResidual);

}  // namespace xfmr::detail
