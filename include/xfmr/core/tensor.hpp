// tensor.hpp: host storage and the views layers pass around.
//
// Tensor<S> owns a contiguous row-major heap buffer with a shape. Rows<S, COLS>
// is a non-owning (rows x COLS) view whose width is static and whose row count
// (B*T) is runtime: layers take and return these, so a wrongly sized buffer is
// an xfmr::Error at the layer boundary instead of a silent overrun.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "xfmr/core/config.hpp"
#include "xfmr/core/error.hpp"

namespace xfmr {

// A batch of B sequences of length T, laid out as B*T rows.
struct Shape {
  int B = 0;
  int T = 0;
  int rows() const { return B * T; }
};

// Storage aligned to 64 bytes (a cache line, an AVX-512 register). Besides
// speed, this makes results reproducible across processes: vectorised
// reductions peel to alignment, so their summation order depends on where a
// buffer starts, and malloc's 16-byte alignment varies with allocation
// history (a resumed run would round differently from an uninterrupted one).
template <class T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
};
template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

namespace detail {
// A row view's width: static (no storage) or held at run time.
template <int COLS>
struct RowsWidth {
  static constexpr int cols = COLS;
};
template <>
struct RowsWidth<Dynamic> {
  int cols = 0;
};
}  // namespace detail

// Rows<S, COLS>: COLS may be Dynamic (core/config.hpp), the width then held
// at run time. A static view converts to a Dynamic one of the same element
// type, and a Dynamic one to a static one after a check of its width.
template <class S, int COLS>
struct Rows : detail::RowsWidth<COLS> {
  static_assert(COLS > 0 || COLS == Dynamic, "a row view needs a positive static width (or xfmr::Dynamic)");

  S* data = nullptr;
  int rows = 0;

  Rows() = default;
  Rows(S* d, int r)
    requires(COLS != Dynamic)
      : data(d), rows(r) {
    require(r >= 0, "negative row count ", r);
  }
  Rows(S* d, int r, int c) : data(d), rows(r) {
    require(r >= 0, "negative row count ", r);
    if constexpr (COLS == Dynamic) {
      require(c > 0, "a row view of width ", c);
      this->cols = c;
    } else {
      require(c == COLS, "a view of width ", c, " where width ", COLS, " is expected");
    }
  }
  // A mutable view converts to a read-only one, and a view's static width
  // to a Dynamic one or back (checked).
  template <class U, int C>
    requires(std::is_same_v<const U, S> || std::is_same_v<U, S>) &&
            (C == COLS || C == Dynamic || COLS == Dynamic) && (!std::is_same_v<U, S> || C != COLS)
  Rows(Rows<U, C> other) : Rows(other.data, other.rows, other.cols) {}

  std::size_t size() const { return static_cast<std::size_t>(rows) * this->cols; }
  S* row(int i) const { return data + static_cast<std::size_t>(i) * this->cols; }
};

template <class S, int COLS>
using ConstRows = Rows<const S, COLS>;

// Throws unless the view holds exactly `expected` rows.
template <class S, int COLS>
void require_rows(const Rows<S, COLS>& v, int expected, const char* what) {
  require(v.rows == expected, what, " has ", v.rows, " rows, expected ", expected);
}

// Throws unless the view is `width` wide (a Dynamic layer's input, checked
// where a static one is checked by its type).
template <class S, int COLS>
void require_width(const Rows<S, COLS>& v, int width, const char* what) {
  if constexpr (COLS == Dynamic) require(v.cols == width, what, " is ", v.cols, " wide, expected ", width);
  else require(COLS == width, what, " is ", COLS, " wide, expected ", width);
}

// Shape bookkeeping and row views shared by the host Tensor and the device
// one (cuda::Tensor): Derived provides data().
template <class Derived, class S>
class ShapedStorage {
 public:
  using value_type = S;

