// dropout.hpp: the CPU's dropout (layers/dropout.hpp; CUDA: cuda/dropout.cu).
//
//  dropout_forward(n, p, key, x, y, keep)   keep[i] = dropout_keeps(key, i, p); y = x keep / (1 - p)
//  dropout_backward(n, p, keep, dy, dx)     dx = dy keep / (1 - p)
// Inverted dropout whose mask depends only on (key, element index): the
// same on any thread count and on CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "xfmr/backend/checks.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/core/rng.hpp"

namespace xfmr::detail {

template <class S>
class CpuDropout {
 public:
  void dropout_forward(std::size_t n, float p, std::uint64_t key, const S* x, S* y, std::uint8_t* keep) {
    check_dropout_rate(p);
    cpu_ops<S>().dropout_forward(n, p, key, x, y, keep);
  }
  void dropout_backward(std::size_t n, float p, const std::uint8_t* keep, const S* dy, S* dx) {
    cpu_ops<S>().dropout_backward(n, p, keep, dy, dx);
  }
};

inline namespace XFMR_CPU_OPS_NS {

template <class S>
void dropout_forward(std::size_t n, float p, std::uint64_t key, const S* x, S* y, std::uint8_t* keep) {
  const S scale = S(1) / (S(1) - S(p));
  const long ln = static_cast<long>(n);
  parallel_ranges(ln, ln > kParallelWork, [=](long lo, long hi) {
    for (long i = lo; i < hi; ++i) {
      keep[i] = dropout_keeps(key, static_cast<std::uint64_t>(i), p) ? 1 : 0;
      y[i] = keep[i] ? x[i] * scale : S(0);
    }
  });
}

template <class S>
void dropout_backward(std::size_t n, float p, const std::uint8_t* keep, const S* dy, S* dx) {
  const S scale = S(1) / (S(1) - S(p));
  const long ln = static_cast<long>(n);
  parallel_ranges(ln, ln > kParallelWork, [=](long lo, long hi) {
    for (long i = lo; i < hi; ++i) {  // dy read unconditionally: a vector form without masked loads (relu_backward)
      const S g = dy[i] * scale;
      dx[i] = keep[i] ? g : S(0);
    }
  });
}

}  // namespace XFMR_CPU_OPS_NS

XFMR_CPU_FAMILY(CpuDropout);

}  // namespace xfmr::detail
