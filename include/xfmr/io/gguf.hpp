// gguf.hpp: GGUF files (ggml's format, versions 2 and 3: what llama.cpp,
// Ollama and LM Studio read), mapped and read in place: the metadata
// (typed keys and values, arrays included), the tensors' names, shapes,
// types and bytes, and the values of every type xfmr reads, as float32.
//
//   const auto f = xfmr::GgufFile::open("stories260K.gguf");
//   f.string("general.architecture");               // "llama"
//   f.integer("llama.block_count");                 // 5
//   const xfmr::GgufTensor& t = f.tensor("blk.0.attn_q.weight");
//   t.shape;                                         // {64, 64}: innermost first, as ggml's ne
//   std::vector<float> w = f.values(t);              // every element, row after row
//
// Layout: "GGUF", a version, the tensor and key counts, the keys (a string,
// a value type, a value; an array is an element type, a count and the
// elements), the tensor descriptions (a name, the dimension count, the
// dimensions innermost first, a ggml type, an offset into the data), and
// the data, starting at the next multiple of general.alignment (32 when
// unset), each tensor at its offset from there. Little-endian throughout.
//
// Types read: F32, F16, BF16, Q8_0 and Q4_0 (blocks of 32: a float16 scale
// and 8- or 4-bit values, Q4_0's low nibbles the block's first 16), Q4_K
// (super-blocks of 256: float16 scale and minimum, eight 6-bit scale and
// minimum pairs, 4-bit values) and Q6_K (256: 4 low and 2 high bits a
// value, sixteen 8-bit scales, a float16 scale). Any other type, a file
// that ends before what it declares, a count past what the file could
// hold, an offset outside the data, or a version other than 2 or 3 is an
// xfmr::Error naming the file and what is wrong, before anything else is
// read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xfmr {

// ggml's tensor types (the numbers are the file's).
enum class GgmlType : std::uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9,
  q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15, bf16 = 30,
};
// Whether `path` is a file that starts as a GGUF file does ("GGUF").
bool is_gguf_file(const std::filesystem::path& path);
// "Q4_K" and the like; "type 23" for one xfmr does not know.
std::string ggml_type_name(GgmlType t);
// The type a writer's option names: f32, f16, bf16, q8_0 or q4_0 (an
// Error naming `what` and the choices otherwise).
GgmlType ggml_type_named(std::string_view name, std::string_view what = "type");

// A metadata value: one of the file's scalar types, a string, or an array
// of either (kept as the numbers or the strings it holds).
struct GgufValue {
  enum class Type : std::uint32_t {
    u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
    u64 = 10, i64 = 11, f64 = 12,
  };
  Type type = Type::u32;     // the value's, or for an array its elements'
  bool array = false;
  std::vector<double> numbers;        // a number (one) or an array's; integers exactly up to 2^53
  std::vector<std::int64_t> integers; // the same as integers, for integer and boolean types
  std::vector<std::string> strings;   // a string (one) or an array's
};

struct GgufTensor {
  std::string name;
  std::vector<std::uint64_t> shape;  // innermost (a row's length) first, as ggml's ne
  GgmlType type = GgmlType::f32;
  std::uint64_t offset = 0;          // from the start of the data
  std::uint64_t elements = 0, bytes = 0;
  // Rows: every dimension past the first.
  std::uint64_t rows() const { return shape.empty() ? 0 : elements / shape[0]; }
};

class GgufFile {
 public:
  static GgufFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  bool has(std::string_view key) const { return metadata_.find(key) != metadata_.end(); }
  // The value of `key`, or an Error naming the key and the file.
  const GgufValue& value(std::string_view key) const;
  std::string string(std::string_view key) const;
  std::int64_t integer(std::string_view key) const;
  double number(std::string_view key) const;
  bool boolean(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  bool has_tensor(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;
  // The tensor's bytes, where they lie in the mapped file.
  std::span<const std::byte> bytes(const GgufTensor& t) const;
  // Rows [first, first + count) of the tensor as float32 (a row: shape[0]
  // values), into out; every type above.
  void read_rows(const GgufTensor& t, std::uint64_t first, std::uint64_t count, float* out) const;
  std::vector<float> values(const GgufTensor& t) const;
  // Gives back the pages of the tensor's bytes [from, to) (whole pages;
  // read from the file again if read again).
  void release(const GgufTensor& t, std::uint64_t from = 0, std::uint64_t to = ~std::uint64_t(0)) const;

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> map_;
  std::filesystem::path path_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32, data_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensor> tensors_;
};

// A GGUF file being written (version 3, alignment 32): metadata in the
// order given, then tensors, each encoded in its type from float32 values
// (ggml's reference quantisation for Q8_0 and Q4_0: a block's scale from
// its largest magnitude, values rounded to it), written whole by write()
// (the file swapped in atomically; an existing one is replaced).
class GgufWriter {
 public:
  void add(const std::string& key, const std::string& value);
  void add(const std::string& key, std::uint32_t value);
  void add(const std::string& key, float value);
  void add(const std::string& key, bool value);
  void add(const std::string& key, const std::vector<std::string>& values);
  void add(const std::string& key, const std::vector<float>& values);
  void add(const std::string& key, const std::vector<std::int32_t>& values);
  // shape innermost first (ggml's ne); values row after row.
  void add_tensor(const std::string& name, std::vector<std::uint64_t> shape, GgmlType type, std::span<const float> values);
  void write(const std::filesystem::path& path) const;

 private:
  std::string meta_, infos_, data_;
  std::uint64_t keys_ = 0, tensors_ = 0;
};

// `count` float32 values encoded as type t (F32, F16, BF16, Q8_0, Q4_0).
std::vector<std::byte> ggml_quantize(GgmlType t, std::span<const float> values);

// The elements of `count` values of type t stored in `bytes` (a whole
// number of its blocks) as float32: the format's own decoding, for each
// type GgufFile reads (GgufFile::read_rows calls it).
void ggml_dequantize(GgmlType t, const std::byte* bytes, std::uint64_t count, float* out);
// Bytes that `count` values of type t take (a multiple of its block).
std::uint64_t ggml_bytes(GgmlType t, std::uint64_t count);

}  // namespace xfmr
