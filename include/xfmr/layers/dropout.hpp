// dropout.hpp: inverted dropout. In training mode each element is zeroed with
// probability p and the rest scaled by 1/(1-p); in evaluation mode (or p = 0)
// it is the identity.
//
//   DropoutKeys       where a dropout's masks come from: rate, seed, call
//                     counter, stream and training flag. Attention holds one
//                     for the dropout on its probabilities.
//   Dropout<D, Be>    the layer: DropoutKeys plus the mask it saves.
//
// Masks are counter-based: call c of a layer seeded s draws element i from
// hash(s, c, i) (dropout_keeps), so a run is reproducible whatever the thread
// count, and calls()/set_calls() are all the state a checkpoint needs to
// resume it. set_stream(r) gives the layer another stream of masks (0, the
// default, is the plain one): DataParallel's replica for shard r draws from
// stream r, so that the shards of a batch do not share their masks.
// Models visit every DropoutKeys with for_each_dropout (training flag, call
// counters, streams).
// Saves: the keep mask. Backward: dx assigned (dx may alias dy). No parameters.
#pragma once

#include <cstdint>

#include "xfmr/core/error.hpp"
#include "xfmr/core/function_ref.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

class DropoutKeys {
 public:
  DropoutKeys(float p, std::uint64_t seed) : p_(p), seed_(seed) {
    require(p >= 0.0f && p < 1.0f, "dropout probability ", p, " outside [0, 1)");
  }

  // Whether a call now would drop anything (training, p > 0).
  bool active() const { return training_ && p_ > 0.0f; }
  // The key of the next call's mask; counts the call.
  std::uint64_t next_key() {
    const std::uint64_t salt = stream_ ? detail::mix64(~stream_) : 0;
    return detail::mix64(seed_ ^ detail::mix64(calls_++) ^ salt);
  }

  void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }
  float p() const { return p_; }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t calls() const { return calls_; }
  void set_calls(std::uint64_t c) { calls_ = c; }
  std::uint64_t stream() const { return stream_; }
  void set_stream(std::uint64_t s) { stream_ = s; }

 private:
  float p_;
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
  std::uint64_t stream_ = 0;
  bool training_ = true;
};

// A for_each_dropout's callable behind a FunctionRef (core/params.hpp's
// ParameterVisitor says why).
using DropoutVisitor = FunctionRef<void(DropoutKeys&)>;

// f(keys) where keys drop anything (p > 0): how blocks visit their attention
// dropout, so that a model without it has the counters, and checkpoints, it
// had before attention dropout existed.
template <class F>
void visit_if_dropping(DropoutKeys& keys, F&& f) {
  if (keys.p() > 0.0f) f(keys);
}

template <int D, class Backend>
class Dropout : public DropoutKeys {
 public:
  using A = typename Backend::Activation;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  Dropout(float p, std::uint64_t seed) : DropoutKeys(p, seed) {}

  void forward(Backend& be, ConstRows<A, D> x, Rows<A, D> y) {
    require_rows(y, x.rows, "Dropout output");
    rows_ = x.rows;
    active_ = active();
    if (!active_) {
      be.copy(x.size(), x.data, y.data);
      return;
    }
    be.dropout_forward(x.size(), p(), next_key(), x.data, y.data, keep_.reserve(x.size()));
  }

  void backward(Backend& be, ConstRows<A, D> dy, Rows<A, D> dx) {
    require_rows(dy, rows_, "Dropout output gradient");
    require_rows(dx, rows_, "Dropout input gradient");
    if (!active_) {
      be.copy(dy.size(), dy.data, dx.data);
      return;
    }
    be.dropout_backward(dy.size(), p(), keep_.data(), dy.data, dx.data);
  }

  template <class F>
  void visit(F&&) {}

 private:
  bool active_ = false;
  int rows_ = 0;
  Buffer<std::uint8_t> keep_;  // (rows, D)

 public:
  // f(buffer, the same buffer of others...) for what the last forward saved
  // (activation recompute frees or trades it, block_stack.hpp).
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    f(keep_, others.keep_...);
  }
};

}  // namespace xfmr
