// transformer.hpp: Transformer<Cfg, Backend, CAUSAL>, the trunk the sequence
// models share:
//
//   ids (B, T) -> tok_emb + positions -> N self-attention blocks (causal or
//   with key padding) -> ln_f (PreNorm configs only; PostNorm blocks end
//   normalised) -> hidden (B*T, D)
//
// Encoder<Cfg, Backend> is the non-causal trunk; Decoder puts an LM head on
// the causal one. Parameters: "tok_emb.weight", "pos_emb.weight" (learned
// positions), "blocks.<i>.*", "ln_f.*". forward() returns the hidden states,
// valid until the next forward; backward(dhidden) accumulates every parameter
// gradient. The constructor draws from the caller's generator, so a model
// holding a trunk initialises from one stream.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "xfmr/blocks/block_stack.hpp"
#include "xfmr/blocks/encoder_block.hpp"
#include "xfmr/core/config.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/layers/dropout.hpp"
#include "xfmr/layers/kv_cache.hpp"
#include "xfmr/layers/layer_norm.hpp"
#include "xfmr/layers/token_stem.hpp"

namespace xfmr {

namespace detail {
template <class Cfg>
constexpr bool pre_norm() {
  return std::is_same_v<typename Cfg::Norm, PreNorm>;
}
// Whether a trunk ends in a final norm: PreNorm blocks (PostNorm ones end
// normalised), for DynamicNorm the parts' place.
template <class Cfg>
bool final_norm(const ModelDims& d) {
  if constexpr (std::is_same_v<typename Cfg::Norm, DynamicNorm>) return d.parts.pre_norm;
  else return pre_norm<Cfg>();
}
}  // namespace detail

template <BlockConfig Cfg, class Backend, bool CAUSAL>
class Transformer {
  static_assert(xfmr::Backend<Backend>,
                "the backend lacks an operation the models call (backend/backend.hpp's Backend concept says which)");
 public:
  static constexpr int D = Cfg::D_MODEL;  // or Dynamic
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Config = Cfg;
  using Block = SelfAttentionBlock<Cfg, Backend, CAUSAL>;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  Transformer(int vocab, Rng& rng, float dropout = 0.0f, float attention_dropout = 0.0f)
    requires(is_static_config<Cfg>())
      : Transformer(model_dims<Cfg>(), vocab, rng, dropout, attention_dropout) {}
  // d: the sizes (those Cfg fixes must agree) and knobs.
  Transformer(const ModelDims& d, int vocab, Rng& rng, float dropout = 0.0f, float attention_dropout = 0.0f)
      : dims_((check_model_dims<Cfg>(d), d)),
        width_(d.d_model, "model width"),
        stem_(d, vocab, rng),
        blocks_(d, rng, dropout, attention_dropout),
        ln_f_(make_norm<norm_layer_t<Cfg, D, Backend>>(d.d_model, S(d.norm_eps), d.parts.rms_norm)),
        final_norm_(detail::final_norm<Cfg>(d)) {}

  // key_padding: (B, T) bytes, nonzero = pad, or nullptr. Returns (B*T, D).
  ConstRows<A, D> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt,
                          const std::uint8_t* key_padding = nullptr) {
    require(bt.B > 0 && bt.T > 0, "batch ", bt.B, " x length ", bt.T, " must be positive");
    bt_ = bt;
    const int rows = bt.rows();
    const auto x = x_.rows(rows, width_);  // (B*T, D) embeddings
    const auto h = h_.rows(rows, width_);  // (B*T, D) after the blocks
    stem_.forward(be, ids, x, bt);
    blocks_.forward(be, x, h, bt, key_padding);
    return finish(be, h);
  }

  // Causal trunks: a cache for B sequences of up to `capacity` positions
  // (0: MAX_T), empty.
  void start_cache(DecodingCache<Backend>& cache, int B, int capacity = 0)
    requires CAUSAL
  {
    cache.layers().resize(dims_.n_layers);
    for (int i = 0; i < dims_.n_layers; ++i) blocks_[i].attention().start_cache(cache[i], B, capacity);
  }

