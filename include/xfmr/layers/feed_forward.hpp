// feed_forward.hpp: position-wise feed-forward, y = fc2(act(fc1(x))), hidden
// width Cfg::D_FF, activation Cfg::Activation (Relu, Gelu, SwiGlu, GeGlu, or
// DynamicActivation: the one ModelParts names, chosen at run time). With a
// gated activation (SwiGlu, GeGlu) fc1 has 2 D_FF outputs, [gate | up] per
// row, and the activation halves them: y = fc2(silu(gate) * up).
//
// Saves: what fc1, the activation and fc2 save (x by pointer, the hidden
// pre- and post-activation in owned buffers); the backward's hidden
// gradients are scratch from the backend's workspace (core/workspace.hpp)
// (a gated activation's, under block recompute, written over the saved
// pre-activation: set_replayed). Backward: parameter gradients
// accumulate; dx assigned. Parameters:
// "fc1.weight" (D_FF, D), or (2 D_FF, D) gated, "fc1.bias", "fc2.weight"
// (D, D_FF), "fc2.bias" (the biases unless Cfg::BIAS is false).
#pragma once

#include <type_traits>

#include "xfmr/core/config.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/dropout.hpp"
#include "xfmr/layers/linear.hpp"

namespace xfmr {

template <BlockConfig Cfg, class Backend>
class FeedForward {
  using Act = typename Cfg::Activation;
  static constexpr bool DYNAMIC = std::is_same_v<Act, DynamicActivation>;
  using Kind = ModelParts::Activation;

  static constexpr int D_ = Cfg::D_MODEL, FF_ = Cfg::D_FF;
  static constexpr int HIDDEN_ = DYNAMIC ? Dynamic : static_or_dynamic(Act::GATED ? 2 * FF_ : FF_, {FF_});
  static_assert(!DYNAMIC || FF_ == Dynamic, "a Dynamic activation needs a Dynamic D_FF (its hidden width is decided with it)");
  // An activation that is not gated can run: fc1's outputs are the hidden width.
  static constexpr bool CAN_UNGATED = DYNAMIC || !Act::GATED;

  // The activation a static Act is.
  static constexpr Kind static_kind() {
    if constexpr (std::is_same_v<Act, Relu>) return Kind::relu;
    else if constexpr (std::is_same_v<Act, SwiGlu>) return Kind::swiglu;
    else if constexpr (std::is_same_v<Act, GeGlu>) return Kind::geglu;
    else return Kind::gelu;
  }

 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  explicit FeedForward(Rng& rng)
    requires(is_static_config<Cfg>())
      : FeedForward(model_dims<Cfg>(), rng) {}
  // d: the widths (those Cfg fixes must agree) and whether the projections have biases.
  FeedForward(const ModelDims& d, Rng& rng)
      : kind_(DYNAMIC ? d.parts.activation : static_kind()),
        FF(d.d_ff, "feed-forward width"),
        HIDDEN(gated() ? 2 * d.d_ff : d.d_ff),
        fc1_(d.d_model, HIDDEN, rng, d.bias),
        fc2_(FF, d.d_model, rng, d.bias) {
    check_model_dims<Cfg>(d);
    if constexpr (DYNAMIC) act_.set_kind(kind_);
  }

  int d_ff() const { return FF; }
  // A gated activation (SwiGlu, GeGlu): fc1 has 2 D_FF outputs.
  Kind kind() const {
    if constexpr (DYNAMIC) return kind_;
    else return static_kind();
  }
  bool gated() const { return kind() == Kind::swiglu || kind() == Kind::geglu; }
  // GELU goes through fc1's and fc2's fused products (Linear::forward_gelu,
  // backward_gelu) unless either has LoRA adapters; the other activations
  // (and GELU then) through their own operations.
  bool fused_gelu() const {
    return kind() == Kind::gelu && fc1_.adapters().empty() && fc2_.adapters().empty();
  }

