// output_projection.hpp: y = x W^T (+ b) onto a runtime number of outputs
// (a vocabulary, a set of classes), W (out, IN) as torch.nn.Linear.
//
// The weight is owned, or tied to another layer's (value, grad) pair, e.g. the
// token embedding (vocab, D): then visit() does not list it, its gradient
// accumulates into the owner's, and the owner must outlive this layer and stay
// where it is (models holding a tie are neither copyable nor movable).
// Saves: a pointer to x. Backward: dW, db accumulate; dx assigned (skipped
// when dx has no data). Parameters: "weight" (when owned), "bias" (optional).
#pragma once

#include <cmath>

#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

template <int IN_, class Backend>
class OutputProjection {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  // Owned weight, torch.nn.Linear's default initialisation.
  OutputProjection(int out, Rng& rng, bool with_bias)
    requires(IN_ != Dynamic)
      : OutputProjection(IN_, out, rng, with_bias) {}
  OutputProjection(int in, int out, Rng& rng, bool with_bias)
      : IN(in, "output projection input width"), out_(out), has_bias_(with_bias) {
    require(out > 0, "output size ", out, " must be positive");
    own_weight_.resize({out, IN});
    own_dweight_.resize({out, IN});
    weight_ = &own_weight_;
    dweight_ = &own_dweight_;
    const double bound = 1.0 / std::sqrt(double(IN));
    if (rng.initialises()) own_weight_.generate([&] { return S(rng.uniform(-bound, bound)); });
    init_bias(rng, bound);
  }

  // Weight tied to (weight, dweight), shape (out, IN).
  OutputProjection(Tensor& weight, Tensor& dweight, Rng& rng, bool with_bias)
      : IN(weight.shape().size() == 2 ? int(weight.dim(1)) : 0, "tied weight width"),
        weight_(&weight), dweight_(&dweight), out_(static_cast<int>(weight.dim(0))), has_bias_(with_bias) {
    require(weight.shape().size() == 2 && weight.dim(1) == IN, "tied weight of shape ", shape_string(weight.shape()),
            " does not project from width ", IN);
    init_bias(rng, 1.0 / std::sqrt(double(IN)));
  }

  OutputProjection(const OutputProjection&) = delete;
  OutputProjection& operator=(const OutputProjection&) = delete;

  void forward(Backend& be, ConstRows<A, IN_> x, A* y) {
    require_width(x, IN, "output projection input");
    x_ = x;
    be.linear_forward(x.rows, IN, out_, x.data, weight_->product_data(), has_bias_ ? bias_.data() : nullptr, y);  // (rows, out)
  }

  void backward(Backend& be, const A* dy, Rows<A, IN_> dx) {
    if (!frozen_) {
      be.gemm(true, false, out_, IN, x_.rows, S(1), dy, out_, x_.data, IN, S(1), dweight_->data(), IN);  // (out, IN)
      if (has_bias_) be.bias_grad(x_.rows, out_, dy, dbias_.data());
    }
    if (dx.data) {
      require_rows(dx, x_.rows, "output projection input gradient");
      be.gemm(false, false, x_.rows, IN, out_, S(1), dy, out_, weight_->product_data(), IN, S(0), dx.data, IN);  // (rows, IN)
    }
  }

  void visit(ParameterVisitor<Backend> f) {
    if (weight_ == &own_weight_) f("weight", own_weight_, own_dweight_);
    if (has_bias_) f("bias", bias_, dbias_);
  }

  int out() const { return out_; }
  bool tied() const { return weight_ != &own_weight_; }
  // Frozen: backward computes the input's gradient only (LoRA's base).
  void freeze(bool on) { frozen_ = on; }

 private:
  bool frozen_ = false;
  void init_bias(Rng& rng, double bound) {
    if (!has_bias_) return;
    bias_.resize({out_});
    dbias_.resize({out_});
    if (rng.initialises()) bias_.generate([&] { return S(rng.uniform(-bound, bound)); });
  }

  [[no_unique_address]] Dim<IN_> IN;
  Tensor own_weight_, own_dweight_;  // (out, IN) unless tied
  Tensor* weight_;
  Tensor* dweight_;
  Tensor bias_, dbias_;  // (out)
  int out_;
  bool has_bias_;
  ConstRows<A, IN_> x_;
};

}  // namespace xfmr
