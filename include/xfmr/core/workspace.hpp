// workspace.hpp: Workspace<Buf>, the scratch memory a backend lends the
// layers for the length of a call (be.workspace()): a backward pass's
// gradients of a layer's intermediates, a forward's results that nothing
// keeps. Where every layer owned such buffers for the whole step, a model
// now holds the scratch of its deepest nest of calls once.
//
//   auto scratch = be.workspace().frame();
//   const auto dsub = scratch.rows<D>(n);   // (n, D), until `scratch` ends
//
// Frames nest (a residual's scratch, then its sublayer's inside it) and
// give their memory back when they end, in reverse order: scratch never
// outlives the frame it was taken in. In the steady state the memory is one
// buffer and nothing is allocated. A take that does not fit opens another
// buffer after it (memory in use never moves); when the outermost frame
// ends, the buffers become one of the high-water size, so a second call
// with the same shapes allocates nothing (test_workspace, test_steady_state).
//
// Buf is the backend's Buffer<S> (host or device memory); one workspace
// serves one thread, as its backend does (DataParallel's shards each have
// their own backend).
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

template <class Buf>
class Workspace {
 public:
  using T = std::remove_pointer_t<decltype(std::declval<Buf&>().data())>;
  // Every take starts on a 64-byte line (buffers start on one).
  static constexpr std::size_t kAlign = 64 / sizeof(T) > 0 ? 64 / sizeof(T) : 1;

  class Frame {
   public:
    explicit Frame(Workspace& ws) : ws_(ws), chunk_(ws.chunk_), top_(ws.top_), used_(ws.used_) { ++ws.depth_; }
    ~Frame() { ws_.pop(chunk_, top_, used_); }
    Frame(const Frame&) = delete;
    Frame& operator=(const Frame&) = delete;

    // n elements, uninitialised, valid until this frame ends.
    T* take(std::size_t n) { return ws_.take(n); }
    template <int COLS>
    Rows<T, COLS> rows(int r) {
      return {take(static_cast<std::size_t>(r) * COLS), r};
    }
    template <int COLS>
    Rows<T, COLS> rows(int r, Dim<COLS> cols) {
      return {take(static_cast<std::size_t>(r) * cols), r, cols};
    }

   private:
    Workspace& ws_;
    std::size_t chunk_, top_, used_;
  };

  Workspace() = default;
  // Scratch holds nothing between calls: a copy starts empty, and an
  // assignment empties this one (no frame may be open on it).
  Workspace(const Workspace&) {}
  Workspace& operator=(const Workspace&) {
    require(depth_ == 0, "a workspace assigned to while ", depth_, " frames use it");
    chunks_.clear();
    chunk_ = top_ = used_ = high_ = 0;
    return *this;
  }

  Frame frame() { return Frame(*this); }

  // Elements held (all buffers), and the most taken at once so far.
  std::size_t capacity() const {
    std::size_t n = 0;
    for (const auto& c : chunks_) n += c.capacity();
    return n;
  }
  std::size_t high_water() const { return high_; }
  std::size_t buffers() const { return chunks_.size(); }

 private:
  T* take(std::size_t n) {
    n = (n + kAlign - 1) / kAlign * kAlign;
    if (chunks_.empty() || top_ + n > chunks_[chunk_].capacity()) {
      // Another buffer after the one in use (those past it hold nothing now).
      const std::size_t next = chunks_.empty() ? 0 : chunk_ + 1;
      chunks_.resize(next);
      chunks_.emplace_back().reserve(std::max(n, next == 0 ? high_ : 0));
      chunk_ = next;
      top_ = 0;
    }
    T* p = chunks_[chunk_].data() + top_;
    top_ += n;
    used_ += n;
    high_ = std::max(high_, used_);
    return p;
  }

  void pop(std::size_t chunk, std::size_t top, std::size_t used) {
    chunk_ = chunk, top_ = top, used_ = used;
    if (--depth_ == 0 && chunks_.size() > 1) {  // nothing in use: one buffer of the high-water size
      chunks_.clear();
      chunks_.emplace_back().reserve(high_);
      chunk_ = top_ = 0;
    }
  }

  std::vector<Buf> chunks_;
  std::size_t chunk_ = 0, top_ = 0;  // the buffer in use and its first free element
  std::size_t used_ = 0, high_ = 0;  // elements taken now (the buffers' sum), and at most
  int depth_ = 0;                    // frames open
};

}  // namespace xfmr
