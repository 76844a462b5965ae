// any_norm.hpp: AnyNorm<D, Backend>, a norm layer whose kind is chosen at
// run time (ModelParts::rms_norm): RmsNorm or LayerNorm, with that layer's
// parameters ("weight", and LayerNorm's "bias"), saved buffers and numbers.
// A configuration of Dynamic parts names it as its norm layer
// (template <int D, class Be> using NormLayer = xfmr::AnyNorm<D, Be>).
//
// make_norm<NormLayer>(width, eps, rms): a configuration's norm layer, the
// kind given to an AnyNorm and fixed by the type otherwise.
#pragma once

#include <optional>
#include <type_traits>

#include "xfmr/core/params.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/layer_norm.hpp"
#include "xfmr/layers/rms_norm.hpp"

namespace xfmr {

template <int D_, class Backend>
class AnyNorm {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;

  AnyNorm(int width, S eps, bool rms) {
    if (rms) rms_.emplace(width, eps);
    else ln_.emplace(width, eps);
  }

  bool rms() const { return rms_.has_value(); }

  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y) {
    if (rms_) rms_->forward(be, x, y);
    else ln_->forward(be, x, y);
  }
  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx) {
    if (rms_) rms_->backward(be, dy, dx);
    else ln_->backward(be, dy, dx);
  }
  void visit(ParameterVisitor<Backend> f) {
    if (rms_) rms_->visit(f);
    else ln_->visit(f);
  }
  // others: norms of the same kind (a stack's blocks).
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    if (rms_) rms_->for_each_saved(f, *others.rms_...);
    else ln_->for_each_saved(f, *others.ln_...);
  }

 private:
  template <int, class>
  friend class AnyNorm;
  std::optional<LayerNorm<D_, Backend>> ln_;
  std::optional<RmsNorm<D_, Backend>> rms_;
};

template <class NormLayer, class S>
NormLayer make_norm(int width, S eps, bool rms) {
  if constexpr (std::is_constructible_v<NormLayer, int, S, bool>) return NormLayer(width, eps, rms);
  else return NormLayer(width, eps);
}

}  // namespace xfmr
