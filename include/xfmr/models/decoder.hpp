// decoder.hpp: Decoder<Cfg, Backend>, a GPT-style language model.
//
//   ids (B, T) -> causal Transformer trunk (tok_emb + positions, N
//   DecoderOnlyBlocks, ln_f for PreNorm configs) -> lm_head -> logits (B*T, vocab)
//
// The vocabulary size is runtime; D_MODEL, N_HEADS, N_LAYERS, D_FF, MAX_T are
// static or Dynamic (core/config.hpp: a Dynamic configuration's model is
// built from a ModelDims, Decoder(dims, vocab, seed)). With tie_weights the LM head uses the token embedding matrix (as in
// GPT-2); head_bias false drops its bias (GPT-2 has none). Parameters:
// "tok_emb.weight", "pos_emb.weight" (learned positions), "blocks.<i>.*",
// "ln_f.*", "lm_head.weight" (untied), "lm_head.bias" (with head_bias).
// forward() returns the logits, valid until the next forward. backward(dlogits)
// accumulates every parameter gradient. Training without the batch's logits:
// forward_to_head, then head_loss (the head and the fused loss a block of
// rows at a time, then the backward). Initialisation: GPT-2 (N(0, 0.02)).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include "xfmr/layers/losses.hpp"
#include "xfmr/layers/output_projection.hpp"
#include "xfmr/models/transformer.hpp"

namespace xfmr {

struct DecoderOptions {
  float dropout = 0.0f;            // on the residual branches
  float attention_dropout = 0.0f;  // on the attention probabilities
  bool tie_weights = false;
  bool head_bias = true;
  Recompute recompute = Recompute::none;  // activation recompute of the blocks (block_stack.hpp)
  // head_loss's block of rows (0: layers/losses.hpp's head_block_rows: 256, or 16 MiB of logits if more).
  int head_block_rows = 0;
  // false: no initialisation at all (the layers' own nor init_gpt2's), for
  // a loader that then gives every parameter its values (load_model's): the
  // weights are not even allocated until then (core/tensor.hpp).
  bool initialise = true;
};

template <BlockConfig Cfg, class Backend>
class Decoder {
  static_assert(xfmr::Backend<Backend>,
                "the backend lacks an operation the models call (backend/backend.hpp's Backend concept says which)");
 public:
  static constexpr int D = Cfg::D_MODEL;  // or Dynamic
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Config = Cfg;
  using Trunk = Transformer<Cfg, Backend, true>;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  Decoder(int vocab, std::uint64_t seed, DecoderOptions opts = {})
    requires(is_static_config<Cfg>())
      : Decoder(model_dims<Cfg>(), vocab, seed, opts) {}
  // dims: the sizes (those Cfg fixes must agree) and knobs.
  Decoder(const ModelDims& dims, int vocab, std::uint64_t seed, DecoderOptions opts = {})
      : rng_(seed, opts.initialise), trunk_(dims, vocab, rng_, opts.dropout, opts.attention_dropout), opts_(opts) {
    if (opts.tie_weights) {
      auto& emb = trunk_.token_embedding();
      head_.emplace(emb.weight(), emb.grad(), rng_, opts.head_bias);
    } else {
      head_.emplace(dims.d_model, vocab, rng_, opts.head_bias);
    }
    if (opts.initialise) init_gpt2(*this, rng_);
    set_recompute(opts.recompute);
    require(opts.head_block_rows >= 0, "head_block_rows ", opts.head_block_rows, " is negative");
  }
  Decoder(const Decoder&) = delete;  // the tied head points into this object
  Decoder& operator=(const Decoder&) = delete;

  // ids: B*T token ids in [0, vocab). Returns logits (B*T, vocab).
  std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt) {
    const auto h = trunk_.forward(be, ids, bt);  // (B*T, D)
    rows_ = bt.rows();
    A* logits = logits_.reserve(std::size_t(rows_) * vocab());  // (B*T, vocab)
    head_->forward(be, h, logits);
    return {logits, std::size_t(rows_) * vocab()};
  }

