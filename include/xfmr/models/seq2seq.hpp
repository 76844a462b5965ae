// seq2seq.hpp: Seq2Seq<EncCfg, DecCfg, Backend>, the encoder-decoder
// translator (Vaswani et al. 2017).
//
//   src ids (B, S), source padding -> Encoder -> memory (B*S, D)
//   tgt ids (B, T), target padding -> tok_emb + positions -> N_LAYERS
//     DecoderBlocks (causal self-attention, cross-attention to memory,
//     feed-forward) -> ln_f (PreNorm configs) -> lm_head -> logits (B*T, V_tgt)
//
// Both configurations share D_MODEL; layers, heads, widths and positions may
// differ. Parameters: "encoder.*", "decoder.tok_emb.weight" (unless shared:
// then encoder.tok_emb.weight embeds both sides, from one joint vocabulary),
// "decoder.pos_emb.weight" (learned), "decoder.blocks.<i>.*",
// "decoder.ln_f.*", "lm_head.weight" (unless tied to the target embedding),
// "lm_head.bias". backward(dlogits) accumulates every parameter gradient,
// the encoder's through the sum of the blocks' memory gradients.
// Initialisation: GPT-2 (N(0, 0.02)).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "xfmr/blocks/decoder_block.hpp"
#include "xfmr/layers/output_projection.hpp"
#include "xfmr/models/transformer.hpp"

namespace xfmr {

struct Seq2SeqOptions {
  float dropout = 0.0f;            // on the residual branches
  float attention_dropout = 0.0f;  // on the attention probabilities (self and cross)
  bool tie_output = false;         // lm_head uses the target embedding matrix
  bool share_embeddings = false;   // one token table for source and target (one joint vocabulary)
  Recompute recompute = Recompute::none;  // activation recompute of the blocks (block_stack.hpp)
};

// State for decoding B sequences against an encoded source: the target
// self-attention caches and each layer's memory keys/values.
template <class Backend>
struct Seq2SeqDecodeState {
  DecodingCache<Backend> self;
  typename Backend::template Buffer<typename Backend::Activation> memory_kv;  // (N_DEC, B*S, H*(QK+V))
  std::vector<std::uint8_t> src_padding;
  int B = 0, src_len = 0;
};

template <BlockConfig EncCfg, BlockConfig DecCfg, class Backend>
class Seq2Seq {
  static_assert(xfmr::Backend<Backend>,
                "the backend lacks an operation the models call (backend/backend.hpp's Backend concept says which)");
  static_assert(EncCfg::D_MODEL == DecCfg::D_MODEL || EncCfg::D_MODEL == Dynamic || DecCfg::D_MODEL == Dynamic,
                "encoder and decoder must share D_MODEL");

 public:
  static constexpr int D = DecCfg::D_MODEL;  // or Dynamic
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Block = DecoderBlock<DecCfg, Backend>;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  Seq2Seq(int src_vocab, int tgt_vocab, std::uint64_t seed, Seq2SeqOptions opts = {})
    requires(is_static_config<EncCfg>() && is_static_config<DecCfg>())
      : Seq2Seq(model_dims<EncCfg>(), model_dims<DecCfg>(), src_vocab, tgt_vocab, seed, opts) {}
  // enc, dec: each side's sizes (those its configuration fixes must agree; one width) and knobs.
  Seq2Seq(const ModelDims& enc, const ModelDims& dec, int src_vocab, int tgt_vocab, std::uint64_t seed,
          Seq2SeqOptions opts = {})
      : rng_(seed),
        encoder_(enc, src_vocab, rng_, opts.dropout, opts.attention_dropout),
        dec_((check_model_dims<DecCfg>(dec), same_width(enc, dec))),
        width_(dec.d_model),
        stem_(dec, tgt_vocab, rng_, opts.share_embeddings ? &encoder_.token_embedding() : nullptr),
        blocks_(dec, rng_, opts.dropout, opts.attention_dropout),
        ln_f_(make_norm<norm_layer_t<DecCfg, D, Backend>>(dec.d_model, S(dec.norm_eps), dec.parts.rms_norm)),
        final_norm_(detail::final_norm<DecCfg>(dec)),
        opts_(opts) {
    if (opts.tie_output) {
      auto& emb = stem_.token_embedding();
      head_.emplace(emb.weight(), emb.grad(), rng_, true);
    } else {
      head_.emplace(dec.d_model, tgt_vocab, rng_, true);
    }
    init_gpt2(*this, rng_);
    set_recompute(opts.recompute);
  }
  Seq2Seq(const Seq2Seq&) = delete;
  Seq2Seq& operator=(const Seq2Seq&) = delete;

