// rms_norm.hpp: y = x / sqrt(mean(x^2) + eps) * weight over the last
// dimension (Zhang and Sennrich 2019; Llama's norm): LayerNorm without the
// centring and the bias.
//
// A configuration picks it for its blocks and final norm with
//   template <int D, class Be> using NormLayer = xfmr::RmsNorm<D, Be>;
// (residual.hpp; LayerNorm when absent).
// Saves: a pointer to x (kept alive by the caller) and rstd per row.
// Backward: dweight accumulates; dx assigned (dx may alias dy).
// Parameters: "weight" (D) initialised to 1.
#pragma once

#include "xfmr/core/params.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

template <int D_, class Backend>
class RmsNorm {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  explicit RmsNorm(S eps = S(1e-5))
    requires(D_ != Dynamic)
      : RmsNorm(D_, eps) {}
  RmsNorm(int width, S eps) : D(width, "RmsNorm width"), weight_{D}, dweight_{D}, eps_(eps) { weight_.fill(S(1)); }

  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y) {
    require_rows(y, x.rows, "RmsNorm output");
    require_width(x, D, "RmsNorm input");
    require_width(y, D, "RmsNorm output");
    x_ = x;
    be.rms_norm_forward(x.rows, D, x.data, weight_.data(), eps_, y.data, rstd_.reserve(x.rows));
  }

  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx) {
    require_rows(dy, x_.rows, "RmsNorm output gradient");
    require_rows(dx, x_.rows, "RmsNorm input gradient");
    be.rms_norm_backward(x_.rows, D, dy.data, x_.data, weight_.data(), rstd_.data(), dx.data, dweight_.data());
  }

  void visit(ParameterVisitor<Backend> f) {
    f("weight", weight_, dweight_);
  }

 private:
  [[no_unique_address]] Dim<D_> D;
  Tensor weight_, dweight_;  // (D)
  S eps_;
  ConstRows<A, D_> x_;
  Buffer<S> rstd_;  // (rows)

 public:
  // f(buffer, the same buffer of others...) for what the last forward saved
  // (activation recompute frees or trades it, block_stack.hpp).
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    f(rstd_, others.rstd_...);
  }
};

}  // namespace xfmr