  // The paths below run for the activation there is: at run time for
  // Dynamic parts, and for a static one only its own path is compiled (a
  // gated activation's widths differ from the others').
  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y) {
    const auto h = hidden_.rows(x.rows, HIDDEN);                       // (rows, HIDDEN) pre-activation
    const auto a = (shared_ ? *shared_ : activated_).rows(x.rows, FF);  // (rows, D_FF)
    if (fused_gelu()) {
      if constexpr (CAN_UNGATED) fc1_.forward_gelu(be, x, h, a);
    } else {
      fc1_.forward(be, x, h);
      if (gated()) {
        gated_forward(be, x.rows, h.data, a.data);
      } else {
        if constexpr (CAN_UNGATED) act_.forward(be, h, a);
      }
    }
    fc2_.forward(be, a, y);
  }

  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx) {
    auto scratch = be.workspace().frame();
    const auto da = scratch.rows(dy.rows, FF);  // (rows, D_FF), reused for dh when not gated
    if (shared_) {  // the activation again, where fc2 saved it
      const auto a = shared_->rows(dy.rows, FF);
      if (gated()) {
        gated_forward(be, dy.rows, hidden_.data(), a.data);
      } else {
        if constexpr (CAN_UNGATED) act_.forward(be, ConstRows<A, HIDDEN_>(hidden_.data(), dy.rows, HIDDEN), a);
      }
    }
    if (fused_gelu()) {
      if constexpr (CAN_UNGATED) {
        fc2_.backward_gelu(be, dy, ConstRows<A, FF_>(hidden_.data(), dy.rows, FF), da);  // da holds dh
        fc1_.backward(be, da, dx);
      }
      return;
    }
    fc2_.backward(be, dy, da);
    if (gated()) {
      const auto dh = replayed_ ? hidden_.rows(dy.rows, HIDDEN) : scratch.rows(dy.rows, HIDDEN);  // (rows, 2 D_FF)
      if (kind() == Kind::swiglu) SwiGlu::backward(be, dy.rows, int(FF), hidden_.data(), da.data, dh.data);
      else GeGlu::backward(be, dy.rows, int(FF), hidden_.data(), da.data, dh.data);
      fc1_.backward(be, dh, dx);
    } else if constexpr (CAN_UNGATED) {
      act_.backward(be, da, da);
      fc1_.backward(be, da, dx);
    }
  }

  // Activation recompute "cheap" (block_stack.hpp): the activation's output
  // goes into `shared` (one buffer for every block of a stack) and is
  // computed there again from the saved pre-activation just before fc2's
  // backward; nullptr: its own buffer.
  void share_activated(Buffer<A>* shared) { shared_ = shared; }
  // Block recompute (block_stack.hpp) runs the forward again before each
  // backward: a gated activation's gradient is then written over the saved
  // pre-activation (its rows x 2 D_FF of scratch saved), which otherwise
  // stays for a second backward of the same forward.
  void set_replayed(bool replayed) { replayed_ = replayed; }
  // f(buffer, the same buffer of others...) for what the last forward saved
  // (activation recompute frees or trades it, block_stack.hpp).
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    f(hidden_, others.hidden_...);
    f(activated_, others.activated_...);
  }

  // f(name, linear) for its projections (LoRA's targets).
  template <class F>
  void visit_linears(F&& f) {
    f("fc1", fc1_);
    f("fc2", fc2_);
  }

  // f(keys) for its projections' LoRA dropout, when they drop.
  void for_each_dropout(DropoutVisitor f) {
    fc1_.for_each_dropout(f);
    fc2_.for_each_dropout(f);
  }

  void visit(ParameterVisitor<Backend> f) {
    fc1_.visit(prefixed("fc1.", f));
    fc2_.visit(prefixed("fc2.", f));
  }

 private:
  void gated_forward(Backend& be, int rows, const A* h, A* y) {
    if (kind() == Kind::swiglu) SwiGlu::forward(be, rows, int(FF), h, y);
    else GeGlu::forward(be, rows, int(FF), h, y);
  }

  Kind kind_;
  [[no_unique_address]] Dim<FF_> FF;
  [[no_unique_address]] Dim<HIDDEN_> HIDDEN;  // fc1's outputs
  Linear<D_, HIDDEN_, Backend> fc1_;
  // Elementwise activations only (unused when gated; a static gated Act's is a placeholder).
  using Elementwise = std::conditional_t<DYNAMIC, DynamicActivation, std::conditional_t<Act::GATED, Relu, Act>>;
  Activation<Elementwise, FF_, Backend> act_;
  Linear<FF_, D_, Backend> fc2_;
  Buffer<A> hidden_, activated_;  // (rows, HIDDEN), (rows, D_FF)
  Buffer<A>* shared_ = nullptr;  // the activation's output under cheap recompute
  bool replayed_ = false;        // block recompute's (set_replayed)
};

}  // namespace xfmr
