// weight_source.hpp: where a matrix's values lie when the model does not
// hold them as float32: a mapped file's tensor, or several of them
// reordered (a published Llama's q, k and v rows are one xfmr matrix), in
// their stored type, converted as they are read.
//
// A model loaded to decode holds its matrices so (core/tensor.hpp's
// deferred tensors): the backend's decoding copies (infer/weight_copies.hpp)
// are made from the source matrix by matrix, its pages given back after
// each, and a Trainer converts them to float32 master weights then
// (Tensor::data()). Nothing reads a source that its matrix's tensor has not
// handed out, and a source is only read, so threads may read one at once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace xfmr {

// The layouts of stored matrices that a decoding kernel reads as they are.
enum class StoredLayout {
  none,
  bf16_rows,  // rows x cols bfloat16, row-major
  int8_rows,  // rows x cols int8 with a float scale a row (core/int8.hpp)
  q4_panels,  // core/q4.hpp's panels, whose bytes the 4-bit kernels read in place
};
struct StoredWeights {
  StoredLayout layout = StoredLayout::none;
  const std::byte* data = nullptr;
  std::vector<float> scales;  // int8_rows: a scale a row
};

class WeightSource {
 public:
  WeightSource(std::int64_t rows, std::int64_t cols) : rows_(rows), cols_(cols) {}
  virtual ~WeightSource() = default;
  WeightSource(const WeightSource&) = delete;
  WeightSource& operator=(const WeightSource&) = delete;

  // The matrix's shape (a vector is one row).
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  // Rows [r0, r1) as float32, cols() apart, into out. A value that is not
  // finite is an xfmr::Error naming the source and the element.
  virtual void read_rows(std::int64_t r0, std::int64_t r1, float* out) const = 0;
  // Rows [r0, r1) where they lie in memory as float32 already (the rows of
  // a tensor that holds its values), or null: read them (read_rows). A
  // mapped file's rows are read, not pointed to: copies made from them
  // packed 20% slower, faulting in 16 rows' pages at once.
  virtual const float* rows_in_memory(std::int64_t r0, std::int64_t r1) const {
    (void)r0, (void)r1;
    return nullptr;
  }
  // The matrix as stored, where it is stored in `layout` and a kernel can
  // read it in place (checked as read_rows checks values, once); else
  // layout none: read_rows then.
  virtual StoredWeights stored(StoredLayout layout) const {
    (void)layout;
    return {};
  }
  // Writes the matrix as core/q4.hpp's panels (q4_bytes(rows, cols) at P)
  // where it is stored in blocks of the same numbers, exactly (a GGUF
  // file's Q4_0: a float16 scale and 32 4-bit values, w = d (q - 8), the
  // bytes reordered), and returns true; false otherwise: a 4-bit copy then
  // quantises read_rows' values.
  virtual bool q4_panels(std::byte* P) const {
    (void)P;
    return false;
  }
  // Gives back what reading has brought into memory (a mapped file's pages;
  // they are read again from the file if read again). A copy made from the
  // source calls it once made.
  virtual void release() const {}
  // The same for what reading rows [r0, r1) brought in, where that can be
  // told apart (a copy made a chunk of rows at a time gives back each
  // chunk's pages as it goes).
  virtual void release_rows(std::int64_t r0, std::int64_t r1) const {
    (void)r0, (void)r1;
  }
  // "FILE: tensor 'NAME'", for errors.
  virtual std::string name() const = 0;

 private:
  std::int64_t rows_, cols_;
};

// float32 rows in memory that the caller keeps unchanged while the source
// is read (a tensor that holds its values).
class MemoryWeights final : public WeightSource {
 public:
  MemoryWeights(const float* data, std::int64_t rows, std::int64_t cols) : WeightSource(rows, cols), data_(data) {}
  void read_rows(std::int64_t r0, std::int64_t r1, float* out) const override {
    std::copy(data_ + r0 * cols(), data_ + r1 * cols(), out);
  }
  const float* rows_in_memory(std::int64_t r0, std::int64_t) const override { return data_ + r0 * cols(); }
  std::string name() const override { return "a matrix in memory"; }

 private:
  const float* data_;
};

// float32 rows a source owns (a copy of a tensor's values).
class HeldWeights final : public WeightSource {
 public:
  HeldWeights(std::vector<float> values, std::int64_t rows, std::int64_t cols)
      : WeightSource(rows, cols), values_(std::move(values)) {}
  void read_rows(std::int64_t r0, std::int64_t r1, float* out) const override {
    std::copy(values_.begin() + r0 * cols(), values_.begin() + r1 * cols(), out);
  }
  std::string name() const override { return "a matrix in memory"; }

 private:
  std::vector<float> values_;
};

}  // namespace xfmr
