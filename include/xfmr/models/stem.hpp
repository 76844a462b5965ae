// stem.hpp: the pieces every sequence model shares.
//
//   TokenStem     token embedding + positions (learned or sinusoidal):
//                 x[b,t] = tok_emb[ids[b,t]] + P[t]. Parameters "tok_emb.weight",
//                 "pos_emb.weight" (learned positions only).
//   BlockStack    N blocks applied in order, keeping every block's input for
//                 backward. Parameters "blocks.<i>.*".
//   init_gpt2     N(0, std) for matrices (weights and embeddings), zero biases,
//                 norms left at (1, 0): the GPT-2 / seed initialisation.
// Backward: parameter gradients accumulate; input gradients assigned.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "xfmr/backend/backend.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/embedding.hpp"
#include "xfmr/layers/positional.hpp"

namespace xfmr {

template <class Model>
void init_gpt2(Model& model, Rng& rng, double stddev = 0.02) {
  model.visit([&](std::string_view name, auto& value, auto&) {
    using S = typename std::remove_cvref_t<decltype(value)>::value_type;
    if (value.shape().size() >= 2) {
      value.generate([&] { return S(stddev * rng.normal()); });
    } else if (name.ends_with("bias") && name.find("ln") == std::string_view::npos) {
      value.zero();
    }
  });
}

template <class Cfg, class Backend>
class TokenStem {
 public:
  static constexpr int D = Cfg::D_MODEL;
  using S = typename Backend::Scalar;

  // share: another stem's token embedding to use instead of an own one.
  TokenStem(int vocab, Rng& rng, Embedding<D, Backend>* share = nullptr) : tok_emb_(vocab, rng, share), pos_(rng) {}

  // offset: position of each sequence's first id (incremental decoding).
  void forward(Backend& be, std::span<const std::int32_t> ids, Rows<S, D> x, Shape bt, int offset = 0) {
    require(static_cast<long>(ids.size()) == long(bt.B) * bt.T, "got ", ids.size(), " token ids, expected B*T = ",
            long(bt.B) * bt.T);
    if (offset == 0) require(bt.T <= Cfg::MAX_T, "sequence length ", bt.T, " exceeds MAX_T ", Cfg::MAX_T);
    tok_emb_.forward(be, ids, x);
    pos_.forward(be, x, x, bt, offset);
  }

  // dx is consumed (overwritten) on the way to the embedding gradient.
  void backward(Backend& be, Rows<S, D> dx) {
    pos_.backward(be, dx, dx);
    tok_emb_.backward(be, dx);
  }

  template <class F>
  void visit(F&& f) {
    tok_emb_.visit(prefixed("tok_emb.", f));
    pos_.visit(prefixed("pos_emb.", f));
  }

  Embedding<D, Backend>& token_embedding() { return tok_emb_; }
  int vocab() const { return tok_emb_.vocab(); }

 private:
  Embedding<D, Backend> tok_emb_;
  PositionsFor<Cfg, Backend> pos_;
};

template <class Block, class Backend>
class BlockStack {
 public:
  static constexpr int D = Block::D;
  using S = typename Backend::Scalar;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  BlockStack(int n, Rng& rng, float dropout) {
    require(n > 0, "a model needs at least one block, got ", n);
    blocks_.reserve(n);
    for (int i = 0; i < n; ++i) blocks_.emplace_back(rng, dropout);
  }

  // x (B*T, D) -> y (B*T, D). Each block's input is kept for its backward.
  template <class... Extra>
  void forward(Backend& be, ConstRows<S, D> x, Rows<S, D> y, Shape bt, Extra... extra) {
    const int n = static_cast<int>(blocks_.size());
    S* acts = acts_.reserve(std::size_t(n - 1) * x.size());  // (N-1, B*T, D) between blocks
    ConstRows<S, D> in = x;
    for (int i = 0; i < n; ++i) {
      const Rows<S, D> out = i + 1 < n ? Rows<S, D>(acts + std::size_t(i) * x.size(), x.rows) : y;
      blocks_[i].forward(be, in, out, bt, extra...);
      in = out;
    }
  }

  // dy (B*T, D) -> dx (B*T, D), assigned; dx must not alias dy.
  void backward(Backend& be, ConstRows<S, D> dy, Rows<S, D> dx) {
    const int n = static_cast<int>(blocks_.size());
    S* scratch = grads_.reserve(2 * dy.size());  // ping-pong between blocks
    ConstRows<S, D> g = dy;
    for (int i = n - 1; i >= 0; --i) {
      const Rows<S, D> out = i == 0 ? dx : Rows<S, D>(scratch + std::size_t(i % 2) * dy.size(), dy.rows);
      blocks_[i].backward(be, g, out);
      g = out;
    }
  }

  // Incremental decoding through every block, layer i using cache[i].
  template <class Cache>
  void forward_cached(Backend& be, ConstRows<S, D> x, Rows<S, D> y, int B, Cache& cache) {
    const int n = static_cast<int>(blocks_.size());
    S* acts = acts_.reserve(std::size_t(n - 1) * x.size());
    ConstRows<S, D> in = x;
    for (int i = 0; i < n; ++i) {
      const Rows<S, D> out = i + 1 < n ? Rows<S, D>(acts + std::size_t(i) * x.size(), x.rows) : y;
      blocks_[i].forward_cached(be, in, out, B, cache[i]);
      in = out;
    }
  }

  template <class F>
  void visit(F&& f) {
    for (std::size_t i = 0; i < blocks_.size(); ++i) blocks_[i].visit(prefixed("blocks." + std::to_string(i) + ".", f));
  }
  template <class F>
  void for_each_dropout(F&& f) {
    for (auto& b : blocks_) b.for_each_dropout(f);
  }
  Block& operator[](int i) { return blocks_.at(i); }
  int size() const { return static_cast<int>(blocks_.size()); }

 private:
  std::vector<Block> blocks_;
  Buffer<S> acts_, grads_;
};

}  // namespace xfmr
