// feed_forward.hpp: position-wise feed-forward, y = fc2(act(fc1(x))), hidden
// width Cfg::D_FF, activation Cfg::Activation (Relu or Gelu).
//
// Saves: what fc1, the activation and fc2 save (x by pointer, the hidden
// pre- and post-activation in owned buffers). Backward: parameter gradients
// accumulate; dx assigned. Parameters: "fc1.weight" (D_FF, D), "fc1.bias",
// "fc2.weight" (D, D_FF), "fc2.bias".
#pragma once

#include "xfmr/core/config.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/linear.hpp"

namespace xfmr {

template <BlockConfig Cfg, class Backend>
class FeedForward {
 public:
  static constexpr int D = Cfg::D_MODEL, FF = Cfg::D_FF;
  using S = typename Backend::Scalar;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  explicit FeedForward(Rng& rng) : fc1_(rng), fc2_(rng) {}

  void forward(Backend& be, ConstRows<S, D> x, Rows<S, D> y) {
    const auto h = hidden_.template rows<FF>(x.rows);     // (rows, D_FF) pre-activation
    const auto a = activated_.template rows<FF>(x.rows);  // (rows, D_FF)
    fc1_.forward(be, x, h);
    act_.forward(be, h, a);
    fc2_.forward(be, a, y);
  }

  void backward(Backend& be, ConstRows<S, D> dy, Rows<S, D> dx) {
    const auto da = dhidden_.template rows<FF>(dy.rows);  // (rows, D_FF), reused for dh
    fc2_.backward(be, dy, da);
    act_.backward(be, da, da);
    fc1_.backward(be, da, dx);
  }

  template <class F>
  void visit(F&& f) {
    fc1_.visit(prefixed("fc1.", f));
    fc2_.visit(prefixed("fc2.", f));
  }

 private:
  Linear<D, FF, Backend> fc1_;
  Activation<typename Cfg::Activation, FF, Backend> act_;
  Linear<FF, D, Backend> fc2_;
  Buffer<S> hidden_, activated_, dhidden_;
};

}  // namespace xfmr
