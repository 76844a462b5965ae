// embedding.hpp: token embedding, y[i,:] = weight[ids[i],:], as torch.nn.Embedding.
//
// The vocabulary size is runtime (it comes from the tokenizer); the width is
// static. Every id is checked against [0, vocab). Saves: a pointer to ids
// (kept alive by the caller until backward). Backward: dweight accumulates;
// there is no input gradient. Parameters: "weight" (vocab, D).
// An embedding built with `share` reads and accumulates into another's table
// (shared source/target embeddings) and lists no parameter of its own.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

template <int D_, class Backend>
class Embedding {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  // torch.nn.Embedding's default initialisation: N(0, 1).
  Embedding(int vocab, Rng& rng, Embedding* share = nullptr)
    requires(D_ != Dynamic)
      : Embedding(vocab, D_, rng, share) {}
  Embedding(int vocab, int width, Rng& rng, Embedding* share = nullptr)
      : D(width, "embedding width"), vocab_(vocab), shared_(share) {
    require(vocab > 0, "vocabulary size ", vocab, " must be positive");
    if (share) {
      require(share->vocab() == vocab, "a shared embedding needs one vocabulary: ", vocab, " vs ", share->vocab());
      require(share->width() == D, "a shared embedding needs one width: ", int(D), " vs ", share->width());
      return;
    }
    weight_.resize({vocab, D});
    dweight_.resize({vocab, D});
    if (rng.initialises()) weight_.generate([&] { return S(rng.normal()); });
  }

  void forward(Backend& be, std::span<const std::int32_t> ids, Rows<A, D_> y) {
    require_rows(y, static_cast<int>(ids.size()), "Embedding output");
    require_width(y, D, "Embedding output");
    ids_ = ids;
    // A host table lent to decoding copies is read from its source by the
    // backend, found by its address (core/tensor.hpp's product_data()).
    const S* table;
    if constexpr (std::is_same_v<Tensor, xfmr::Tensor<S>>) table = weight().product_data();
    else table = weight().data();
    be.embedding_forward(static_cast<int>(ids.size()), vocab_, D, ids.data(), table, y.data);  // (n, D)
  }

  void backward(Backend& be, ConstRows<A, D_> dy) {
    require_rows(dy, static_cast<int>(ids_.size()), "Embedding output gradient");
    be.embedding_backward(dy.rows, D, ids_.data(), dy.data, grad().data());
  }

  void visit(ParameterVisitor<Backend> f) {
    if (!shared_) f("weight", weight_, dweight_);
  }

  int vocab() const { return vocab_; }
  int width() const { return D; }
  // The table and its gradient (the shared one's, when sharing).
  Tensor& weight() { return shared_ ? shared_->weight() : weight_; }
  Tensor& grad() { return shared_ ? shared_->grad() : dweight_; }

 private:
  [[no_unique_address]] Dim<D_> D;
  int vocab_;
  Embedding* shared_;
  Tensor weight_, dweight_;  // (vocab, D); empty when sharing
  std::span<const std::int32_t> ids_;
};

}  // namespace xfmr
