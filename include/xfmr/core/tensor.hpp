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
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "xfmr/core/config.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/weight_source.hpp"

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

namespace detail {
// Address space of `bytes` that may be neither read nor written (mapped
// PROT_NONE, no memory behind it): a deferred tensor's address, which its
// decoding copies are found by, and which faults if anything reads it.
std::shared_ptr<void> reserve_address_space(std::size_t bytes);
// The lent deferred tensors' addresses and their sources, process-wide: a
// backend given such an address for which it holds no copy (a model lent
// to one backend's copies, run on another) reads the source instead.
void register_lent(const void* key, std::shared_ptr<const WeightSource> source);
void unregister_lent(const void* key);
std::shared_ptr<const WeightSource> lent_source(const void* key);  // null when not lent
bool any_lent();  // a relaxed read: false before anything was lent
}  // namespace detail

// A host tensor's values are in one of three states:
//   - not yet allocated: resize() records the shape, and the storage (zero)
//     is allocated at the first access, so that a model's gradients cost
//     nothing until a backward pass or a Trainer touches them;
//   - held: contiguous row-major storage, 64-byte aligned;
//   - deferred (defer()): a WeightSource (core/weight_source.hpp) holds the
//     values, in a mapped file, in their stored type. The first access
//     through data() (or any view) reads them into storage as float32 and
//     drops the source. While a WeightCopies scope has lent the tensor to a
//     backend (lend()), product_data() gives its reserved address instead,
//     by which the backend finds the decoding copy it made from the source,
//     so a decoding model never holds its matrices in float32.
// The first access allocates or reads: it is not safe from several threads
// at once (a Trainer and WeightCopies settle a model's tensors before their
// parallel work).
template <class S>
class Tensor : public ShapedStorage<Tensor<S>, S> {
  using Base = ShapedStorage<Tensor<S>, S>;

 public:
  using Base::size;

  Tensor() = default;
  explicit Tensor(std::vector<std::int64_t> shape) { resize(std::move(shape)); }
  Tensor(std::initializer_list<std::int64_t> shape) : Tensor(std::vector<std::int64_t>(shape)) {}

  // Sets the shape; storage only ever grows, so resizing back and forth between
  // (B, T) sizes seen before allocates nothing. New elements are zero. The
  // storage itself is allocated at the first access.
  void resize(std::vector<std::int64_t> shape) {
    std::size_t n = 1;
    for (auto d : shape) n *= d > 0 ? static_cast<std::size_t>(d) : 0;
    if (source_ && n != size()) settle();
    this->set_shape(std::move(shape));
  }

  S* data() {
    settle();
    return storage_.data();
  }
  const S* data() const {
    settle();
    return storage_.data();
  }
  // The values a backend's products read in its activations' type
  // (backend.hpp): these, where that type is S; a lent deferred tensor's
  // reserved address (see above).
  const S* product_data() const {
    if (source_ && lent_ > 0) return static_cast<const S*>(key_.get());
    return data();
  }

  S& operator[](std::size_t i) { return data()[i]; }
  const S& operator[](std::size_t i) const { return data()[i]; }
  S* begin() { return data(); }
  S* end() { return data() + size(); }
  const S* begin() const { return data(); }
  const S* end() const { return data() + size(); }

  void fill(S v) {
    overwrite();
    std::fill(begin(), end(), v);
  }
  void zero() { fill(S(0)); }
  // Sets every element, in order, to f(). With copy_from_host() and
  // copy_to_host() this is how values reach a tensor whatever memory it
  // lives in (cuda::Tensor has the same three).
  template <class F>
  void generate(F&& f) {
    overwrite();
    for (auto& x : *this) x = f();
  }
  void copy_from_host(const S* src) {
    overwrite();
    std::copy(src, src + size(), data());
  }
  void copy_to_host(S* dst) const { std::copy(begin(), end(), dst); }

  // Deferred values (see above): `source` gives this tensor's size() values
  // as source->rows() rows of source->cols(). Storage is given back.
  void defer(std::shared_ptr<const WeightSource> source) {
    require(source && std::size_t(source->rows() * source->cols()) == size(), "a tensor of shape ",
            shape_string(this->shape()), " deferred to ", source ? source->name() : std::string("no source"), " of ",
            source ? source->rows() * source->cols() : 0, " values");
    AlignedVector<S>().swap(storage_);
    key_ = detail::reserve_address_space(size() * sizeof(S));
    source_ = std::move(source);
  }
  bool deferred() const { return source_ != nullptr; }
  // The source of a deferred tensor (null otherwise).
  const std::shared_ptr<const WeightSource>& source() const { return source_; }
  // WeightCopies' loan of a deferred tensor to a backend's copies, and its return.
  void lend() {
    if (lent_++ == 0 && source_) detail::register_lent(key_.get(), source_);
  }
  void give_back() {
    if (lent_ == 0) return;
    if (--lent_ > 0) return;
    if (source_) detail::unregister_lent(key_.get());
    else key_.reset();
  }
  // The bytes of storage allocated (0 while not yet allocated or deferred).
  std::size_t allocated_bytes() const { return storage_.capacity() * sizeof(S); }

 private:
  // Allocated, and holding the values (read from the source if deferred).
  void settle() const {
    if (source_) materialise();
    if (storage_.size() < size()) storage_.resize(size(), S(0));
  }
  // A lent tensor keeps its reserved address until given back: no other
  // allocation may take it while a backend finds its copy by it.
  void materialise() const {
    const auto source = std::move(source_);
    source_.reset();
    if (lent_ == 0) key_.reset();
    else detail::unregister_lent(key_.get());
    storage_.resize(std::max(storage_.size(), size()));
    if constexpr (std::is_same_v<S, float>) {
      source->read_rows(0, source->rows(), storage_.data());
    } else {
      std::vector<float> values(size());
      source->read_rows(0, source->rows(), values.data());
      std::copy(values.begin(), values.end(), storage_.begin());
    }
    source->release();
  }
  // Every value is about to be written: a deferred tensor's source is not read.
  void overwrite() {
    if (source_ && lent_ > 0) detail::unregister_lent(key_.get());
    source_.reset();
    if (lent_ == 0) key_.reset();
  }

  mutable AlignedVector<S> storage_;
  mutable std::shared_ptr<const WeightSource> source_;  // deferred while set
  mutable std::shared_ptr<void> key_;                   // a deferred tensor's reserved address
  int lent_ = 0;
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