  // Encodes the source; the memory stays valid until the next encode/forward.
  ConstRows<A, D> encode(Backend& be, std::span<const std::int32_t> src, Shape src_shape,
                         const std::uint8_t* src_padding = nullptr) {
    src_shape_ = src_shape;
    src_padding_ = src_padding;
    memory_ = encoder_.forward(be, src, src_shape, src_padding);
    return memory_;
  }

  // Teacher-forced decoding of tgt (B, T) against the encoded source.
  std::span<const A> forward(Backend& be, std::span<const std::int32_t> src, Shape src_shape,
                             const std::uint8_t* src_padding, std::span<const std::int32_t> tgt, Shape tgt_shape,
                             const std::uint8_t* tgt_padding = nullptr) {
    require(src_shape.B == tgt_shape.B, "source batch ", src_shape.B, " and target batch ", tgt_shape.B, " differ");
    encode(be, src, src_shape, src_padding);
    tgt_shape_ = tgt_shape;
    const int rows = tgt_shape.rows();
    const auto x = x_.rows(rows, width_);  // (B*T, D) target embeddings
    const auto h = h_.rows(rows, width_);  // (B*T, D) after the blocks
    stem_.forward(be, tgt, x, tgt_shape);
    blocks_.train_each(x, h, [&](Block& b, int, ConstRows<A, D> in, Rows<A, D> out) {
      b.forward(be, in, memory_, out, tgt_shape, src_shape, tgt_padding, src_padding);
    });
    return project(be, h);
  }

  // ---- decoding (inference) ----------------------------------------------

  using DecodeState = Seq2SeqDecodeState<Backend>;

  // Starts decoding against the last encode()d source. With beams > 1 each
  // source sequence is repeated `beams` times (sequence b*beams + k decodes
  // source b), so beam search can keep one cache row per hypothesis.
  void start_decoding(Backend& be, DecodeState& st, int beams = 1) {
    require(beams >= 1, "beam size ", beams, " must be at least 1");
    const int B = src_shape_.B * beams, S_len = src_shape_.T;
    st.B = B;
    st.src_len = S_len;
    const auto memory = expanded_.rows(B * S_len, width_);  // (B*beams*S, D)
    const int N_DEC = dec_.n_layers;
    st.src_padding.assign(std::size_t(B) * S_len, 0);
    for (int b = 0; b < src_shape_.B; ++b)
      for (int k = 0; k < beams; ++k) {
        be.copy(std::size_t(S_len) * width_, memory_.row(b * S_len), memory.row((b * beams + k) * S_len));
        if (src_padding_)
          std::copy_n(src_padding_ + std::size_t(b) * S_len, S_len, st.src_padding.data() + std::size_t(b * beams + k) * S_len);
      }
    const int KVW = blocks_[0].cross_attention().memory_width();
    A* kv = st.memory_kv.reserve(std::size_t(N_DEC) * B * S_len * KVW);
    st.self.layers().resize(N_DEC);
    for (int i = 0; i < N_DEC; ++i) {
      blocks_[i].cross_attention().project_memory(be, memory, {kv + std::size_t(i) * B * S_len * KVW, B * S_len, KVW});
      blocks_[i].self_attention().start_cache(st.self[i], B);
    }
  }

  // Logits (B*n, vocab) of the next n target ids of each sequence (ids B*n).
  std::span<const A> decode(Backend& be, std::span<const std::int32_t> ids, DecodeState& st) {
    require(st.B > 0 && !ids.empty() && ids.size() % st.B == 0, ids.size(), " ids for ", st.B, " sequences");
    const Shape bt{st.B, static_cast<int>(ids.size()) / st.B};
    require(st.self.length() + bt.T <= dec_.max_t, "decoding past MAX_T ", dec_.max_t, ": ", st.self.length(),
            " cached + ", bt.T, " new positions");
    const int rows = bt.rows();
    const int KVW = blocks_[0].cross_attention().memory_width();
    const auto x = x_.rows(rows, width_);
    const auto h = h_.rows(rows, width_);
    stem_.forward(be, ids, x, bt, st.self.length());
    blocks_.forward_each(x, h, [&](Block& b, int i, ConstRows<A, D> in, Rows<A, D> out) {
      b.forward_cached(be, in, out, st.B, st.self[i], st.memory_kv.data() + std::size_t(i) * st.B * st.src_len * KVW,
                       st.src_len, st.src_padding.data());
    });
    return project(be, h);
  }