  std::size_t size() const { return size_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t dim(std::size_t i) const { return shape_.at(i); }

  // View as rows of static width COLS (the last dimension must equal COLS),
  // or of the width cols holds (a Dim, static or Dynamic).
  template <int COLS>
  Rows<S, COLS> rows() {
    check_width(COLS);
    return {static_cast<Derived&>(*this).data(), static_cast<int>(size_ / COLS)};
  }
  template <int COLS>
  ConstRows<S, COLS> rows() const {
    check_width(COLS);
    return {static_cast<const Derived&>(*this).data(), static_cast<int>(size_ / COLS)};
  }
  template <int COLS>
  Rows<S, COLS> rows(Dim<COLS> cols) {
    check_width(cols);
    return {static_cast<Derived&>(*this).data(), static_cast<int>(size_ / cols), cols};
  }
  template <int COLS>
  ConstRows<S, COLS> rows(Dim<COLS> cols) const {
    check_width(cols);
    return {static_cast<const Derived&>(*this).data(), static_cast<int>(size_ / cols), cols};
  }

 protected:
  // Records the shape and returns its element count.
  std::size_t set_shape(std::vector<std::int64_t> shape) {
    std::size_t n = 1;
    for (auto d : shape) {
      require(d >= 0, "negative tensor dimension ", d, " in shape ", shape_string(shape));
      n *= static_cast<std::size_t>(d);
    }
    shape_ = std::move(shape);
    return size_ = n;
  }

 private:
  void check_width(int cols) const {
    require(!shape_.empty() && shape_.back() == cols, "tensor of shape ", shape_string(shape_),
            " viewed as rows of width ", cols);
  }

  std::vector<std::int64_t> shape_;
  std::size_t size_ = 0;
};

template <class S>
class Tensor : public ShapedStorage<Tensor<S>, S> {
  using Base = ShapedStorage<Tensor<S>, S>;

 public:
  using Base::size;

  Tensor() = default;
  explicit Tensor(std::vector<std::int64_t> shape) { resize(std::move(shape)); }
  Tensor(std::initializer_list<std::int64_t> shape) : Tensor(std::vector<std::int64_t>(shape)) {}

  // Sets the shape; storage only ever grows, so resizing back and forth between
  // (B, T) sizes seen before allocates nothing. New elements are zero.
  void resize(std::vector<std::int64_t> shape) {
    const std::size_t n = this->set_shape(std::move(shape));
    if (storage_.size() < n) storage_.resize(n, S(0));
  }

  S* data() { return storage_.data(); }
  const S* data() const { return storage_.data(); }
  // The values a backend's products read in its activations' type
  // (backend.hpp): these, where that type is S.
  const S* product_data() const { return data(); }

  S& operator[](std::size_t i) { return storage_[i]; }
  const S& operator[](std::size_t i) const { return storage_[i]; }
  S* begin() { return data(); }
  S* end() { return data() + size(); }
  const S* begin() const { return data(); }
  const S* end() const { return data() + size(); }

  void fill(S v) { std::fill(begin(), end(), v); }
  void zero() { fill(S(0)); }
  // Sets every element, in order, to f(). With copy_from_host() and
  // copy_to_host() this is how values reach a tensor whatever memory it
  // lives in (cuda::Tensor has the same three).
  template <class F>
  void generate(F&& f) {
    for (auto& x : *this) x = f();
  }
  void copy_from_host(const S* src) { std::copy(src, src + size(), data()); }
  void copy_to_host(S* dst) const { std::copy(begin(), end(), dst); }

 private:
  AlignedVector<S> storage_;
};

}  // namespace xfmr

namespace xfmr {

// Buffer<T>: grows-only scratch for activations and saved state. reserve(n)
// allocates only when n exceeds every size asked for before, so a training
// loop allocates on its first step for a given (B, T) and never after.
template <class T>
class Buffer {
 public:
  T* reserve(std::size_t n) {
    if (storage_.size() < n) storage_.resize(n);
    return storage_.data();
  }
  template <int COLS>
  Rows<T, COLS> rows(int r) {
    return {reserve(static_cast<std::size_t>(r) * COLS), r};
  }
  // r rows of the width cols holds (static or Dynamic).
  template <int COLS>
  Rows<T, COLS> rows(int r, Dim<COLS> cols) {
    return {reserve(static_cast<std::size_t>(r) * cols), r, cols};
  }
  T* data() { return storage_.data(); }
  const T* data() const { return storage_.data(); }
  std::size_t capacity() const { return storage_.size(); }

 private:
  AlignedVector<T> storage_;
};

}  // namespace xfmr
