// lora.hpp: low-rank adapters (LoRA) on a Linear's outputs, over a base
// that may be frozen.
//
// A Linear (linear.hpp) holds a LinearAdapters: adapters, each on a range
// of the Linear's output columns [begin, begin + width) (one projection of
// a fused one: q, k or v of attention's qkv, gate or up of a gated fc1; or
// all of them), adding
//
//   y[:, range] += scale * (x A^T) B^T,   A (rank, IN), B (width, rank),
//
// scale alpha / rank (alpha / sqrt(rank) with rsLoRA). A is drawn as peft
// draws it (Kaiming-uniform with a = sqrt(5): U(-1/sqrt(IN), 1/sqrt(IN))),
// B is zero: an adapter starts as the base exactly. A frozen base (freeze)
// computes no gradient of the Linear's weight or bias, whose storage is
// then never touched; the adapters' and the input's gradients still flow.
//
// LoRA dropout (set_dropout(p, seed), peft's lora_dropout): in training,
// each of the model's own adapters reads its input dropped, a mask of its
// own (inverted dropout, layers/dropout.hpp's counter-based keys):
// y[:, range] += scale (drop(x) A^T) B^T; the base reads x whole.
//
// Saves: each adapter's x A^T (rows, rank), in a buffer of its own, and its
// mask's key (the mask is drawn again in backward, not kept). Backward: dA,
// dB accumulate; dx += scale * (dy[:, range] B) A (through the mask), after
// the base's dx. Parameters (visit): "<name>.lora_A" (rank, IN) and
// "<name>.lora_B" (width, rank), name the adapter's ("q", "up", ...).
//
// Several adapters at once (a server's, one a request): an adapter with
// id 0 is the model's own and adds to every row; one with id k > 0 (the
// k-th adapter loaded beside the model, decoding only) adds to the rows
// that select k: select(rows) gives each row's id (0: none of them), as a
// ragged step's rows of several sequences need, or select_all(k) every
// row's. Rows choosing one id sit together in a step (a sequence's), so
// each run of them is one product.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/dropout.hpp"

namespace xfmr {

template <class Backend>
class LinearAdapters {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  struct Adapter {
    std::string name;  // what a target list calls it: "q", "up", "c_attn", ...
    int id = 0;        // 0: the model's own (every row); k > 0: the rows that select k
    int begin = 0, width = 0, rank = 0;
    double scale = 1.0;
    Tensor a, da;       // (rank, IN)
    Tensor b, db;       // (width, rank)
    Buffer<A> xa;       // x A^T of the last forward (rows, rank)
    bool dropped = false;   // whether the last forward dropped its input
    std::uint64_t key = 0;  // ... by the mask of this key
  };

  LinearAdapters(int in, int out) : in_(in), out_(out) {}

  // An adapter on output columns [begin, begin + width): A drawn from rng
  // (peft's Kaiming-uniform), B zero.
  Adapter& add(std::string name, int begin, int width, int rank, double scale, Rng& rng, int id = 0) {
    require(begin >= 0 && width > 0 && begin + width <= out_, "a LoRA adapter on columns [", begin, ", ",
            begin + width, ") of a Linear with ", out_, " outputs");
    require(rank >= 1 && rank <= std::min(in_, width), "LoRA rank ", rank, " outside [1, ", std::min(in_, width),
            "] for ", name, " (", in_, " inputs, ", width, " outputs)");
    require(id >= 0, "LoRA adapter id ", id, " is negative");
    for (const Adapter& x : list_) require(x.name != name || x.id != id, "a second LoRA adapter named ", name);
    Adapter& x = list_.emplace_back();
    x.name = std::move(name), x.id = id, x.begin = begin, x.width = width, x.rank = rank, x.scale = scale;
    x.a.resize({rank, in_});
    x.da.resize({rank, in_});
    x.b.resize({width, rank});
    x.db.resize({width, rank});
    const double bound = 1.0 / std::sqrt(double(in_));
    x.a.generate([&] { return S(rng.uniform(-bound, bound)); });
    x.b.zero();
    return x;
  }
  void clear() {
    list_.clear();
    drop_ = DropoutKeys(0.0f, 0);
  }
  // Drops the adapters of one id (0: and their dropout).
  void clear(int id) {
    std::erase_if(list_, [&](const Adapter& x) { return x.id == id; });
    if (id == 0) drop_ = DropoutKeys(0.0f, 0);
  }
  bool has(int id) const {
    return std::any_of(list_.begin(), list_.end(), [&](const Adapter& x) { return x.id == id; });
  }

  // Which adapters (id k > 0) the next forwards' rows take: rows[r] for
  // row r (its size the forwards' rows), or k for every row (rows empty).
  // The span must outlive those forwards.
  void select(std::span<const int> rows) { rows_ = rows, all_ = 0; }
  void select_all(int id) { rows_ = {}, all_ = id; }

  bool empty() const { return list_.empty(); }
  std::vector<Adapter>& list() { return list_; }
  const std::vector<Adapter>& list() const { return list_; }
  // The base's weight and bias take no gradients.
  void freeze(bool on) { frozen_ = on; }
  bool frozen() const { return frozen_; }
  // LoRA dropout on the model's own adapters' input (p 0: none).
  void set_dropout(float p, std::uint64_t seed) { drop_ = DropoutKeys(p, seed); }
  DropoutKeys& dropout() { return drop_; }
  // f(keys) for its dropout, when it drops (visit_if_dropping).
  void for_each_dropout(DropoutVisitor f) {
    visit_if_dropping(drop_, f);
  }

