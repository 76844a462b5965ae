// activation.hpp: activations as policy tags, and the layer that applies an
// elementwise one.
//
// Relu: max(x, 0). Gelu: the tanh approximation
//   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (torch's approximate="tanh").
// SwiGlu (GATED): silu(g) u = g sigmoid(g) u over a hidden layer of twice the
//   width, [g | u] (Shazeer 2020; Llama's feed-forward); FeedForward applies
//   it (feed_forward.hpp), the layer below does not.
// GeGlu (GATED): gelu(g) u with Gelu's tanh form, the same way (T5 v1.1's
//   gated-GELU feed-forward).
// DynamicActivation: one of the four, chosen at run time
//   (ModelParts::activation): a configuration of Dynamic parts.
// Saves: a pointer to x. Backward: dx assigned (dx may alias dy). No parameters.
#pragma once

#include <cstddef>

#include "xfmr/core/config.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

struct Relu {
  static constexpr const char* name = "relu";
  static constexpr bool GATED = false;
  template <class Be, class S>
  static void forward(Be& be, std::size_t n, const S* x, S* y) { be.relu_forward(n, x, y); }
  template <class Be, class S>
  static void backward(Be& be, std::size_t n, const S* x, const S* dy, S* dx) { be.relu_backward(n, x, dy, dx); }
};

struct Gelu {
  static constexpr const char* name = "gelu";
  static constexpr bool GATED = false;
  template <class Be, class S>
  static void forward(Be& be, std::size_t n, const S* x, S* y) { be.gelu_forward(n, x, y); }
  template <class Be, class S>
  static void backward(Be& be, std::size_t n, const S* x, const S* dy, S* dx) { be.gelu_backward(n, x, dy, dx); }
};

// h (rows, 2 n) = [gate | up] -> y (rows, n); backward dh (rows, 2 n) assigned.
struct SwiGlu {
  static constexpr const char* name = "swiglu";
  static constexpr bool GATED = true;
  template <class Be, class S>
  static void forward(Be& be, int rows, int n, const S* h, S* y) { be.swiglu_forward(rows, n, h, y); }
  template <class Be, class S>
  static void backward(Be& be, int rows, int n, const S* h, const S* dy, S* dh) {
    be.swiglu_backward(rows, n, h, dy, dh);
  }
};

// h (rows, 2 n) = [gate | up] -> y (rows, n); backward dh (rows, 2 n) assigned.
struct GeGlu {
  static constexpr const char* name = "geglu";
  static constexpr bool GATED = true;
  template <class Be, class S>
  static void forward(Be& be, int rows, int n, const S* h, S* y) { be.geglu_forward(rows, n, h, y); }
  template <class Be, class S>
  static void backward(Be& be, int rows, int n, const S* h, const S* dy, S* dh) {
    be.geglu_backward(rows, n, h, dy, dh);
  }
};

struct DynamicActivation {
  static constexpr const char* name = "dynamic";
  static constexpr bool GATED = false;  // (decided at run time: FeedForward asks the parts)
};

template <class Kind, int D, class Backend>
class Activation {
 public:
  using A = typename Backend::Activation;

  void forward(Backend& be, ConstRows<A, D> x, Rows<A, D> y) {
    require_rows(y, x.rows, "activation output");
    x_ = x;
    Kind::forward(be, x.size(), x.data, y.data);
  }

  void backward(Backend& be, ConstRows<A, D> dy, Rows<A, D> dx) {
    require_rows(dy, x_.rows, "activation output gradient");
    require_rows(dx, x_.rows, "activation input gradient");
    Kind::backward(be, x_.size(), x_.data, dy.data, dx.data);
  }

  template <class F>
  void visit(F&&) {}

 private:
  ConstRows<A, D> x_;
};

// An elementwise activation chosen at run time: Relu or Gelu (set_kind).
template <int D, class Backend>
class Activation<DynamicActivation, D, Backend> {
 public:
  using A = typename Backend::Activation;

  void set_kind(ModelParts::Activation kind) { gelu_ = kind == ModelParts::Activation::gelu; }

  void forward(Backend& be, ConstRows<A, D> x, Rows<A, D> y) {
    require_rows(y, x.rows, "activation output");
    x_ = x;
    if (gelu_) Gelu::forward(be, x.size(), x.data, y.data);
    else Relu::forward(be, x.size(), x.data, y.data);
  }
  void backward(Backend& be, ConstRows<A, D> dy, Rows<A, D> dx) {
    require_rows(dy, x_.rows, "activation output gradient");
    require_rows(dx, x_.rows, "activation input gradient");
    if (gelu_) Gelu::backward(be, x_.size(), x_.data, dy.data, dx.data);
    else Relu::backward(be, x_.size(), x_.data, dy.data, dx.data);
  }
  template <class F>
  void visit(F&&) {}

 private:
  ConstRows<A, D> x_;
  bool gelu_ = false;
};

}  // namespace xfmr
