// decoder.hpp: Decoder<Cfg, Backend>, a GPT-style language model.
//
//   ids (B, T) -> tok_emb + positions -> N causal DecoderOnlyBlocks
//   -> ln_f (PreNorm configs only; PostNorm blocks end normalised)
//   -> lm_head -> logits (B*T, vocab)
//
// The vocabulary size is runtime; D_MODEL, N_HEADS, N_LAYERS, D_FF, MAX_T are
// static. With tie_weights the LM head uses the token embedding matrix (as in
// GPT-2) and keeps only its bias. Parameters: "tok_emb.weight",
// "pos_emb.weight" (learned positions), "blocks.<i>.*", "ln_f.*",
// "lm_head.weight" (untied), "lm_head.bias".
// forward() returns the logits, valid until the next forward. backward(dlogits)
// accumulates every parameter gradient. Initialisation: GPT-2 (N(0, 0.02)).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include "xfmr/blocks/encoder_block.hpp"
#include "xfmr/core/config.hpp"
#include "xfmr/layers/layer_norm.hpp"
#include "xfmr/layers/output_projection.hpp"
#include "xfmr/models/stem.hpp"

namespace xfmr {

struct DecoderOptions {
  float dropout = 0.0f;
  bool tie_weights = false;
};

namespace detail {
// Parameters of one self-attention block of Cfg (what visit() lists).
template <class Cfg>
constexpr std::size_t self_block_parameters() {
  constexpr std::size_t D = Cfg::D_MODEL, H = Cfg::N_HEADS, FF = Cfg::D_FF;
  constexpr std::size_t QK = qk_head_dim<Cfg>(), V = v_head_dim<Cfg>();
  constexpr std::size_t qkv = H * (2 * QK + V), ctx = H * V;
  return 2 * (2 * D) + (D * qkv + qkv) + (ctx * D + D) + (D * FF + FF) + (FF * D + D);
}
template <class Cfg>
constexpr bool learned_positions() {
  return std::is_same_v<typename positions_tag<Cfg>::type, Learned>;
}
template <class Cfg>
constexpr bool pre_norm() {
  return std::is_same_v<typename Cfg::Norm, PreNorm>;
}
}  // namespace detail

template <BlockConfig Cfg, class Backend>
class Decoder {
 public:
  static constexpr int D = Cfg::D_MODEL, MAX_T = Cfg::MAX_T, N_LAYERS = Cfg::N_LAYERS;
  static constexpr bool FINAL_NORM = detail::pre_norm<Cfg>();
  using S = typename Backend::Scalar;
  using Config = Cfg;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  Decoder(int vocab, std::uint64_t seed, DecoderOptions opts = {})
      : rng_(seed), stem_(vocab, rng_), blocks_(N_LAYERS, rng_, opts.dropout), opts_(opts) {
    auto& emb = stem_.token_embedding();
    if (opts.tie_weights) {
      emb.visit([&](std::string_view, auto& value, auto& grad) { head_.emplace(value, grad, rng_, true); });
    } else {
      head_.emplace(vocab, rng_, true);
    }
    init_gpt2(*this, rng_);
  }
  Decoder(const Decoder&) = delete;  // the tied head points into this object
  Decoder& operator=(const Decoder&) = delete;

  // ids: B*T token ids in [0, vocab). Returns logits (B*T, vocab).
  std::span<const S> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt) {
    require(bt.B > 0 && bt.T > 0, "batch ", bt.B, " x length ", bt.T, " must be positive");
    bt_ = bt;
    const int rows = bt.rows();
    const auto x = x_.template rows<D>(rows);  // (B*T, D) embeddings
    const auto h = h_.template rows<D>(rows);  // (B*T, D) after the blocks
    stem_.forward(be, ids, x, bt);
    blocks_.forward(be, x, h, bt);
    ConstRows<S, D> top = h;
    if constexpr (FINAL_NORM) {
      const auto hn = hn_.template rows<D>(rows);
      ln_f_.forward(be, h, hn);
      top = hn;
    }
    S* logits = logits_.reserve(std::size_t(rows) * vocab());  // (B*T, vocab)
    head_->forward(be, top, logits);
    return {logits, std::size_t(rows) * vocab()};
  }

  // dlogits (B*T, vocab) for the last forward.
  void backward(Backend& be, std::span<const S> dlogits) {
    const int rows = bt_.rows();
    require(dlogits.size() == std::size_t(rows) * vocab(), "logit gradient has ", dlogits.size(),
            " elements, expected ", std::size_t(rows) * vocab());
    const auto dtop = dh_.template rows<D>(rows);
    const auto dx = dx_.template rows<D>(rows);
    head_->backward(be, dlogits.data(), dtop);
    if constexpr (FINAL_NORM) {
      const auto dh = dhn_.template rows<D>(rows);
      ln_f_.backward(be, dtop, dh);
      blocks_.backward(be, dh, dx);
    } else {
      blocks_.backward(be, dtop, dx);
    }
    stem_.backward(be, dx);
  }

  template <class F>
  void visit(F&& f) {
    stem_.visit(f);
    blocks_.visit(f);
    if constexpr (FINAL_NORM) ln_f_.visit(prefixed("ln_f.", f));
    head_->visit(prefixed("lm_head.", f));
  }

  template <class F>
  void for_each_dropout(F&& f) {
    blocks_.for_each_dropout(f);
  }
  void set_training(bool on) {
    for_each_dropout([on](auto& d) { d.set_training(on); });
  }

  int vocab() const { return stem_.vocab(); }
  const DecoderOptions& options() const { return opts_; }
  BlockStack<DecoderOnlyBlock<Cfg, Backend>, Backend>& blocks() { return blocks_; }

  // What visit() lists, from the configuration alone.
  static constexpr std::size_t parameter_count(std::size_t vocab, bool tie_weights) {
    return vocab * D + (detail::learned_positions<Cfg>() ? std::size_t(MAX_T) * D : 0) +
           std::size_t(N_LAYERS) * detail::self_block_parameters<Cfg>() + (FINAL_NORM ? 2 * D : 0) +
           (tie_weights ? 0 : vocab * D) + vocab;
  }

 private:
  Rng rng_;
  TokenStem<Cfg, Backend> stem_;
  BlockStack<DecoderOnlyBlock<Cfg, Backend>, Backend> blocks_;
  LayerNorm<D, Backend> ln_f_;
  std::optional<OutputProjection<D, Backend>> head_;
  DecoderOptions opts_;
  Shape bt_;
  Buffer<S> x_, h_, hn_, logits_, dh_, dhn_, dx_;
};

}  // namespace xfmr
