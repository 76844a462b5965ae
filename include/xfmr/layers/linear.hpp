// linear.hpp: y = x W^T + b, with W (OUT, IN) laid out as torch.nn.Linear.
//
// Saves: a pointer to x (the caller keeps x alive and unchanged until
// backward). Backward: dW, db accumulate (+=); dx is assigned, and skipped
// when dx has no data (an input that needs no gradient). forward_gelu and
// backward_gelu put GELU after it and before it (FeedForward), through the
// backend's fused products (backend/cpu/linear.hpp).
// Parameters: "weight" (OUT, IN), "bias" (OUT) when enabled.
// Low-rank adapters (adapters(), layers/lora.hpp) add to its outputs; with
// them the base may be frozen: backward then leaves dW and db untouched.
// The fused GELU paths take no adapters (FeedForward runs GELU apart then).
#pragma once

#include <cmath>

#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/dropout.hpp"
#include "xfmr/layers/lora.hpp"

namespace xfmr {

template <int IN_, int OUT_, class Backend>
class Linear {
  static_assert((IN_ > 0 || IN_ == Dynamic) && (OUT_ > 0 || OUT_ == Dynamic),
                "Linear needs positive input and output widths (or xfmr::Dynamic)");

 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;
  static constexpr int IN_FEATURES = IN_, OUT_FEATURES = OUT_;

  // torch.nn.Linear's default initialisation: U(-1/sqrt(IN), 1/sqrt(IN)).
  explicit Linear(Rng& rng, bool with_bias = true)
    requires(IN_ != Dynamic && OUT_ != Dynamic)
      : Linear(IN_, OUT_, rng, with_bias) {}
  Linear(int in, int out, Rng& rng, bool with_bias = true)
      : IN(in, "Linear input width"), OUT(out, "Linear output width"), has_bias_(with_bias), adapters_(in, out) {
    weight_.resize({OUT, IN});
    dweight_.resize({OUT, IN});
    const double bound = 1.0 / std::sqrt(double(IN));
    if (rng.initialises()) weight_.generate([&] { return S(rng.uniform(-bound, bound)); });
    if (has_bias_) {
      bias_.resize({OUT});
      dbias_.resize({OUT});
      if (rng.initialises()) bias_.generate([&] { return S(rng.uniform(-bound, bound)); });
    }
  }

  void forward(Backend& be, ConstRows<A, IN_> x, Rows<A, OUT_> y) {
    check(x, y);
    x_ = x;
    be.linear_forward(x.rows, IN, OUT, x.data, weight_.product_data(), bias(), y.data);
    if (!adapters_.empty()) adapters_.forward(be, x.rows, x.data, y.data);
  }

  // Linear then GELU (FeedForward): h = x W^T + b, the pre-activation, and
  // y = gelu(h), in one pass where the backend fuses them.
  void forward_gelu(Backend& be, ConstRows<A, IN_> x, Rows<A, OUT_> h, Rows<A, OUT_> y) {
    check(x, h);
    check(x, y);
    require(adapters_.empty(), "Linear::forward_gelu: LoRA adapters need GELU apart (FeedForward's unfused path)");
    x_ = x;
    be.linear_gelu_forward(x.rows, IN, OUT, x.data, weight_.product_data(), bias(), h.data, y.data);
  }

  void backward(Backend& be, ConstRows<A, OUT_> dy, Rows<A, IN_> dx) {
    parameter_gradients(be, dy);
    if (dx.data) {
      require_rows(dx, x_.rows, "Linear input gradient");
      require_width(dx, IN, "Linear input gradient");
      be.gemm(false, false, dy.rows, IN, OUT, S(1), dy.data, OUT, weight_.product_data(), IN, S(0), dx.data, IN);  // (rows, IN)
    }
    if (!adapters_.empty()) adapters_.backward(be, dy.rows, dy.data, x_.data, dx.data);
  }

  // backward() where the saved input was gelu(h): the gradient goes through
  // GELU on its way out, dh = gelu'(h) * (dy W), with the product where the
  // backend fuses them.
  void backward_gelu(Backend& be, ConstRows<A, OUT_> dy, ConstRows<A, IN_> h, Rows<A, IN_> dh) {
    require(adapters_.empty(), "Linear::backward_gelu: LoRA adapters need GELU apart (FeedForward's unfused path)");
    parameter_gradients(be, dy);
    require_rows(h, x_.rows, "Linear input pre-activation");
    require_rows(dh, x_.rows, "Linear input pre-activation gradient");
    require_width(h, IN, "Linear input pre-activation");
    require_width(dh, IN, "Linear input pre-activation gradient");
    be.linear_dgelu_input_grad(dy.rows, IN, OUT, dy.data, weight_.product_data(), h.data, dh.data);
  }

  void visit(ParameterVisitor<Backend> f) {
    f("weight", weight_, dweight_);
    if (has_bias_) f("bias", bias_, dbias_);
  }

  // f(keys) for its adapters' dropout, when they drop.
  void for_each_dropout(DropoutVisitor f) {
    adapters_.for_each_dropout(f);
  }

  bool has_bias() const { return has_bias_; }
  int in() const { return IN; }
  int out() const { return OUT; }
  Tensor& weight() { return weight_; }
  const Tensor& weight() const { return weight_; }
  Tensor* bias_tensor() { return has_bias_ ? &bias_ : nullptr; }
  // Its low-rank adapters, and whether the base is frozen (layers/lora.hpp).
  LinearAdapters<Backend>& adapters() { return adapters_; }
  const LinearAdapters<Backend>& adapters() const { return adapters_; }

 private:
  [[no_unique_address]] Dim<IN_> IN;
  [[no_unique_address]] Dim<OUT_> OUT;
  Tensor weight_, dweight_;  // (OUT, IN)
  Tensor bias_, dbias_;      // (OUT)
  bool has_bias_;
  LinearAdapters<Backend> adapters_;
  ConstRows<A, IN_> x_;      // saved input, (rows, IN)

  const S* bias() const { return has_bias_ ? bias_.data() : nullptr; }
  void check(ConstRows<A, IN_> x, ConstRows<A, OUT_> y) const {
    require_rows(y, x.rows, "Linear output");
    require_width(x, IN, "Linear input");
    require_width(y, OUT, "Linear output");
  }
  void parameter_gradients(Backend& be, ConstRows<A, OUT_> dy) {
    require_rows(dy, x_.rows, "Linear output gradient");
    require_width(dy, OUT, "Linear output gradient");
    if (adapters_.frozen()) return;
    be.gemm(true, false, OUT, IN, dy.rows, S(1), dy.data, OUT, x_.data, IN, S(1), dweight_.data(), IN);  // (OUT, IN)
    if (has_bias_) be.bias_grad(dy.rows, OUT, dy.data, dbias_.data());
  }
};

}  // namespace xfmr