  // y (rows, OUT) += each adapter's columns.
  void forward(Backend& be, int rows, const A* x, A* y) {
    require(rows_.empty() || rows_.size() == std::size_t(rows), "LoRA: ", rows_.size(), " rows' adapter ids for ",
            rows, " rows");
    for (Adapter& s : list_) {
      A* xa = s.xa.reserve(std::size_t(rows) * std::size_t(s.rank));
      s.dropped = s.id == 0 && drop_.active();
      if (s.dropped) {
        s.key = drop_.next_key();
        auto scratch = be.workspace().frame();
        product(be, s, rows, dropped_input(be, scratch, s.key, rows, x), xa, y);
        continue;
      }
      if (s.id == 0 || (rows_.empty() && all_ == s.id)) {
        product(be, s, rows, x, xa, y);
        continue;
      }
      for (int r = 0; r < int(rows_.size());) {  // each run of rows selecting it
        int end = r + 1;
        while (end < int(rows_.size()) && rows_[std::size_t(end)] == rows_[std::size_t(r)]) ++end;
        if (rows_[std::size_t(r)] == s.id)
          product(be, s, end - r, x + std::size_t(r) * std::size_t(in_), xa, y + std::size_t(r) * std::size_t(out_));
        r = end;
      }
    }
  }

  // The adapters' gradients from dy (rows, OUT) and the saved input x;
  // dx (rows, IN), when not null, gets theirs added.
  void backward(Backend& be, int rows, const A* dy, const A* x, A* dx) {
    auto scratch = be.workspace().frame();
    for (Adapter& s : list_) {
      require(s.id == 0, "LoRA adapter ", s.name, " of id ", s.id, " decodes only (it takes no gradients)");
      const A* g = dy + s.begin;  // (rows, width), row stride OUT
      be.gemm(true, false, s.width, s.rank, rows, S(s.scale), g, out_, s.xa.data(), s.rank, S(1), s.db.data(), s.rank);
      A* gb = scratch.take(std::size_t(rows) * std::size_t(s.rank));  // scale dy B (rows, rank)
      be.gemm(false, false, rows, s.rank, s.width, S(s.scale), g, out_, s.b.product_data(), s.rank, S(0), gb, s.rank);
      if (!s.dropped) {
        be.gemm(true, false, s.rank, in_, rows, S(1), gb, s.rank, x, in_, S(1), s.da.data(), in_);
        if (dx) be.gemm(false, false, rows, in_, s.rank, S(1), gb, s.rank, s.a.product_data(), in_, S(1), dx, in_);
        continue;
      }
      // Through the mask: dA += gb^T drop(x); dx += drop'(gb A).
      auto inner = be.workspace().frame();
      const std::size_t n = std::size_t(rows) * std::size_t(in_);
      std::uint8_t* keep = nullptr;
      const A* xd = dropped_input(be, inner, s.key, rows, x, &keep);
      be.gemm(true, false, s.rank, in_, rows, S(1), gb, s.rank, xd, in_, S(1), s.da.data(), in_);
      if (!dx) continue;
      A* gx = inner.take(n);
      be.gemm(false, false, rows, in_, s.rank, S(1), gb, s.rank, s.a.product_data(), in_, S(0), gx, in_);
      be.dropout_backward(n, drop_.p(), keep, gx, gx);
      be.add_to(n, gx, dx);
    }
  }

  // f(name, value, grad) for each of the model's own adapters' A and B
  // (id 0: the parameters that train).
  void visit(ParameterVisitor<Backend> f) {
    for (Adapter& s : list_) {
      if (s.id != 0) continue;
      f(s.name + ".lora_A", s.a, s.da);
      f(s.name + ".lora_B", s.b, s.db);
    }
  }

 private:
  int in_, out_;
  bool frozen_ = false;
  std::vector<Adapter> list_;
  std::span<const int> rows_;  // select's
  int all_ = 0;                // select_all's
  DropoutKeys drop_{0.0f, 0};  // LoRA dropout's

  // x (rows, IN) dropped by the mask of `key`, in the frame's scratch (and
  // the mask, when asked for).
  template <class Frame>
  const A* dropped_input(Backend& be, Frame& frame, std::uint64_t key, int rows, const A* x,
                         std::uint8_t** mask = nullptr) {
    const std::size_t n = std::size_t(rows) * std::size_t(in_);
    A* xd = frame.take(n);
    auto* keep = reinterpret_cast<std::uint8_t*>(frame.take((n + sizeof(A) - 1) / sizeof(A)));
    be.dropout_forward(n, drop_.p(), key, x, xd, keep);
    if (mask) *mask = keep;
    return xd;
  }

  // y (rows, OUT)[:, range] += scale (x A^T) B^T, x A^T into xa.
  void product(Backend& be, Adapter& s, int rows, const A* x, A* xa, A* y) {
    be.gemm(false, true, rows, s.rank, in_, S(1), x, in_, s.a.product_data(), in_, S(0), xa, s.rank);
    be.gemm(false, true, rows, s.width, s.rank, S(s.scale), xa, s.rank, s.b.product_data(), s.rank, S(1), y + s.begin,
            out_);
  }
};

}  // namespace xfmr