  void backward(Backend& be, std::span<const A> dlogits) {
    const int rows = tgt_shape_.rows(), src_rows = src_shape_.rows();
    require(dlogits.size() == std::size_t(rows) * vocab(), "logit gradient has ", dlogits.size(),
            " elements, expected ", std::size_t(rows) * vocab());
    const auto dmem = dmem_.rows(src_rows, width_);          // one block's memory gradient
    const auto dmem_sum = dmem_sum_.rows(src_rows, width_);  // all blocks'
    const auto dtop = dtop_.rows(rows, width_);
    const auto dh = dh_.rows(rows, width_);  // into the last block
    const auto dx = dx_.rows(rows, width_);  // into the stem
    head_->backward(be, dlogits.data(), dtop);
    if (final_norm_) ln_f_.backward(be, dtop, dh);
    else be.copy(dtop.size(), dtop.data, dh.data);
    blocks_.backward_each(be, dh, dx, [&](Block& b, int i, ConstRows<A, D> dout, Rows<A, D> din) {
      b.backward(be, dout, din, dmem);
      if (i == dec_.n_layers - 1) be.copy(dmem.size(), dmem.data, dmem_sum.data);
      else be.add_to(dmem.size(), dmem.data, dmem_sum.data);
    });
    stem_.backward(be, dx);
    encoder_.backward(be, dmem_sum);
  }

  // f(name, value, grad) for every parameter; f(keys) for every dropout
  // (through a FunctionRef: core/params.hpp).
  void visit(ParameterVisitor<Backend> f) {
    encoder_.visit(prefixed("encoder.", f));
    auto dec = prefixed("decoder.", f);
    stem_.visit(dec);
    blocks_.visit(dec);
    if (final_norm_) ln_f_.visit(prefixed("decoder.ln_f.", f));
    head_->visit(prefixed("lm_head.", f));
  }
  void for_each_dropout(DropoutVisitor f) {
    encoder_.for_each_dropout(f);
    blocks_.for_each_dropout(f);
  }
  // Activation recompute of the encoder's and the decoder's blocks (block_stack.hpp).
  void set_recompute(Recompute r) {
    encoder_.set_recompute(r);
    blocks_.set_recompute(r);
  }
  Recompute recompute() const { return blocks_.recompute(); }
  void set_training(bool on) {
    for_each_dropout([on](auto& d) { d.set_training(on); });
  }

  int vocab() const { return head_->out(); }
  const Seq2SeqOptions& options() const { return opts_; }
  // Each side's sizes and knobs.
  const ModelDims& encoder_dims() const { return encoder_.dims(); }
  const ModelDims& decoder_dims() const { return dec_; }
  int source_vocab() const { return encoder_.vocab(); }
  Block& block(int i) { return blocks_[i]; }

 private:
  static const ModelDims& same_width(const ModelDims& enc, const ModelDims& dec) {
    require(enc.d_model == dec.d_model, "encoder width ", enc.d_model, " and decoder width ", dec.d_model, " differ");
    return dec;
  }
  // The last block's output -> ln_f (PreNorm) -> lm_head -> logits.
  std::span<const A> project(Backend& be, ConstRows<A, D> top) {
    const int rows = top.rows;
    if (final_norm_) {
      const auto hn = hn_.rows(rows, width_);
      ln_f_.forward(be, top, hn);
      top = hn;
    }
    A* logits = logits_.reserve(std::size_t(rows) * vocab());
    head_->forward(be, top, logits);
    return {logits, std::size_t(rows) * vocab()};
  }

  Rng rng_;
  Transformer<EncCfg, Backend, false> encoder_;
  ModelDims dec_;
  [[no_unique_address]] Dim<D> width_;
  TokenStem<DecCfg, Backend> stem_;
  BlockStack<Block, Backend> blocks_;
  norm_layer_t<DecCfg, D, Backend> ln_f_;
  bool final_norm_;  // ln_f before the head (PreNorm blocks)
  std::optional<OutputProjection<D, Backend>> head_;
  Seq2SeqOptions opts_;
  Shape src_shape_, tgt_shape_;
  const std::uint8_t* src_padding_ = nullptr;
  ConstRows<A, D> memory_;
  Buffer<A> x_, h_, hn_, logits_, dh_, dx_, dmem_, dmem_sum_, dtop_, expanded_;
};

}  // namespace xfmr
