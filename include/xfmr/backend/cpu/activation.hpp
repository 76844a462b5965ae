// activation.hpp: the CPU's activations (layers/activation.hpp; CUDA:
// cuda/activation.cu).
//
//  relu_forward(n, x, y), relu_backward(n, x, dy, dx)
//  gelu_forward(n, x, y), gelu_backward(n, x, dy, dx)   tanh approximation
//  swiglu_forward(rows, n, h, y)       y[r,j] = silu(h[r,j]) h[r,n+j]; h (rows, 2n) = [gate | up]
//  swiglu_backward(rows, n, h, dy, dh) dh (rows, 2n) assigned
//  geglu_forward(rows, n, h, y)        y[r,j] = gelu(h[r,j]) h[r,n+j] (GELU's tanh form), h as SwiGLU's
//  geglu_backward(rows, n, h, dy, dh)  dh (rows, 2n) assigned
// Every dx may alias dy; a gated activation's dh may be h (in place: the
// feed-forward's backward writes it over the saved pre-activation).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>

#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

template <class S>
class CpuActivation {
 public:
  void relu_forward(std::size_t n, const S* x, S* y) { cpu_ops<S>().relu_forward(n, x, y); }
  void relu_backward(std::size_t n, const S* x, const S* dy, S* dx) { cpu_ops<S>().relu_backward(n, x, dy, dx); }
  void gelu_forward(std::size_t n, const S* x, S* y) { cpu_ops<S>().gelu_forward(n, x, y); }
  void gelu_backward(std::size_t n, const S* x, const S* dy, S* dx) { cpu_ops<S>().gelu_backward(n, x, dy, dx); }
  void swiglu_forward(int rows, int n, const S* h, S* y) { cpu_ops<S>().swiglu_forward(rows, n, h, y); }
  void swiglu_backward(int rows, int n, const S* h, const S* dy, S* dh) {
    cpu_ops<S>().swiglu_backward(rows, n, h, dy, dh);
  }
  void geglu_forward(int rows, int n, const S* h, S* y) { cpu_ops<S>().geglu_forward(rows, n, h, y); }
  void geglu_backward(int rows, int n, const S* h, const S* dy, S* dh) {
    cpu_ops<S>().geglu_backward(rows, n, h, dy, dh);
  }
};

