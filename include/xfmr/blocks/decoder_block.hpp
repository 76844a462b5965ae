// decoder_block.hpp: the encoder-decoder block: causal self-attention,
// cross-attention to the encoder output (memory), feed-forward; each a
// residual sublayer under Cfg::Norm.
//
// forward(be, x, memory, y, tgt, src, tgt_padding, src_padding):
//   x, y (B*T_tgt, D); memory (B*T_src, D); paddings (B, T) bytes or nullptr.
//   In PreNorm only x is normalised here; memory is the encoder's final output.
// backward(be, dy, dx, dmemory): parameter gradients accumulate; dx and
//   dmemory are assigned (a model with several blocks sums the dmemory's).
// Parameters: "ln1.*", "self_attn.*", "ln2.*", "cross_attn.*", "ln3.*", "ff.*".
#pragma once

#include <cstdint>

#include "xfmr/blocks/residual.hpp"
#include "xfmr/core/config.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/attention.hpp"
#include "xfmr/layers/dropout.hpp"
#include "xfmr/layers/feed_forward.hpp"

namespace xfmr {

template <BlockConfig Cfg, class Backend>
class DecoderBlock {
 public:
  static constexpr int D = Cfg::D_MODEL;  // or Dynamic
  using A = typename Backend::Activation;
  using Norm = typename Cfg::Norm;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  explicit DecoderBlock(Rng& rng, float dropout = 0.0f, float attention_dropout = 0.0f)
    requires(is_static_config<Cfg>())
      : DecoderBlock(model_dims<Cfg>(), rng, dropout, attention_dropout) {}
  DecoderBlock(const ModelDims& d, Rng& rng, float dropout = 0.0f, float attention_dropout = 0.0f)
      : width_(d.d_model, "block width"),
        self_attn_(d, rng),
        cross_attn_(d, rng),
        ff_(d, rng),
        r1_(d, dropout, rng.next_u64()),
        r2_(d, dropout, rng.next_u64()),
        r3_(d, dropout, rng.next_u64()) {
    // Seeded from the branches' seeds (see encoder_block.hpp).
    self_attn_.set_dropout(attention_dropout, detail::mix64(~r1_.dropout().seed()));
    cross_attn_.set_dropout(attention_dropout, detail::mix64(~r2_.dropout().seed()));
  }

  void forward(Backend& be, ConstRows<A, D> x, ConstRows<A, D> memory, Rows<A, D> y, Shape tgt, Shape src,
               const std::uint8_t* tgt_padding = nullptr, const std::uint8_t* src_padding = nullptr) {
    last_ = {x, memory, y, tgt, src, tgt_padding, src_padding};
    const AttentionMask self_mask{true, tgt_padding};
    const AttentionMask cross_mask{false, src_padding};
    const auto h1 = h1_.rows(x.rows, width_);  // (B*T_tgt, D) after self-attention
    const auto h2 = h2_.rows(x.rows, width_);  // (B*T_tgt, D) after cross-attention
    r1_.forward(be, x, h1, [&](ConstRows<A, D> in, Rows<A, D> out) { self_attn_.forward(be, in, out, tgt, self_mask); });
    r2_.forward(be, h1, h2, [&](ConstRows<A, D> in, Rows<A, D> out) {
      cross_attn_.forward(be, in, memory, out, tgt, src, cross_mask);
    });
    r3_.forward(be, h2, y, [&](ConstRows<A, D> in, Rows<A, D> out) { ff_.forward(be, in, out); });
  }

