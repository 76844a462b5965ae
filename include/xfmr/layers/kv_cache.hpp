// kv_cache.hpp: keys and values of the positions already decoded, so that
// each new position costs one row of work per layer instead of a pass over
// the whole prefix.
//
// KvCache holds one attention layer's cache for B sequences:
//   k (B, capacity, k_width), v (B, capacity, v_width), `length` rows filled.
// DecodingCache holds one KvCache per layer of a model. reorder() permutes the
// sequences (beam search keeps the cache of the beams it continues);
// truncate() forgets the newest positions; copy_prefix() gives a sequence
// another's first positions (a prompt's prefix, shared).
//
// A ragged step (continuous batching, infer/continuous_batching.hpp) decodes
// sequences of different lengths together: a DecodingCache started for
// `slots` sequences is a pool, row b of each layer one sequence's, and each
// StepSegment says which row its new positions go to and where they start;
// the positions live in the segments, and the cache's own length stays 0.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "xfmr/core/error.hpp"

namespace xfmr {

// `rows` new positions of the sequence in cache row `slot`, at positions
// [start, start + rows): the sequence's earlier positions are in the cache.
// `outputs`: the last positions whose logits the step returns (1: the next
// token's; more: a speculative step's drafts, each checked).
struct StepSegment {
  int slot = 0, start = 0, rows = 0, outputs = 1;
};
// A ragged step's segments, their rows consecutive in the step's input.
using RaggedStep = std::span<const StepSegment>;

template <class Backend>
class KvCache {
 public:
  using A = typename Backend::Activation;

  void reset(int batch, int capacity, int k_width, int v_width) {
    require(batch > 0 && capacity > 0, "cache for ", batch, " sequences of ", capacity, " positions");
    B_ = batch, capacity_ = capacity, k_width_ = k_width, v_width_ = v_width, length_ = 0;
    k_.reserve(std::size_t(batch) * capacity * k_width);
    v_.reserve(std::size_t(batch) * capacity * v_width);
  }

  // Copies position rows [length, length + n) of every sequence from src
  // (B*n rows, row stride ld, keys at column k_col, values at v_col).
  void append(Backend& be, const A* src, int ld, int k_col, int v_col, int n) {
    require(length_ + n <= capacity_, "decoding past the cache: ", length_, " + ", n, " positions exceed ", capacity_);
    for (int b = 0; b < B_; ++b)
      for (int t = 0; t < n; ++t) {
        const A* row = src + (std::size_t(b) * n + t) * ld;
        be.copy(k_width_, row + k_col, k_row(b, length_ + t));
        be.copy(v_width_, row + v_col, v_row(b, length_ + t));
      }
    length_ += n;
  }

  // Counts n more positions whose rows the caller wrote in place (through
  // k_row and v_row, or a backend's fused decoding step).
  void advance(int n) {
    require(length_ + n <= capacity_, "decoding past the cache: ", length_, " + ", n, " positions exceed ", capacity_);
    length_ += n;
  }

  // Forgets every position from `length` on (rolls decoding back).
  void truncate(int length) {
    require(length >= 0 && length <= length_, "cannot truncate a cache of ", length_, " positions to ", length);
    length_ = length;
  }

  // Sequence `to` takes the first n positions of sequence `from` (a
  // shared prompt's, copied instead of computed again).
  void copy_prefix(Backend& be, int from, int to, int n) {
    require(from >= 0 && from < B_ && to >= 0 && to < B_ && n >= 0 && n <= capacity_, "copy of ", n,
            " positions from sequence ", from, " to ", to, " in a cache of ", B_, " x ", capacity_);
    if (n == 0 || from == to) return;
    be.copy(std::size_t(n) * k_width_, k_row(from, 0), k_row(to, 0));
    be.copy(std::size_t(n) * v_width_, v_row(from, 0), v_row(to, 0));
  }

  // Sequence b takes the cache of sequence order[b].
  void reorder(Backend& be, std::span<const int> order) {
    require(order.size() == std::size_t(B_), "reorder of ", order.size(), " sequences, the cache holds ", B_);
    const std::size_t kn = std::size_t(length_) * k_width_, vn = std::size_t(length_) * v_width_;
    A* kt = scratch_k_.reserve(std::size_t(B_) * kn);
    A* vt = scratch_v_.reserve(std::size_t(B_) * vn);
    for (int b = 0; b < B_; ++b) {
      require(order[b] >= 0 && order[b] < B_, "reorder index ", order[b], " out of range [0, ", B_, ")");
      be.copy(kn, k_row(order[b], 0), kt + b * kn);
      be.copy(vn, v_row(order[b], 0), vt + b * vn);
    }
    for (int b = 0; b < B_; ++b) {
      be.copy(kn, kt + b * kn, k_row(b, 0));
      be.copy(vn, vt + b * vn, v_row(b, 0));
    }
  }

  A* k_row(int b, int t) { return k_.data() + (std::size_t(b) * capacity_ + t) * k_width_; }
  A* v_row(int b, int t) { return v_.data() + (std::size_t(b) * capacity_ + t) * v_width_; }
  const A* keys() const { return k_.data(); }
  const A* values() const { return v_.data(); }
  int batch() const { return B_; }
  int capacity() const { return capacity_; }
  int length() const { return length_; }
  int k_width() const { return k_width_; }
  int v_width() const { return v_width_; }

 private:
  int B_ = 0, capacity_ = 0, k_width_ = 0, v_width_ = 0, length_ = 0;
  typename Backend::template Buffer<A> k_, v_, scratch_k_, scratch_v_;
};

// One cache per layer, all at the same length.
template <class Backend>
class DecodingCache {
 public:
  std::vector<KvCache<Backend>>& layers() { return layers_; }
  KvCache<Backend>& operator[](int i) { return layers_.at(i); }
  int length() const { return layers_.empty() ? 0 : layers_.front().length(); }
  int batch() const { return layers_.empty() ? 0 : layers_.front().batch(); }
  void reorder(Backend& be, std::span<const int> order) {
    for (auto& l : layers_) l.reorder(be, order);
  }
  void truncate(int length) {
    for (auto& l : layers_) l.truncate(length);
  }
  void copy_prefix(Backend& be, int from, int to, int n) {
    for (auto& l : layers_) l.copy_prefix(be, from, to, n);
  }

 private:
  std::vector<KvCache<Backend>> layers_;
};

}  // namespace xfmr
