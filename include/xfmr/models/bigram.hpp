// bigram.hpp: Bigram<Backend>, the seeds' baseline language model: the
// logits for the next token are a row of a (vocab, vocab) table indexed by
// the current token. Parameter: "table.weight". forward() returns logits
// (B*T, vocab); backward(dlogits) accumulates the table gradient.
#pragma once

#include <cstdint>
#include <span>

#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

template <class Backend>
class Bigram {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  // torch.nn.Embedding's default initialisation, N(0, 1), as in the seeds.
  Bigram(int vocab, std::uint64_t seed) : vocab_(vocab) {
    require(vocab > 0, "vocabulary size ", vocab, " must be positive");
    Rng rng(seed);
    table_.resize({vocab, vocab});
    dtable_.resize({vocab, vocab});
    table_.generate([&] { return S(rng.normal()); });
  }

  std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt) {
    require(static_cast<long>(ids.size()) == long(bt.B) * bt.T, "got ", ids.size(), " token ids, expected B*T = ",
            long(bt.B) * bt.T);
    ids_ = ids;
    A* logits = logits_.reserve(ids.size() * vocab_);  // (B*T, vocab)
    be.embedding_forward(static_cast<int>(ids.size()), vocab_, vocab_, ids.data(), table_.data(), logits);
    return {logits, ids.size() * vocab_};
  }

  void backward(Backend& be, std::span<const A> dlogits) {
    require(dlogits.size() == ids_.size() * vocab_, "logit gradient has ", dlogits.size(), " elements, expected ",
            ids_.size() * vocab_);
    be.embedding_backward(static_cast<int>(ids_.size()), vocab_, ids_.data(), dlogits.data(), dtable_.data());
  }

  void visit(ParameterVisitor<Backend> f) {
    f("table.weight", table_, dtable_);
  }
  template <class F>
  void for_each_dropout(F&&) {}
  void set_training(bool) {}

  int vocab() const { return vocab_; }
 private:
  int vocab_;
  Tensor table_, dtable_;  // (vocab, vocab)
  std::span<const std::int32_t> ids_;
  typename Backend::template Buffer<A> logits_;
};

}  // namespace xfmr