  // Incremental decoding: n new target positions per sequence (rows B*n)
  // against the self-attention cache and the precomputed memory keys/values
  // (see CrossAttention::project_memory). Forward only.
  void forward_cached(Backend& be, ConstRows<A, D> x, Rows<A, D> y, int B, KvCache<Backend>& self_cache,
                      const A* memory_kv, int src_len, const std::uint8_t* src_padding) {
    const auto h1 = h1_.rows(x.rows, width_);
    const auto h2 = h2_.rows(x.rows, width_);
    r1_.forward(be, x, h1,
                [&](ConstRows<A, D> in, Rows<A, D> out) { self_attn_.forward_cached(be, in, out, B, self_cache); });
    r2_.forward(be, h1, h2, [&](ConstRows<A, D> in, Rows<A, D> out) {
      cross_attn_.forward_cached(be, in, out, B, memory_kv, src_len, src_padding);
    });
    r3_.forward(be, h2, y, [&](ConstRows<A, D> in, Rows<A, D> out) { ff_.forward(be, in, out); });
  }
  SelfAttention<Cfg, Backend>& self_attention() { return self_attn_; }

  void backward(Backend& be, ConstRows<A, D> dy, Rows<A, D> dx, Rows<A, D> dmemory) {
    auto scratch = be.workspace().frame();
    const auto dh2 = scratch.rows(dy.rows, width_);  // (B*T_tgt, D)
    const auto dh1 = scratch.rows(dy.rows, width_);  // (B*T_tgt, D)
    r3_.backward(be, dy, dh2, [&](ConstRows<A, D> dout, Rows<A, D> din) { ff_.backward(be, dout, din); });
    r2_.backward(be, dh2, dh1, [&](ConstRows<A, D> dout, Rows<A, D> din) {
      cross_attn_.backward(be, dout, din, dmemory);
    });
    r1_.backward(be, dh1, dx, [&](ConstRows<A, D> dout, Rows<A, D> din) { self_attn_.backward(be, dout, din); });
  }

  // Activation recompute: see SelfAttentionBlock::replay and for_each_saved.
  void replay(Backend& be) {
    forward(be, last_.x, last_.memory, last_.y, last_.tgt, last_.src, last_.tgt_padding, last_.src_padding);
  }
  void share_recomputed(Buffer<A>* norm, Buffer<A>* activated, bool replayed) {
    for (auto* r : {&r1_, &r2_, &r3_}) r->share_norm_output(norm);
    ff_.share_activated(activated);
    ff_.set_replayed(replayed);
  }
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    parts([&](const char*, auto& part, auto&... same) { part.for_each_saved(f, same...); }, others...);
    f(h1_, others.h1_...);
    f(h2_, others.h2_...);
  }

  // The block's parts in order, each with the name its parameters take
  // (and the same part of others, blocks of this type): visit,
  // for_each_dropout and for_each_saved walk this one list.
  template <class F, class... Same>
  void parts(F&& f, Same&... others) {
    f("ln1.", r1_, others.r1_...);
    f("self_attn.", self_attn_, others.self_attn_...);
    f("ln2.", r2_, others.r2_...);
    f("cross_attn.", cross_attn_, others.cross_attn_...);
    f("ln3.", r3_, others.r3_...);
    f("ff.", ff_, others.ff_...);
  }
  void visit(ParameterVisitor<Backend> f) {
    parts([&](const char* name, auto& part) { part.visit(prefixed(name, f)); });
  }
  void for_each_dropout(DropoutVisitor f) {
    parts([&](const char*, auto& part) { for_each_dropout_of(part, f); });
  }
  void set_training(bool on) {
    for_each_dropout([on](auto& d) { d.set_training(on); });
  }
  CrossAttention<Cfg, Backend>& cross_attention() { return cross_attn_; }

 private:
  [[no_unique_address]] Dim<D> width_;
  SelfAttention<Cfg, Backend> self_attn_;
  CrossAttention<Cfg, Backend> cross_attn_;
  FeedForward<Cfg, Backend> ff_;
  Residual<Norm, D, Backend, norm_layer_t<Cfg, D, Backend>> r1_, r2_, r3_;
  Buffer<A> h1_, h2_;  // (B*T_tgt, D) after self- and after cross-attention
  struct {
    ConstRows<A, D> x, memory;
    Rows<A, D> y;
    Shape tgt, src;
    const std::uint8_t *tgt_padding, *src_padding;
  } last_{};
};

}  // namespace xfmr