  // Training's forward without the logits of the whole batch (B*T x vocab:
  // 131 MB at TinyLlama's B4 T256): the trunk's forward alone; head_loss
  // then runs the head and the loss.
  HeadRows forward_to_head(Backend& be, std::span<const std::int32_t> ids, Shape bt) {
    head_input_ = trunk_.forward(be, ids, bt);
    rows_ = bt.rows();
    return {rows_};
  }

  // The loss of the last forward_to_head's rows against targets (one a row):
  // CrossEntropyLoss::forward_backward's mean over the counted targets, and
  // with scale != 0 backward's gradients of scale * that loss, accumulated.
  // The head and the fused loss run a block of head_block_rows() rows at a
  // time, each block's logit gradient written over its logits, in the buffer
  // forward() fills (which keeps its largest size: a model that only
  // trains and evaluates this way holds one block's logits, not the
  // batch's). The same loss and gradients as forward, the loss and
  // backward, within rounding (a block's loss is weighed by its share of
  // the counted targets).
  HeadLoss head_loss(Backend& be, CrossEntropyLoss<Backend>& loss, std::span<const std::int32_t> targets,
                     double scale) {
    require(targets.size() == std::size_t(rows_) && head_input_.rows == rows_, "head_loss: ", targets.size(),
            " targets for the ", rows_, " rows of the last forward_to_head");
    const int V = vocab(), width = trunk_.dims().d_model;
    const double counted = double(counted_targets(targets));
    const Rows<A, D> dh = scale != 0.0 ? dh_.rows(rows_, Dim<D>(width)) : Rows<A, D>();
    HeadLoss out;
    for (int r = 0; r < rows_; r += head_block_rows()) {
      const int n = std::min(head_block_rows(), rows_ - r);
      const auto t = targets.subspan(std::size_t(r), std::size_t(n));
      const double share = counted > 0 ? double(counted_targets(t)) / counted : 0.0;
      const std::span<A> z(logits_.reserve(std::size_t(n) * V), std::size_t(n) * V);
      head_->forward(be, ConstRows<A, D>(head_input_.row(r), n, width), z.data());
      const double l = loss.forward_backward(be, z, t, V, z, scale * share);  // the gradient over the logits
      if (!std::isfinite(l)) return {l, !std::isfinite(double(be.sum_squares(z.size(), z.data())))};
      out.loss += l * share;
      if (scale != 0.0) head_->backward(be, z.data(), Rows<A, D>(dh.row(r), n, width));
    }
    if (scale != 0.0) trunk_.backward(be, dh);
    return out;
  }
  // The rows of one block of head_loss (DecoderOptions::head_block_rows).
  int head_block_rows() const {
    return opts_.head_block_rows > 0 ? opts_.head_block_rows : xfmr::head_block_rows(vocab(), sizeof(A));
  }

  // The final hidden states (B*T, d_model) of ids (B*T): after the last
  // norm, before the head (an embedding's features); valid until the next forward.
  std::span<const A> hidden(Backend& be, std::span<const std::int32_t> ids, Shape bt) {
    const auto h = trunk_.forward(be, ids, bt);
    return {h.data, std::size_t(h.rows) * std::size_t(h.cols)};
  }

