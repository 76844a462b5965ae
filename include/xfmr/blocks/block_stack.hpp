// block_stack.hpp: BlockStack<Block, Backend>, N blocks applied in order,
// keeping every block's input for backward; forward_cached decodes through
// them with one KvCache per block. forward_each and backward_each are the
// same loops for blocks that take more (Seq2Seq's decoder blocks: the
// memory, each layer's own memory keys and values). Parameters
// "blocks.<i>.*". Backward: parameter gradients accumulate; dx assigned.
//
// Activation recompute (gradient checkpointing), set_recompute:
//   none   every block keeps what its forward saved until its backward;
//   cheap  the norms' outputs (PreNorm) and the feed-forward activation's go
//          into two buffers the stack's blocks share, and each block
//          computes them again there just before its backward needs them
//          (llm.c's -r 2): a norm and an elementwise function per block
//          more, two of D and one of D_FF fewer a row per block;
//   block  each block hands what it saved to the next block once its
//          forward is done (the stack keeps every block's input, as it
//          always does) and runs that forward again just before its
//          backward, its dropout counters wound back so the masks repeat:
//          the gradients are bit for bit those of none, in the memory of
//          one block's activations instead of N (blocks keep their
//          forward's arguments: replay()), and a gated feed-forward's
//          backward writes its activation's gradient over its saved
//          pre-activation (FeedForward::set_replayed). The one set of
//          buffers goes up the stack in the forward and down it in the
//          backward, so a step allocates nothing once the first is done.
// Every block's backward takes its scratch from the backend's workspace
// (core/workspace.hpp), which holds one block's at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/dropout.hpp"

namespace xfmr {

enum class Recompute { none, cheap, block };

inline const char* recompute_name(Recompute r) {
  return r == Recompute::block ? "block" : r == Recompute::cheap ? "cheap" : "none";
}
inline Recompute parse_recompute(std::string_view name) {
  if (name == "none") return Recompute::none;
  if (name == "cheap") return Recompute::cheap;
  if (name == "block") return Recompute::block;
  detail::fail("unknown recompute mode '", name, "' (none, cheap or block)");
}

template <class Block, class Backend>
class BlockStack {
 public:
  static constexpr int D = Block::D;  // the width, or Dynamic
  using A = typename Backend::Activation;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  BlockStack(int n, Rng& rng, float dropout, float attention_dropout = 0.0f) {
    require(n > 0, "a model needs at least one block, got ", n);
    blocks_.reserve(n);
    for (int i = 0; i < n; ++i) blocks_.emplace_back(rng, dropout, attention_dropout);
  }
  // d.n_layers blocks of d's sizes.
  BlockStack(const ModelDims& d, Rng& rng, float dropout, float attention_dropout = 0.0f) {
    require(d.n_layers > 0, "a model needs at least one block, got ", d.n_layers);
    blocks_.reserve(d.n_layers);
    for (int i = 0; i < d.n_layers; ++i) blocks_.emplace_back(d, rng, dropout, attention_dropout);
  }
  // The blocks may point into this object (cheap recompute's shared buffers).
  BlockStack(const BlockStack&) = delete;
  BlockStack& operator=(const BlockStack&) = delete;

  // x (B*T, D) -> y (B*T, D). Each block's input is kept for its backward.
  template <class... Extra>
  void forward(Backend& be, ConstRows<A, D> x, Rows<A, D> y, Shape bt, Extra... extra) {
    train_each(x, y, [&](Block& b, int, ConstRows<A, D> in, Rows<A, D> out) { b.forward(be, in, out, bt, extra...); });
  }

  // dy (B*T, D) -> dx (B*T, D), assigned; dx must not alias dy.
  void backward(Backend& be, ConstRows<A, D> dy, Rows<A, D> dx) {
    backward_each(be, dy, dx, [&](Block& b, int, ConstRows<A, D> dout, Rows<A, D> din) { b.backward(be, dout, din); });
  }

  void set_recompute(Recompute r) {
    recompute_ = r;
    const bool cheap = r == Recompute::cheap;
    for (auto& b : blocks_)
      b.share_recomputed(cheap ? &shared_norm_ : nullptr, cheap ? &shared_activated_ : nullptr, r == Recompute::block);
  }
  Recompute recompute() const { return recompute_; }

  // Incremental decoding through every block, layer i using cache[i]
  // (batch: B sequences of one length, or a RaggedStep).
  template <class Batch, class Cache>
  void forward_cached(Backend& be, ConstRows<A, D> x, Rows<A, D> y, const Batch& batch, Cache& cache) {
    forward_each(x, y, [&](Block& b, int i, ConstRows<A, D> in, Rows<A, D> out) {
      b.forward_cached(be, in, out, batch, cache[i]);
    });
  }

