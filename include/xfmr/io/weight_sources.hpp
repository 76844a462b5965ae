// weight_sources.hpp: WeightSources (core/weight_source.hpp) over the
// tensors of a safetensors file, which the loaders (io/pretrained.hpp)
// defer a model's matrices to: nothing is read or converted at load.
//
// safetensors_weights(file, pieces, rows, cols): the rows x cols matrix
// whose rows are its pieces' rows in turn, each piece one tensor of the
// file read
//   as its rows (a tensor of more than two dimensions as rows of its last;
//     a vector as a column: one value a row, a bias);
//   as rotary pairs: Hugging Face's q or k heads of `head` rows each, in
//     xfmr's order (row 2i of a head takes the head's row i, row 2i + 1 its
//     row head / 2 + i; io/hf_llama.hpp);
//   as its columns (a tensor stored transposed: GPT-2's Conv1D);
// in the tensor's stored type: F32, F16, BF16, F64; I8 rows with their
// scales, tensor "<name>_scale" (an int8 checkpoint's, io/checkpoint.hpp);
// or U8 4-bit panels (a 4-bit checkpoint's, core/q4.hpp, of shape (panels,
// blocks, 288) for a rows x cols matrix). Reading converts to float32 and
// refuses, naming the file, the tensor and the element, a value that is
// not finite, an int8 value of -128 or a scale a kernel cannot use.
// stored(layout) gives the bytes as they are where one piece is read as
// its rows and they are in that layout (BF16 rows, I8 rows with scales,
// 4-bit panels), checked once. The source keeps the file's bytes mapped while it lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "xfmr/core/tensor.hpp"
#include "xfmr/core/weight_source.hpp"
#include "xfmr/io/gguf.hpp"
#include "xfmr/io/safetensors.hpp"

namespace xfmr {

struct WeightPiece {
  enum Order { rows, rotary_pairs, columns };
  std::string tensor;
  Order order = rows;
  int head = 0;  // rotary_pairs: the rows of a head
};

std::shared_ptr<const WeightSource> safetensors_weights(const SafeTensors& file, std::vector<WeightPiece> pieces,
                                                        std::int64_t rows, std::int64_t cols);

// gguf_weights(file, pieces, rows, cols): the same over a GGUF file's
// tensors (io/gguf.hpp), each piece read as its rows or as rotary pairs (a
// qwen2 file's q and k heads are Hugging Face's halves), a tensor of one
// dimension as a column; in every type GgufFile reads, converted to
// float32 as read (values not finite refused as above). Stored in place:
// BF16 rows (stored(bf16_rows)), and a Q4_0 matrix's blocks, which hold
// 4-bit panels' numbers and are copied into them exactly (q4_panels).
std::shared_ptr<const WeightSource> gguf_weights(std::shared_ptr<const GgufFile> file, std::vector<WeightPiece> pieces,
                                                 std::int64_t rows, std::int64_t cols);

// The values of a source, all of them (a vector's, a small matrix's).
std::vector<float> read_all(const WeightSource& source);

// Gives `value` the values of `source`: deferred to it where the tensor
// can be (a host float matrix: core/tensor.hpp), read now otherwise (a
// vector, a GPU's or a double model's tensor).
template <class Tensor>
void assign_weights(Tensor& value, std::shared_ptr<const WeightSource> source) {
  using S = typename Tensor::value_type;
  if constexpr (std::is_same_v<Tensor, xfmr::Tensor<float>>)
    if (value.shape().size() == 2) return value.defer(std::move(source));
  const std::vector<float> v = read_all(*source);
  if constexpr (std::is_same_v<S, float>) {
    value.copy_from_host(v.data());
  } else {
    const std::vector<S> host(v.begin(), v.end());
    value.copy_from_host(host.data());
  }
}

// The metadata key of a decoding checkpoint's weights (io/checkpoint.hpp)
// and its values.
inline constexpr const char* kWeightsKey = "weights";
inline constexpr const char* kInt8Weights = "int8";
inline constexpr const char* kQ4Weights = "q4";
inline constexpr const char* kScaleSuffix = "_scale";

}  // namespace xfmr
