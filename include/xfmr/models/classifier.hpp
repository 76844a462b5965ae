// classifier.hpp: Classifier<Cfg, Backend>, sequence classification.
//
//   ids (B, T), key padding -> Encoder -> pool -> head -> logits (B, classes)
//
// Pooling: Pooling::Mean averages the encoder output over non-pad positions
// (seed 004); Pooling::Cls takes position 0, where the data pipeline puts a
// leading CLS token. The number of classes is runtime. Parameters:
// "encoder.*", "head.weight", "head.bias". backward(dlogits) accumulates
// parameter gradients. Initialisation: GPT-2 (N(0, 0.02)).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "xfmr/layers/output_projection.hpp"
#include "xfmr/models/encoder.hpp"

namespace xfmr {

enum class Pooling { Mean, Cls };

struct ClassifierOptions {
  float dropout = 0.0f;            // on the residual branches
  float attention_dropout = 0.0f;  // on the attention probabilities
  Pooling pooling = Pooling::Mean;
  Recompute recompute = Recompute::none;  // activation recompute of the blocks (block_stack.hpp)
};

template <BlockConfig Cfg, class Backend>
class Classifier {
  static_assert(xfmr::Backend<Backend>,
                "the backend lacks an operation the models call (backend/backend.hpp's Backend concept says which)");
 public:
  static constexpr int D = Cfg::D_MODEL;  // or Dynamic
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Config = Cfg;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  Classifier(int vocab, int classes, std::uint64_t seed, ClassifierOptions opts = {})
    requires(is_static_config<Cfg>())
      : Classifier(model_dims<Cfg>(), vocab, classes, seed, opts) {}
  // dims: the sizes (those Cfg fixes must agree) and knobs.
  Classifier(const ModelDims& dims, int vocab, int classes, std::uint64_t seed, ClassifierOptions opts = {})
      : rng_(seed),
        encoder_(dims, vocab, rng_, opts.dropout, opts.attention_dropout),
        width_(dims.d_model),
        head_(dims.d_model, classes, rng_, true),
        opts_(opts) {
    require(classes >= 2, "a classifier needs at least 2 classes, got ", classes);
    init_gpt2(*this, rng_);
    set_recompute(opts.recompute);
  }

  // Returns logits (B, classes).
  std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt,
                             const std::uint8_t* key_padding = nullptr) {
    bt_ = bt;
    const auto h = encoder_.forward(be, ids, bt, key_padding);  // (B*T, D)
    const std::uint8_t* exclude = pool_mask(bt, key_padding);
    const auto pooled = pooled_.rows(bt.B, width_);          // (B, D)
    be.mean_pool_forward(bt.B, bt.T, width_, h.data, exclude, pooled.data);
    A* logits = logits_.reserve(std::size_t(bt.B) * classes());  // (B, classes)
    head_.forward(be, pooled, logits);
    return {logits, std::size_t(bt.B) * classes()};
  }

  void backward(Backend& be, std::span<const A> dlogits) {  // parameter gradients accumulate
    require(dlogits.size() == std::size_t(bt_.B) * classes(), "logit gradient has ", dlogits.size(),
            " elements, expected ", std::size_t(bt_.B) * classes());
    const auto dpooled = dpooled_.rows(bt_.B, width_);
    const auto dh = dh_.rows(bt_.rows(), width_);
    head_.backward(be, dlogits.data(), dpooled);
    be.mean_pool_backward(bt_.B, bt_.T, width_, dpooled.data, exclude_, dh.data);
    encoder_.backward(be, dh);
  }

  // f(name, value, grad) for every parameter; f(keys) for every dropout
  // (through a FunctionRef: core/params.hpp).
  void visit(ParameterVisitor<Backend> f) {
    encoder_.visit(prefixed("encoder.", f));
    head_.visit(prefixed("head.", f));
  }
  void for_each_dropout(DropoutVisitor f) { encoder_.for_each_dropout(f); }
  void set_training(bool on) { encoder_.set_training(on); }
  // Activation recompute of the encoder's blocks (block_stack.hpp).
  void set_recompute(Recompute r) { encoder_.set_recompute(r); }
  Recompute recompute() const { return encoder_.recompute(); }

  int classes() const { return head_.out(); }
  int vocab() const { return encoder_.vocab(); }
  const ClassifierOptions& options() const { return opts_; }

 private:
  // Positions excluded from pooling: the padding (Mean), all but 0 (Cls).
  const std::uint8_t* pool_mask(Shape bt, const std::uint8_t* key_padding) {
    if (opts_.pooling == Pooling::Mean) return exclude_ = key_padding;
    cls_mask_.resize(std::size_t(bt.rows()));  // a mask: host memory on every backend
    std::uint8_t* m = cls_mask_.data();
    for (int b = 0; b < bt.B; ++b)
      for (int t = 0; t < bt.T; ++t) m[std::size_t(b) * bt.T + t] = t != 0;
    return exclude_ = m;
  }

  Rng rng_;
  Encoder<Cfg, Backend> encoder_;
  [[no_unique_address]] Dim<D> width_;
  OutputProjection<D, Backend> head_;
  ClassifierOptions opts_;
  Shape bt_;
  const std::uint8_t* exclude_ = nullptr;
  Buffer<A> pooled_, logits_, dpooled_, dh_;
  std::vector<std::uint8_t> cls_mask_;
};

}  // namespace xfmr