  // The loops behind the three above, for blocks that take more than they
  // do (a decoder block's memory, its own keys and values per layer):
  // f(block, i, in, out) runs block i from the previous block's output
  // (x for block 0) into the next one's input (y for the last); g(block,
  // i, dout, din) runs the blocks' backward passes in reverse (after
  // replaying block i's forward under Recompute::block).
  template <class F>
  void forward_each(ConstRows<A, D> x, Rows<A, D> y, F&& f) {
    const int n = size();
    A* acts = acts_.reserve(std::size_t(n - 1) * x.size());  // (N-1, rows, D) between blocks
    ConstRows<A, D> in = x;
    for (int i = 0; i < n; ++i) {
      const Rows<A, D> out = i + 1 < n ? Rows<A, D>(acts + std::size_t(i) * x.size(), x.rows, x.cols) : y;
      f(blocks_[i], i, in, out);
      in = out;
    }
  }
  // forward_each for a training forward: under Recompute::block each block
  // hands what it saved to the next one after its forward, its dropout
  // counters noted.
  template <class F>
  void train_each(ConstRows<A, D> x, Rows<A, D> y, F&& f) {
    if (recompute_ != Recompute::block) {
      forward_each(x, y, std::forward<F>(f));
      return;
    }
    const int n = size();
    calls_.resize(blocks_.size());
    for (auto& c : calls_) c.clear();
    hand_saved(blocks_[n - 1], blocks_[0]);  // where a forward without its backward left them
    forward_each(x, y, [&](Block& b, int i, ConstRows<A, D> in, Rows<A, D> out) {
      b.for_each_dropout([&](DropoutKeys& k) { calls_[i].push_back(k.calls()); });
      f(b, i, in, out);
      if (i + 1 < n) hand_saved(b, blocks_[i + 1]);
    });
  }
  template <class G>
  void backward_each(Backend& be, ConstRows<A, D> dy, Rows<A, D> dx, G&& g) {
    const int n = size();
    A* scratch = grads_.reserve(2 * dy.size());  // ping-pong between blocks
    ConstRows<A, D> d = dy;
    for (int i = n - 1; i >= 0; --i) {
      const Rows<A, D> out = i == 0 ? dx : Rows<A, D>(scratch + std::size_t(i % 2) * dy.size(), dy.rows, dy.cols);
      if (recompute_ == Recompute::block) {
        require(calls_.size() == blocks_.size(), "recompute: a backward without its training forward");
        std::size_t k = 0;
        blocks_[i].for_each_dropout([&](DropoutKeys& keys) { keys.set_calls(calls_[i].at(k++)); });
        blocks_[i].replay(be);
      }
      g(blocks_[i], i, d, out);
      if (recompute_ == Recompute::block && i > 0) hand_saved(blocks_[i], blocks_[i - 1]);
      d = out;
    }
  }

  void visit(ParameterVisitor<Backend> f) {
    for (std::size_t i = 0; i < blocks_.size(); ++i) blocks_[i].visit(prefixed("blocks." + std::to_string(i) + ".", f));
  }
  void for_each_dropout(DropoutVisitor f) {
    for (auto& b : blocks_) b.for_each_dropout(f);
  }
  template <class F>
  void visit_linears(F&& f) {
    for (std::size_t i = 0; i < blocks_.size(); ++i)
      blocks_[i].visit_linears(prefixed_part("blocks." + std::to_string(i) + ".", f));
  }
  Block& operator[](int i) { return blocks_.at(i); }
  int size() const { return static_cast<int>(blocks_.size()); }

 private:
  // Block recompute: `to` takes what `from` saved, buffer by buffer, where
  // its own is smaller, and `from` frees the rest: one set of buffers
  // changes hands, and a stack that kept N sets (before block recompute
  // was set) comes down to one. Frees and allocates nothing in the steady
  // state.
  static void hand_saved(Block& from, Block& to) {
    if (&from == &to) return;
    from.for_each_saved(
        [](auto& a, auto& b) {
          if (b.capacity() < a.capacity()) std::swap(a, b);
          a = {};
        },
        to);
  }

  std::vector<Block> blocks_;
  Buffer<A> acts_, grads_;
  Recompute recompute_ = Recompute::none;
  Buffer<A> shared_norm_, shared_activated_;  // cheap recompute's, for every block
  std::vector<std::vector<std::uint64_t>> calls_;  // block i's dropout counters before its forward (block)
};

}  // namespace xfmr
