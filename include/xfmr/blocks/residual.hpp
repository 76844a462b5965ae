// residual.hpp: one residual sublayer with its norm and dropout, under a
// Norm policy:
//   PreNorm      y = x + dropout(f(LN(x)))   (GPT-2, the seeds' char models)
//   PostNorm     y = LN(x + dropout(f(x)))   (Vaswani et al. 2017)
//   DynamicNorm  either, chosen at run time (ModelParts::pre_norm): a
//                configuration of Dynamic parts
// LN is the configuration's norm layer (norm_layer_t): LayerNorm, or
// RmsNorm for a configuration with
//   template <int D, class Be> using NormLayer = xfmr::RmsNorm<D, Be>;
// f is the wrapped sublayer (attention or feed-forward), given to forward as
// f(in, out) and to backward as g(dout, din) with din assigned.
//
// Saves: the normalised input (PreNorm; under cheap recompute, in a buffer
// shared by a stack's blocks, recomputed in backward) or the residual sum
// (PostNorm), and what LN and dropout save. f's output, before dropout and
// the sum, and the backward's gradients are scratch from the backend's
// workspace (core/workspace.hpp). Backward: parameter gradients
// accumulate; dx is assigned and must not alias dy. Parameters: the norm's
// ("weight", and LayerNorm's "bias").
#pragma once

#include <cstdint>
#include <type_traits>

#include "xfmr/core/config.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/any_norm.hpp"
#include "xfmr/layers/dropout.hpp"
#include "xfmr/layers/layer_norm.hpp"
#include "xfmr/layers/rms_norm.hpp"

namespace xfmr {

struct PreNorm {
  static constexpr const char* name = "pre-norm";
};
struct PostNorm {
  static constexpr const char* name = "post-norm";
};
struct DynamicNorm {
  static constexpr const char* name = "dynamic";
};

namespace detail {
template <class Cfg, int D, class Backend>
struct NormLayerOf {
  using type = LayerNorm<D, Backend>;
};
template <class Cfg, int D, class Backend>
  requires requires { typename Cfg::template NormLayer<D, Backend>; }
struct NormLayerOf<Cfg, D, Backend> {
  using type = typename Cfg::template NormLayer<D, Backend>;
};
}  // namespace detail

// The configuration's norm layer: Cfg::NormLayer<D, Backend> (RmsNorm, say),
// or LayerNorm where the configuration names none.
template <class Cfg, int D, class Backend>
using norm_layer_t = typename detail::NormLayerOf<Cfg, D, Backend>::type;

template <class Norm, int D_, class Backend, class NormLayer = LayerNorm<D_, Backend>>
class Residual {
  static_assert(std::is_same_v<Norm, PreNorm> || std::is_same_v<Norm, PostNorm> || std::is_same_v<Norm, DynamicNorm>,
                "Norm must be xfmr::PreNorm, xfmr::PostNorm or xfmr::DynamicNorm");
  static constexpr bool DYNAMIC = std::is_same_v<Norm, DynamicNorm>;

 public:
  using A = typename Backend::Activation;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  Residual(float dropout, std::uint64_t seed)
    requires(D_ != Dynamic)
      : Residual(D_, 1e-5, dropout, seed) {}
  // width and eps: the norm's (a static Norm and norm layer).
  Residual(int width, double eps, float dropout, std::uint64_t seed)
    requires(!DYNAMIC)
      : D(width, "residual width"), norm_(width, typename Backend::Scalar(eps)), drop_(dropout, seed) {}
  // d: the width, the norm's epsilon, and for Dynamic parts the norm's place and kind.
  Residual(const ModelDims& d, float dropout, std::uint64_t seed)
      : D(d.d_model, "residual width"),
        norm_(make_norm<NormLayer>(d.d_model, typename Backend::Scalar(d.norm_eps), d.parts.rms_norm)),
        drop_(dropout, seed),
        pre_(d.parts.pre_norm) {}

  // y = x + f(LN(x)), else LN(x + f(x)).
  bool pre_norm() const {
    if constexpr (DYNAMIC) return pre_;
    else return std::is_same_v<Norm, PreNorm>;
  }

  template <class F>
  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y, F&& f) {
    require_rows(y, x.rows, "residual output");
    auto scratch = be.workspace().frame();
    const auto sub = scratch.rows(x.rows, D);  // (rows, D) f's output, dropped in place
    if (pre_norm()) {
      const auto h = (shared_ ? *shared_ : inner_).rows(x.rows, D);  // LN(x)
      x_ = x;
      norm_.forward(be, x, h);
      f(ConstRows<A, D_>(h), sub);
      drop_.forward(be, sub, sub);
      be.add(x.size(), x.data, sub.data, y.data);
    } else {
      const auto z = inner_.rows(x.rows, D);  // x + dropout(f(x))
      f(x, sub);
      drop_.forward(be, sub, sub);
      be.add(x.size(), x.data, sub.data, z.data);
      norm_.forward(be, z, y);
    }
  }

  template <class G>
  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx, G&& g) {
    require_rows(dx, dy.rows, "residual input gradient");
    auto scratch = be.workspace().frame();
    const auto dsub = scratch.rows(dy.rows, D);  // (rows, D)
    if (pre_norm()) {
      const auto dh = scratch.rows(dy.rows, D);  // d LN(x)
      drop_.backward(be, dy, dsub);
      if (shared_) norm_.forward(be, x_, shared_->rows(dy.rows, D));  // LN(x) again, where f saved it
      g(ConstRows<A, D_>(dsub), dh);
      norm_.backward(be, dh, dx);
      be.add_to(dy.size(), dy.data, dx.data);
    } else {
      const auto dz = scratch.rows(dy.rows, D);  // d (x + dropout(f(x)))
      norm_.backward(be, dy, dz);
      drop_.backward(be, dz, dsub);
      g(ConstRows<A, D_>(dsub), dx);
      be.add_to(dz.size(), dz.data, dx.data);
    }
  }

  void visit(ParameterVisitor<Backend> f) {
    norm_.visit(f);
  }

  // f(DropoutKeys&) for the sublayer's dropout: to save or restore its call counter.
  void for_each_dropout(DropoutVisitor f) {
    f(static_cast<DropoutKeys&>(drop_));
  }
  const DropoutKeys& dropout() const { return drop_; }
  // Activation recompute "cheap" (block_stack.hpp): a PreNorm residual
  // writes LN(x) into `shared` (one buffer for the norms of every block of
  // a stack, so the sublayer's saved pointer into it stays valid) and
  // computes it there again just before its sublayer's backward; nullptr:
  // its own buffer. PostNorm keeps its own (its norm's input is the
  // sublayer's output: not cheap to recompute).
  void share_norm_output(Buffer<A>* shared) {
    if (pre_norm()) shared_ = shared;
  }
  // f(buffer, the same buffer of others...) for what the last forward saved
  // (block_stack.hpp's block recompute frees or trades it); others are
  // residuals of this type.
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    norm_.for_each_saved(f, others.norm_...);
    drop_.for_each_saved(f, others.drop_...);
    f(inner_, others.inner_...);
  }

 private:
  [[no_unique_address]] Dim<D_> D;
  NormLayer norm_;
  Dropout<D_, Backend> drop_;
  Buffer<A> inner_;              // LN(x) (PreNorm) or x + dropout(f(x)) (PostNorm)
  Buffer<A>* shared_ = nullptr;  // LN(x) under cheap recompute (PreNorm)
  ConstRows<A, D_> x_;           // the input, for that recompute
  bool pre_ = true;              // DynamicNorm's place
};

}  // namespace xfmr
