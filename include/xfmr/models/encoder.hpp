// encoder.hpp: Encoder<Cfg, Backend>, a bidirectional transformer encoder.
//
//   ids (B, T) -> tok_emb + positions -> N EncoderBlocks (key-padding mask
//   for variable-length batches) -> ln_f (PreNorm configs only) -> hidden (B*T, D)
//
// Parameters: "tok_emb.weight", "pos_emb.weight" (learned positions),
// "blocks.<i>.*", "ln_f.*". forward() returns the hidden states, valid until
// the next forward; backward(dhidden) accumulates parameter gradients.
#pragma once

#include <cstdint>
#include <span>

#include "xfmr/blocks/encoder_block.hpp"
#include "xfmr/layers/layer_norm.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/stem.hpp"

namespace xfmr {

template <BlockConfig Cfg, class Backend>
class Encoder {
 public:
  static constexpr int D = Cfg::D_MODEL, MAX_T = Cfg::MAX_T, N_LAYERS = Cfg::N_LAYERS;
  static constexpr bool FINAL_NORM = detail::pre_norm<Cfg>();
  using S = typename Backend::Scalar;
  using Config = Cfg;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  // Takes the caller's generator so that a model holding an Encoder draws
  // from one stream; init_gpt2 is the caller's to apply.
  Encoder(int vocab, Rng& rng, float dropout = 0.0f) : stem_(vocab, rng), blocks_(N_LAYERS, rng, dropout) {}

  // key_padding: (B, T) bytes, nonzero = pad, or nullptr. Returns (B*T, D).
  ConstRows<S, D> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt,
                          const std::uint8_t* key_padding = nullptr) {
    require(bt.B > 0 && bt.T > 0, "batch ", bt.B, " x length ", bt.T, " must be positive");
    bt_ = bt;
    const int rows = bt.rows();
    const auto x = x_.template rows<D>(rows);
    const auto h = h_.template rows<D>(rows);
    stem_.forward(be, ids, x, bt);
    blocks_.forward(be, x, h, bt, key_padding);
    if constexpr (FINAL_NORM) {
      const auto hn = hn_.template rows<D>(rows);
      ln_f_.forward(be, h, hn);
      return hn;
    } else {
      return h;
    }
  }

  void backward(Backend& be, ConstRows<S, D> dhidden) {
    require_rows(dhidden, bt_.rows(), "encoder output gradient");
    const auto dx = dx_.template rows<D>(bt_.rows());
    if constexpr (FINAL_NORM) {
      const auto dh = dh_.template rows<D>(bt_.rows());
      ln_f_.backward(be, dhidden, dh);
      blocks_.backward(be, dh, dx);
    } else {
      blocks_.backward(be, dhidden, dx);
    }
    stem_.backward(be, dx);
  }

  template <class F>
  void visit(F&& f) {
    stem_.visit(f);
    blocks_.visit(f);
    if constexpr (FINAL_NORM) ln_f_.visit(prefixed("ln_f.", f));
  }
  template <class F>
  void for_each_dropout(F&& f) {
    blocks_.for_each_dropout(f);
  }

  int vocab() const { return stem_.vocab(); }

  static constexpr std::size_t parameter_count(std::size_t vocab) {
    return vocab * D + (detail::learned_positions<Cfg>() ? std::size_t(MAX_T) * D : 0) +
           std::size_t(N_LAYERS) * detail::self_block_parameters<Cfg>() + (FINAL_NORM ? 2 * D : 0);
  }

 private:
  TokenStem<Cfg, Backend> stem_;
  BlockStack<EncoderBlock<Cfg, Backend>, Backend> blocks_;
  LayerNorm<D, Backend> ln_f_;
  Shape bt_;
  Buffer<S> x_, h_, hn_, dh_, dx_;
};

}  // namespace xfmr
