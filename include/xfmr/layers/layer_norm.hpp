// layer_norm.hpp: y = (x - mean) / sqrt(var + eps) * weight + bias over the
// last dimension, as torch.nn.LayerNorm (biased variance, eps = 1e-5).
//
// Saves: a pointer to x (kept alive by the caller), and mean and rstd per row.
// Backward: dweight, dbias accumulate; dx assigned (dx may alias dy).
// Parameters: "weight" (D) initialised to 1, "bias" (D) initialised to 0.
#pragma once

#include "xfmr/core/params.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

template <int D_, class Backend>
class LayerNorm {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  explicit LayerNorm(S eps = S(1e-5))
    requires(D_ != Dynamic)
      : LayerNorm(D_, eps) {}
  LayerNorm(int width, S eps) : D(width, "LayerNorm width"), weight_{D}, dweight_{D}, bias_{D}, dbias_{D}, eps_(eps) {
    weight_.fill(S(1));
  }

  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y) {
    require_rows(y, x.rows, "LayerNorm output");
    require_width(x, D, "LayerNorm input");
    require_width(y, D, "LayerNorm output");
    x_ = x;
    S* mean = mean_.reserve(x.rows);  // (rows)
    S* rstd = rstd_.reserve(x.rows);  // (rows)
    be.layer_norm_forward(x.rows, D, x.data, weight_.data(), bias_.data(), eps_, y.data, mean, rstd);
  }

  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx) {
    require_rows(dy, x_.rows, "LayerNorm output gradient");
    require_rows(dx, x_.rows, "LayerNorm input gradient");
    be.layer_norm_backward(x_.rows, D, dy.data, x_.data, weight_.data(), mean_.data(), rstd_.data(), dx.data,
                           dweight_.data(), dbias_.data());
  }

  void visit(ParameterVisitor<Backend> f) {
    f("weight", weight_, dweight_);
    f("bias", bias_, dbias_);
  }

 private:
  [[no_unique_address]] Dim<D_> D;
  Tensor weight_, dweight_, bias_, dbias_;  // (D)
  S eps_;
  ConstRows<A, D_> x_;
  Buffer<S> mean_, rstd_;  // (rows)

 public:
  // f(buffer, the same buffer of others...) for what the last forward saved
  // (activation recompute frees or trades it, block_stack.hpp).
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    f(mean_, others.mean_...);
    f(rstd_, others.rstd_...);
  }
};

}  // namespace xfmr