  // Incremental decoding: start a cache for B sequences, then feed each
  // sequence's next n ids (ids B*n) and get their logits (B*n, vocab). The
  // same numbers as forward() over the whole prefix, at one row of work per
  // new position. Inference only; up to MAX_T positions.
  // capacity: the most positions the cache will hold (0: MAX_T; a model of
  // a long context decoding a few tokens needs far less).
  void start_cache(DecodingCache<Backend>& cache, int B, int capacity = 0) { trunk_.start_cache(cache, B, capacity); }
  std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, int B,
                                    DecodingCache<Backend>& cache) {
    const auto h = trunk_.forward_cached(be, ids, B, cache);
    A* logits = logits_.reserve(std::size_t(h.rows) * vocab());
    head_->forward(be, h, logits);
    return {logits, std::size_t(h.rows) * vocab()};
  }

  // A ragged step (layers/kv_cache.hpp: continuous batching): each
  // segment's ids continue its sequence in its row of a cache started for
  // all the slots. Returns the logits of each segment's last `outputs`
  // positions (their sum, vocab): the next token's, the only ones a decoder
  // samples, and a speculative step's drafts'.
  std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, RaggedStep step,
                                    DecodingCache<Backend>& cache) {
    const auto h = trunk_.forward_cached(be, ids, step, cache);
    int n = 0;
    for (const StepSegment& s : step) {
      require(s.outputs >= 1 && s.outputs <= s.rows, "a segment of ", s.rows, " rows with ", s.outputs, " outputs");
      n += s.outputs;
    }
    const auto last = last_.rows(n, Dim<D>(trunk_.dims().d_model));
    int r = 0, o = 0;
    for (const StepSegment& s : step) {
      r += s.rows;
      for (int k = s.outputs; k >= 1; --k) be.copy(last.cols, h.row(r - k), last.row(o++));
    }
    A* logits = logits_.reserve(std::size_t(n) * vocab());
    head_->forward(be, ConstRows<A, D>(last), logits);
    return {logits, std::size_t(n) * vocab()};
  }

  // dlogits (B*T, vocab) for the last forward.
  void backward(Backend& be, std::span<const A> dlogits) {
    require(dlogits.size() == std::size_t(rows_) * vocab(), "logit gradient has ", dlogits.size(),
            " elements, expected ", std::size_t(rows_) * vocab());
    const auto dh = dh_.rows(rows_, Dim<D>(trunk_.dims().d_model));
    head_->backward(be, dlogits.data(), dh);
    trunk_.backward(be, dh);
  }

  // f(name, value, grad) for every parameter; f(keys) for every dropout
  // (through a FunctionRef: core/params.hpp).
  void visit(ParameterVisitor<Backend> f) {
    trunk_.visit(f);
    head_->visit(prefixed("lm_head.", f));
  }
  void for_each_dropout(DropoutVisitor f) { trunk_.for_each_dropout(f); }
  // f(name, linear) for the blocks' projections ("blocks.0.attn.qkv", ...: LoRA's targets).
  template <class F>
  void visit_linears(F&& f) {
    trunk_.visit_linears(f);
  }
  // A frozen base (LoRA, models/lora.hpp): backward computes no gradient
  // of the embeddings, the projections or the head, only the adapters'
  // (and the norms' weights', d_model each, which nothing reads).
  void freeze_base(bool on) {
    head_->freeze(on);
    trunk_.freeze_stem(on);
    visit_linears([on](std::string_view, auto& linear) { linear.adapters().freeze(on); });
  }
  void set_training(bool on) { trunk_.set_training(on); }
  // Activation recompute of the blocks (block_stack.hpp).
  void set_recompute(Recompute r) { trunk_.set_recompute(r); }
  Recompute recompute() const { return trunk_.recompute(); }

  int vocab() const { return trunk_.vocab(); }
  int max_t() const { return trunk_.dims().max_t; }
  const ModelDims& dims() const { return trunk_.dims(); }
  const DecoderOptions& options() const { return opts_; }
  BlockStack<DecoderOnlyBlock<Cfg, Backend>, Backend>& blocks() { return trunk_.blocks(); }

 private:
  Rng rng_;
  Trunk trunk_;
  std::optional<OutputProjection<D, Backend>> head_;
  DecoderOptions opts_;
  int rows_ = 0;
  ConstRows<A, D> head_input_;  // forward_to_head's
  Buffer<A> logits_, dh_, last_;
};

}  // namespace xfmr
