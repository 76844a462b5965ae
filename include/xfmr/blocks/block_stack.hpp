// block_stack.hpp: BlockStack<Block, Backend>, N blocks applied in order,
// keeping every block's input for backward; forward_cached decodes through
// them with one KvCache per block. forward_each and backward_each are the
// same loops for blocks that take more (Seq2Seq's decoder blocks: the
// memory, each layer's own memory keys and values). Parameters
// "blocks.<i>.*". Backward: parameter gradients accumulate; dx assigned.
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

  BlockStack(int n, Rng& rng, float dropout, float attention_dropout = 0.0f) {
    require(n > 0, "a model needs at least one block, got ", n);
    blocks_.reserve(n);
    for (int i = 0; i < n; ++i) blocks_.emplace_back(rng, dropout, attention_dropout);
  }

  // x (B*T, D) -> y (B*T, D). Each block's input is kept for its backward.
  template <class... Extra>
  void forward(Backend& be, ConstRows<S, D> x, Rows<S, D> y, Shape bt, Extra... extra) {
    forward_each(x, y, [&](Block& b, int, ConstRows<S, D> in, Rows<S, D> out) { b.forward(be, in, out, bt, extra...); });
  }

  // dy (B*T, D) -> dx (B*T, D), assigned; dx must not alias dy.
  void backward(Backend& be, ConstRows<S, D> dy, Rows<S, D> dx) {
    backward_each(dy, dx, [&](Block& b, int, ConstRows<S, D> dout, Rows<S, D> din) { b.backward(be, dout, din); });
  }

  // Incremental decoding through every block, layer i using cache[i].
  template <class Cache>
  void forward_cached(Backend& be, ConstRows<S, D> x, Rows<S, D> y, int B, Cache& cache) {
    forward_each(x, y, [&](Block& b, int i, ConstRows<S, D> in, Rows<S, D> out) {
      b.forward_cached(be, in, out, B, cache[i]);
    });
  }

  // The loops behind the three above, for blocks that take more than they
  // do (a decoder block's memory, its own keys and values per layer):
  // f(block, i, in, out) runs block i from the previous block's output
  // (x for block 0) into the next one's input (y for the last); g(block,
  // i, dout, din) runs the blocks' backward passes in reverse.
  template <class F>
  void forward_each(ConstRows<S, D> x, Rows<S, D> y, F&& f) {
    const int n = size();
    S* acts = acts_.reserve(std::size_t(n - 1) * x.size());  // (N-1, rows, D) between blocks
    ConstRows<S, D> in = x;
    for (int i = 0; i < n; ++i) {
      const Rows<S, D> out = i + 1 < n ? Rows<S, D>(acts + std::size_t(i) * x.size(), x.rows) : y;
      f(blocks_[i], i, in, out);
      in = out;
    }
  }
  template <class G>
  void backward_each(ConstRows<S, D> dy, Rows<S, D> dx, G&& g) {
    const int n = size();
    S* scratch = grads_.reserve(2 * dy.size());  // ping-pong between blocks
    ConstRows<S, D> d = dy;
    for (int i = n - 1; i >= 0; --i) {
      const Rows<S, D> out = i == 0 ? dx : Rows<S, D>(scratch + std::size_t(i % 2) * dy.size(), dy.rows);
      g(blocks_[i], i, d, out);
      d = out;
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
