// encoder_block.hpp: self-attention + feed-forward, each a residual sublayer
// under Cfg::Norm (PreNorm or PostNorm).
//
//   SelfAttentionBlock<Cfg, Backend, CAUSAL>
//   EncoderBlock<Cfg, Backend>      = non-causal; key padding for ragged batches
//   DecoderOnlyBlock<Cfg, Backend>  = causal: the GPT-style language-model block
//
// forward(be, x, y, bt, key_padding): x, y (B*T, D_MODEL); key_padding is
// (B, T) bytes, nonzero = pad, or nullptr. Backward: parameter gradients
// accumulate, dx assigned. Parameters: "ln1.*", "attn.*", "ln2.*", "ff.*".
// Dropout on the residual branches and on the attention probabilities are
// runtime rates; set_training(false) turns both off for evaluation. The
// attention's masks are seeded from the first branch's seed, so that adding
// them drew nothing more from the initialisation's generator.
#pragma once

#include <cstdint>
#include <type_traits>

#include "xfmr/blocks/residual.hpp"
#include "xfmr/core/config.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/attention.hpp"
#include "xfmr/layers/dropout.hpp"
#include "xfmr/layers/feed_forward.hpp"

namespace xfmr {

template <BlockConfig Cfg, class Backend, bool CAUSAL>
class SelfAttentionBlock {
 public:
  static constexpr int D = Cfg::D_MODEL;  // or Dynamic
  using A = typename Backend::Activation;
  using Norm = typename Cfg::Norm;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  explicit SelfAttentionBlock(Rng& rng, float dropout = 0.0f, float attention_dropout = 0.0f)
    requires(is_static_config<Cfg>())
      : SelfAttentionBlock(model_dims<Cfg>(), rng, dropout, attention_dropout) {}
  SelfAttentionBlock(const ModelDims& d, Rng& rng, float dropout = 0.0f, float attention_dropout = 0.0f)
      : width_(d.d_model, "block width"),
        attn_(d, rng),
        ff_(d, rng),
        r1_(d, dropout, rng.next_u64()),
        r2_(d, dropout, rng.next_u64()) {
    attn_.set_dropout(attention_dropout, detail::mix64(~r1_.dropout().seed()));
  }

  void forward(Backend& be, ConstRows<A, D> x, Rows<A, D> y, Shape bt, const std::uint8_t* key_padding = nullptr) {
    last_ = {x, y, bt, key_padding};
    const AttentionMask mask{CAUSAL, key_padding};
    const auto h = mid_.rows(x.rows, width_);  // (B*T, D) after the attention sublayer
    r1_.forward(be, x, h, [&](ConstRows<A, D> in, Rows<A, D> out) { attn_.forward(be, in, out, bt, mask); });
    r2_.forward(be, h, y, [&](ConstRows<A, D> in, Rows<A, D> out) { ff_.forward(be, in, out); });
  }

  // Incremental decoding (causal blocks): see SelfAttention::forward_cached.
  // batch: B, the sequences of one length, or a RaggedStep.
  template <class Batch>
  void forward_cached(Backend& be, ConstRows<A, D> x, Rows<A, D> y, const Batch& batch, KvCache<Backend>& cache)
    requires CAUSAL
  {
    const auto h = mid_.rows(x.rows, width_);
    r1_.forward(be, x, h, [&](ConstRows<A, D> in, Rows<A, D> out) { attn_.forward_cached(be, in, out, batch, cache); });
    r2_.forward(be, h, y, [&](ConstRows<A, D> in, Rows<A, D> out) { ff_.forward(be, in, out); });
  }

  void backward(Backend& be, ConstRows<A, D> dy, Rows<A, D> dx) {
    auto scratch = be.workspace().frame();
    const auto dh = scratch.rows(dy.rows, width_);  // (B*T, D)
    r2_.backward(be, dy, dh, [&](ConstRows<A, D> dout, Rows<A, D> din) { ff_.backward(be, dout, din); });
    r1_.backward(be, dh, dx, [&](ConstRows<A, D> dout, Rows<A, D> din) { attn_.backward(be, dout, din); });
  }

  // Activation recompute (block_stack.hpp): the last forward again, from the
  // same input (which must still hold it) into the same output; and what a
  // forward saves, buffer by buffer, with the same buffer of other blocks
  // of this type (to free or to trade it).
  void replay(Backend& be) { forward(be, last_.x, last_.y, last_.bt, last_.key_padding); }
  // Cheap recompute: the norms' outputs and the activation's in a stack's
  // shared buffers (Residual::share_norm_output, FeedForward::share_activated);
  // block recompute: `replayed` (FeedForward::set_replayed).
  void share_recomputed(Buffer<A>* norm, Buffer<A>* activated, bool replayed) {
    r1_.share_norm_output(norm);
    r2_.share_norm_output(norm);
    ff_.share_activated(activated);
    ff_.set_replayed(replayed);
  }
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    parts([&](const char*, auto& part, auto&... same) { part.for_each_saved(f, same...); }, others...);
    f(mid_, others.mid_...);
  }

  // The block's parts in order, each with the name its parameters take
  // (and the same part of others, blocks of this type): visit,
  // for_each_dropout and for_each_saved walk this one list.
  template <class F, class... Same>
  void parts(F&& f, Same&... others) {
    f("ln1.", r1_, others.r1_...);
    f("attn.", attn_, others.attn_...);
    f("ln2.", r2_, others.r2_...);
    f("ff.", ff_, others.ff_...);
  }
  void visit(ParameterVisitor<Backend> f) {
    parts([&](const char* name, auto& part) { part.visit(prefixed(name, f)); });
  }
  // f(name, linear) for each projection of its attention and feed-forward.
  template <class F>
  void visit_linears(F&& f) {
    parts([&](const char* name, auto& part) {
      if constexpr (requires { part.visit_linears(f); }) part.visit_linears(prefixed_part(name, f));
    });
  }
  void for_each_dropout(DropoutVisitor f) {
    parts([&](const char*, auto& part) { for_each_dropout_of(part, f); });
  }
  void set_training(bool on) {
    for_each_dropout([on](auto& d) { d.set_training(on); });
  }
  SelfAttention<Cfg, Backend>& attention() { return attn_; }

 private:
  [[no_unique_address]] Dim<D> width_;
  SelfAttention<Cfg, Backend> attn_;
  FeedForward<Cfg, Backend> ff_;
  Residual<Norm, D, Backend, norm_layer_t<Cfg, D, Backend>> r1_, r2_;
  Buffer<A> mid_;  // (B*T, D) after the attention sublayer
  struct {
    ConstRows<A, D> x;
    Rows<A, D> y;
    Shape bt;
    const std::uint8_t* key_padding;
  } last_{};
};

template <BlockConfig Cfg, class Backend>
using EncoderBlock = SelfAttentionBlock<Cfg, Backend, false>;

template <BlockConfig Cfg, class Backend>
using DecoderOnlyBlock = SelfAttentionBlock<Cfg, Backend, true>;

}  // namespace xfmr