inline namespace XFMR_CPU_OPS_NS {

template <class S>
using ActivationArray = Eigen::Array<S, Eigen::Dynamic, 1>;
template <class S>
inline constexpr S kGeluC = S(0.7978845608028654);  // sqrt(2 / pi)

template <class S>
void relu_forward(std::size_t n, const S* x, S* y) {
  const long ln = static_cast<long>(n);
  parallel_ranges(ln, ln > kParallelWork, [=](long lo, long hi) {
    for (long i = lo; i < hi; ++i) y[i] = x[i] > S(0) ? x[i] : S(0);
  });
}

template <class S>
void relu_backward(std::size_t n, const S* x, const S* dy, S* dx) {
  const long ln = static_cast<long>(n);
  parallel_ranges(ln, ln > kParallelWork, [=](long lo, long hi) {
    // dy read whatever the sign: a load under the condition leaves GCC no
    // vector form without masked loads (SSE2: a branch an element, half of
    // them mispredicted, 10% of a portable build's training step).
    for (long i = lo; i < hi; ++i) {
      const S g = dy[i];
      dx[i] = x[i] > S(0) ? g : S(0);
    }
  });
}

// GELU, tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi).
// Through Eigen arrays: float's tanh vectorises there (a rational
// approximation, within a few ulp of std::tanh), where std::tanh in a loop
// is a scalar call per element (a tenth of GPT-2's training step). m values
// on this thread: y = gelu(x); dx = dy gelu'(x) (dx may alias dy).
template <class S>
void gelu_values(long m, const S* x, S* y) {
  const Eigen::Map<const ActivationArray<S>> v(x, m);
  Eigen::Map<ActivationArray<S>>(y, m) = S(0.5) * v * (S(1) + (kGeluC<S> * (v + S(0.044715) * v.cube())).tanh());
}

template <class S>
void gelu_gradients(long m_all, const S* x, const S* dy, S* dx) {
  constexpr long kChunk = 256;  // tanh's values on the stack, not the heap
  Eigen::Array<S, kChunk, 1> tanhs, exps;
  for (long c = 0; c < m_all; c += kChunk) {
    const long m = std::min(kChunk, m_all - c);
    const Eigen::Map<const ActivationArray<S>> v(x + c, m), g(dy + c, m);
    auto t = tanhs.head(m);
    auto e = exps.head(m);
    e = kGeluC<S> * (v + S(0.044715) * v.cube());  // u
    t = e.tanh();
    // 1 - tanh(u)^2 as 4 e / (1 + e)^2 with e = exp(-2|u|): the vectorised
    // tanh rounds to +-1 from |u| ~ 8, where 1 - t^2 would lose the tail.
    e = (S(-2) * e.abs()).exp();
    Eigen::Map<ActivationArray<S>>(dx + c, m) =
        g * (S(0.5) * (S(1) + t) +
             S(0.5) * v * (S(4) * e / (S(1) + e).square()) * (kGeluC<S> * (S(1) + S(3 * 0.044715) * v.square())));
  }
}

template <class S>
void gelu_forward(std::size_t n, const S* x, S* y) {
  const long ln = static_cast<long>(n);
  parallel_ranges(ln, ln > kParallelWork / 8, [=](long lo, long hi) { gelu_values(hi - lo, x + lo, y + lo); });
}

template <class S>
void gelu_backward(std::size_t n, const S* x, const S* dy, S* dx) {
  const long ln = static_cast<long>(n);
  parallel_ranges(ln, ln > kParallelWork / 8,
                  [=](long lo, long hi) { gelu_gradients(hi - lo, x + lo, dy + lo, dx + lo); });
}

// SwiGLU over rows of [gate | up]: silu(g) u with silu(g) = g sigmoid(g);
// backward: dg = dy u s (1 + g (1 - s)), du = dy silu(g), s = sigmoid(g).
template <class S>
void swiglu_forward(int rows, int n, const S* h, S* y) {
  parallel_ranges(long(rows), long(rows) * n > kParallelWork / 8, [=](long lo, long hi) {
    for (long r = lo; r < hi; ++r) {
      const Eigen::Map<const ActivationArray<S>> g(h + r * 2 * n, n), u(h + r * 2 * n + n, n);
      Eigen::Map<ActivationArray<S>>(y + r * n, n) = g / (S(1) + (-g).exp()) * u;
    }
  });
}

// (In place, dg over g and du over u: s and du's values (t) are held apart
// until g and u have been read.)
template <class S>
void swiglu_backward(int rows, int n, const S* h, const S* dy, S* dh) {
  parallel_ranges(long(rows), long(rows) * n > kParallelWork / 8, [=](long lo, long hi) {
    ActivationArray<S> s(n), t(n);
    for (long r = lo; r < hi; ++r) {
      const Eigen::Map<const ActivationArray<S>> g(h + r * 2 * n, n), u(h + r * 2 * n + n, n), d(dy + r * n, n);
      Eigen::Map<ActivationArray<S>> dg(dh + r * 2 * n, n), du(dh + r * 2 * n + n, n);
      s = S(1) / (S(1) + (-g).exp());
      t = d * g * s;
      dg = d * u * s * (S(1) + g * (S(1) - s));
      du = t;
    }
  });
}

// GeGLU over rows of [gate | up]: gelu(g) u; backward: dg = dy u gelu'(g),
// du = dy gelu(g), through GELU's own kernels on each row's halves (du
// holds dy u until dg is in place).
template <class S>
void geglu_forward(int rows, int n, const S* h, S* y) {
  parallel_ranges(long(rows), long(rows) * n > kParallelWork / 8, [=](long lo, long hi) {
    for (long r = lo; r < hi; ++r) {
      gelu_values(n, h + r * 2 * n, y + r * n);
      Eigen::Map<ActivationArray<S>>(y + r * n, n) *= Eigen::Map<const ActivationArray<S>>(h + r * 2 * n + n, n);
    }
  });
}

// (In place, dg over g and du over u: g is read from a copy.)
template <class S>
void geglu_backward(int rows, int n, const S* h, const S* dy, S* dh) {
  parallel_ranges(long(rows), long(rows) * n > kParallelWork / 8, [=](long lo, long hi) {
    ActivationArray<S> gate(n);
    for (long r = lo; r < hi; ++r) {
      std::copy_n(h + r * 2 * n, n, gate.data());  // (not Eigen's assignment: its resize check draws GCC 12's -Wuse-after-free)
      S *dg = dh + r * 2 * n, *du = dg + n;
      Eigen::Map<ActivationArray<S>>(du, n) =
          Eigen::Map<const ActivationArray<S>>(dy + r * n, n) * Eigen::Map<const ActivationArray<S>>(h + r * 2 * n + n, n);  // dy u
      gelu_gradients(n, gate.data(), du, dg);
      gelu_values(n, gate.data(), du);
      Eigen::Map<ActivationArray<S>>(du, n) *= Eigen::Map<const ActivationArray<S>>(dy + r * n, n);
    }
  });
}

}  // namespace XFMR_CPU_OPS_NS

XFMR_CPU_FAMILY(CpuActivation);

}  // namespace xfmr::detail
