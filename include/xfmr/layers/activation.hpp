// activation.hpp: elementwise activations as policy tags, and the layer that
// applies one.
//
// Relu: max(x, 0). Gelu: the tanh approximation
//   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (torch's approximate="tanh").
// Saves: a pointer to x. Backward: dx assigned (dx may alias dy). No parameters.
#pragma once

#include <cstddef>

#include "xfmr/core/tensor.hpp"

namespace xfmr {

struct Relu {
  static constexpr const char* name = "relu";
  template <class Be, class S>
  static void forward(Be& be, std::size_t n, const S* x, S* y) { be.relu_forward(n, x, y); }
  template <class Be, class S>
  static void backward(Be& be, std::size_t n, const S* x, const S* dy, S* dx) { be.relu_backward(n, x, dy, dx); }
};

struct Gelu {
  static constexpr const char* name = "gelu";
  template <class Be, class S>
  static void forward(Be& be, std::size_t n, const S* x, S* y) { be.gelu_forward(n, x, y); }
  template <class Be, class S>
  static void backward(Be& be, std::size_t n, const S* x, const S* dy, S* dx) { be.gelu_backward(n, x, dy, dx); }
};

template <class Kind, int D, class Backend>
class Activation {
 public:
  using S = typename Backend::Scalar;

  void forward(Backend& be, ConstRows<S, D> x, Rows<S, D> y) {
    require_rows(y, x.rows, "activation output");
    x_ = x;
    Kind::forward(be, x.size(), x.data, y.data);
  }

  void backward(Backend& be, ConstRows<S, D> dy, Rows<S, D> dx) {
    require_rows(dy, x_.rows, "activation output gradient");
    require_rows(dx, x_.rows, "activation input gradient");
    Kind::backward(be, x_.size(), x_.data, dy.data, dx.data);
  }

  template <class F>
  void visit(F&&) {}

 private:
  ConstRows<S, D> x_;
};

}  // namespace xfmr
