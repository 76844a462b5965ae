// block_stack.hpp: BlockStack<Block, Backend>, N blocks applied in order,
// keeping every block's input for backward; forward_cached decodes through
// them with one KvCache per block. Parameters "blocks.<i>.*".
// Backward: parameter gradients accumulate; dx assigned.
#pragma once

#include <string>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

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