  // The hidden states of n new positions of each of B sequences (ids B*n),
  // continuing the cached ones. Inference only.
  ConstRows<A, D> forward_cached(Backend& be, std::span<const std::int32_t> ids, int B, DecodingCache<Backend>& cache)
    requires CAUSAL
  {
    require(B > 0 && !ids.empty() && ids.size() % B == 0, ids.size(), " ids for ", B, " sequences");
    require(cache.batch() == B, "the cache holds ", cache.batch(), " sequences, not ", B);
    const Shape bt{B, static_cast<int>(ids.size()) / B};
    require(cache.length() + bt.T <= dims_.max_t, "decoding past MAX_T ", dims_.max_t, ": ", cache.length(),
            " cached + ", bt.T, " new positions");
    const int rows = bt.rows();
    const auto x = x_.rows(rows, width_);
    const auto h = h_.rows(rows, width_);
    stem_.forward(be, ids, x, bt, cache.length());
    blocks_.forward_cached(be, x, h, B, cache);
    return finish(be, h);
  }

  // The hidden states of a ragged step's rows (ids: the segments' new ids,
  // in segment order; layers/kv_cache.hpp), each sequence continuing its own
  // cache row. Inference only.
  ConstRows<A, D> forward_cached(Backend& be, std::span<const std::int32_t> ids, RaggedStep step,
                                 DecodingCache<Backend>& cache)
    requires CAUSAL
  {
    require(!step.empty() && cache.layers().size() == std::size_t(dims_.n_layers),
            "a ragged step needs segments and a cache started for this model");
    const int rows = static_cast<int>(ids.size());
    const auto x = x_.rows(rows, width_);
    const auto h = h_.rows(rows, width_);
    int r = 0;
    for (const StepSegment& s : step) {
      require(s.rows > 0 && r + s.rows <= rows, "a ragged step's segments hold more rows than its ", rows, " ids");
      require(s.start >= 0 && s.start + s.rows <= dims_.max_t, "decoding past MAX_T ", dims_.max_t, ": ", s.start,
              " cached + ", s.rows, " new positions");
      stem_.forward(be, ids.subspan(r, s.rows), Rows<A, D>(x.row(r), s.rows, width_), {1, s.rows}, s.start);
      r += s.rows;
    }
    require(r == rows, "a ragged step's segments hold ", r, " rows for ", rows, " ids");
    blocks_.forward_cached(be, x, h, step, cache);
    return finish(be, h);
  }

  void backward(Backend& be, ConstRows<A, D> dhidden) {
    require_rows(dhidden, bt_.rows(), "transformer output gradient");
    const auto dx = dx_.rows(bt_.rows(), width_);
    if (final_norm_) {
      const auto dh = dh_.rows(bt_.rows(), width_);
      ln_f_.backward(be, dhidden, dh);
      blocks_.backward(be, dh, dx);
    } else {
      blocks_.backward(be, dhidden, dx);
    }
    if (!frozen_stem_) stem_.backward(be, dx);
  }
  // The embeddings take no gradient (a frozen base: LoRA).
  void freeze_stem(bool on) { frozen_stem_ = on; }

  void visit(ParameterVisitor<Backend> f) {
    stem_.visit(f);
    blocks_.visit(f);
    if (final_norm_) ln_f_.visit(prefixed("ln_f.", f));
  }
  void for_each_dropout(DropoutVisitor f) {
    blocks_.for_each_dropout(f);
  }
  // f(name, linear) for the blocks' projections (LoRA's targets).
  template <class F>
  void visit_linears(F&& f) {
    blocks_.visit_linears(f);
  }
  void set_training(bool on) {
    for_each_dropout([on](auto& d) { d.set_training(on); });
  }
  // Activation recompute of the blocks (block_stack.hpp).
  void set_recompute(Recompute r) { blocks_.set_recompute(r); }
  Recompute recompute() const { return blocks_.recompute(); }

  int vocab() const { return stem_.vocab(); }
  // The sizes and knobs it was built with.
  const ModelDims& dims() const { return dims_; }
  Embedding<D, Backend>& token_embedding() { return stem_.token_embedding(); }
  BlockStack<Block, Backend>& blocks() { return blocks_; }

 private:
  // The last block's output, normalised by ln_f in PreNorm configurations.
  ConstRows<A, D> finish(Backend& be, ConstRows<A, D> h) {
    if (final_norm_) {
      const auto hn = hn_.rows(h.rows, width_);
      ln_f_.forward(be, h, hn);
      return hn;
    } else {
      return h;
    }
  }

  ModelDims dims_;
  [[no_unique_address]] Dim<D> width_;
  TokenStem<Cfg, Backend> stem_;
  BlockStack<Block, Backend> blocks_;
  norm_layer_t<Cfg, D, Backend> ln_f_;
  bool final_norm_;  // ln_f ends the trunk (PreNorm blocks)
  Shape bt_;
  Buffer<A> x_, h_, hn_, dh_, dx_;
  bool frozen_stem_ = false;
};

}  // namespace xfmr
