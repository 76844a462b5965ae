// embedding.hpp: token embedding, y[i,:] = weight[ids[i],:], as torch.nn.Embedding.
//
// The vocabulary size is runtime (it comes from the tokenizer); the width is
// static. Every id is checked against [0, vocab). Saves: a pointer to ids
// (kept alive by the caller until backward). Backward: dweight accumulates;
// there is no input gradient. Parameters: "weight" (vocab, D).
#pragma once

#include <cstdint>
#include <span>

#include "xfmr/core/error.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

template <int D, class Backend>
class Embedding {
 public:
  using S = typename Backend::Scalar;
  using Tensor = typename Backend::Tensor;

  // torch.nn.Embedding's default initialisation: N(0, 1).
  Embedding(int vocab, Rng& rng) : vocab_(vocab) {
    require(vocab > 0, "vocabulary size ", vocab, " must be positive");
    weight_.resize({vocab, D});
    dweight_.resize({vocab, D});
    for (auto& w : weight_) w = S(rng.normal());
  }

  void forward(Backend& be, std::span<const std::int32_t> ids, Rows<S, D> y) {
    require_rows(y, static_cast<int>(ids.size()), "Embedding output");
    ids_ = ids;
    be.embedding_forward(static_cast<int>(ids.size()), vocab_, D, ids.data(), weight_.data(), y.data);  // (n, D)
  }

  void backward(Backend& be, ConstRows<S, D> dy) {
    require_rows(dy, static_cast<int>(ids_.size()), "Embedding output gradient");
    be.embedding_backward(dy.rows, D, ids_.data(), dy.data, dweight_.data());
  }

  template <class F>
  void visit(F&& f) {
    f("weight", weight_, dweight_);
  }

  int vocab() const { return vocab_; }

 private:
  int vocab_;
  Tensor weight_, dweight_;  // (vocab, D)
  std::span<const std::int32_t> ids_;
};

}  // namespace xfmr
