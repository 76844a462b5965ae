// safetensors.hpp: read and write the safetensors format.
//
// Layout: an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON mapping
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (byte
// offsets into the data that follows), plus an optional "__metadata__" object
// of string values; then the data, tensors packed back to back.
//
// Reading validates everything the reference loader does, and a little more:
// header size limit (100 MB), header inside the file and starting with '{',
// known dtypes, non-negative integer shapes, overflow-checked element and byte
// counts, end - begin == product(shape) * dtype size, offsets contiguous from
// 0 without gaps or overlap, the data ending exactly where the last tensor
// ends, and no duplicate keys anywhere in the header. Each failure is an
// xfmr::Error naming the file, the tensor and the value that broke the rule.
//
// Writing pads the header with spaces to a multiple of 8 bytes and is atomic:
// the bytes go to a temporary file beside the target, are fsync'ed and then
// renamed over it, so a failed write never damages an existing file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

const char* dtype_name(DType t);
std::size_t dtype_size(DType t);

struct TensorInfo {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::size_t begin = 0, end = 0;  // byte offsets into the data section
  std::size_t elements() const;
};

namespace detail {
struct FileBytes;  // a file's bytes, held in memory or mapped
}

// A file's tensors. load() maps the file (read-only, private): a tensor's
// bytes come into memory when read, and release() gives them back, so that
// a model converted tensor by tensor from a file never holds the whole of
// it. Copies share the bytes. A mapped file must not be truncated while a
// SafeTensors reads it (xfmr replaces files by renaming new ones over them,
// which leaves a mapped one whole).
class SafeTensors {
 public:
  // Parses and validates a whole file held in memory; `source` names it in errors.
  static SafeTensors parse(std::vector<std::byte> bytes, std::string source = "<memory>");
  // Maps the file at `path` and parses it as parse() does.
  static SafeTensors load(const std::filesystem::path& path);
  // The __metadata__ of the file at `path`, read from its header alone (the
  // header checked as parse() checks it, the tensors not read).
  static std::map<std::string, std::string> read_metadata(const std::filesystem::path& path);

  // Tensor names in data order.
  const std::vector<std::string>& names() const { return order_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  std::span<const std::byte> bytes(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The metadata value of `key`, or xfmr::Error naming the file and the key.
  const std::string& metadata(const std::string& key) const {
    const auto it = metadata_.find(key);
    require(it != metadata_.end(), source_, ": no '", key, "' in the metadata");
    return it->second;
  }

  // Elements of a floating tensor (F64, F32, F16, BF16) converted to T.
  template <class T>
    requires std::is_floating_point_v<T>
  std::vector<T> values(const std::string& name) const;
  // Elements of an integer or bool tensor, widened to int64.
  std::vector<std::int64_t> integers(const std::string& name) const;

  // Copies a floating tensor into `out` after checking its shape equals `shape`.
  template <class T>
    requires std::is_floating_point_v<T>
  void copy_to(const std::string& name, const std::vector<std::int64_t>& shape, std::span<T> out) const;

  const std::string& source() const { return source_; }
  // Gives back the memory of the pages of tensor `name` that reading has
  // brought in (a loaded file's; nothing for parsed bytes). Reading the
  // tensor again reads them from the file again.
  void release(const std::string& name) const;
  // The same for bytes [from, to) of the tensor's.
  void release(const std::string& name, std::size_t from, std::size_t to) const;

 private:
  static SafeTensors parse_bytes(std::shared_ptr<const detail::FileBytes> file, std::string source);
  std::string source_;
  std::shared_ptr<const detail::FileBytes> file_;
  std::size_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> metadata_;
};

class SafeTensorsWriter {
 public:
  // Adds a tensor (its bytes are copied). Names must be unique and must not
  // be "__metadata__".
  void add(const std::string& name, DType dtype, std::vector<std::int64_t> shape, const void* data);
  template <class T>
  void add(const std::string& name, std::vector<std::int64_t> shape, std::span<const T> data);
  // Adds a tensor whose bytes (its dtype's size times its elements) fill
  // writes when the file is serialised or written: a file made tensor by
  // tensor (a quantised model's) holds one tensor in memory at a time.
  void add_filled(const std::string& name, DType dtype, std::vector<std::int64_t> shape,
                  std::function<void(std::span<std::byte>)> fill);
  void set_metadata(const std::string& key, const std::string& value);

  std::vector<std::byte> serialize() const;
  void write(const std::filesystem::path& path) const;
  // serialize()'s bytes written to `fd` a tensor at a time; returns 0 or the
  // errno of a failed write.
  int write_to(int fd) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> data;
    std::size_t bytes = 0;
    std::function<void(std::span<std::byte>)> fill;  // add_filled's (data empty)
  };
  std::size_t checked_bytes(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape) const;
  std::string header() const;  // with its length before it and the padding after
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Atomically replaces `path` with `bytes` (temporary file, fsync, rename); a
// replaced file keeps its permissions (a new one gets 0644). An existing
// device (/dev/null) or pipe is written through, never replaced by a
// regular file (a FIFO no process reads within kFifoWaitSeconds is an
// error); a directory is an
// error. Every failure throws naming `path`
// and the system's reason ("No space left on device"). Hard links to a
// replaced file keep the old contents (the rename gives `path` a new inode).
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);

// A file a checkpoint or an export carries beside its own: `bytes` under
// `name`, a tokenizer file's name (a language model's tokenizer, as it was
// read: ModelTokenizer::attached_files(), io/model_tokenizer.hpp), held
// in memory so that a save never depends on the source file still being there.
struct AttachedFile {
  std::string name;
  std::vector<std::byte> bytes;
};
// The canonical names of a tokenizer's files, where xfmr-lm and Hugging Face
// look for them: tokenizer.json, GPT-2's vocab.json + merges.txt, llama2.c's
// tokenizer.bin.
bool is_tokenizer_file_name(const std::string& name);

// A Hugging Face model directory: dir/model.safetensors (`tensors`, with
// metadata "format": "pt"), dir/config.json (`config_json`) and the
// `attached` files (the tokenizer), written whole into a new directory
// beside `dir` and swapped in as a checkpoint is (io/checkpoint.hpp), so
// nothing of an earlier export is left beside the new one, and a crash
// leaves one or the other whole. An existing `dir` that is not empty is an
// error unless `overwrite`, and then it may hold only what an export writes
// (any other file would be deleted: the error names it).
void write_hf_directory(const std::filesystem::path& dir, const SafeTensorsWriter& tensors,
                        const std::string& config_json, bool overwrite, std::span<const AttachedFile> attached = {});

namespace detail {
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, double>) return DType::F64;
  else if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DType::I64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DType::I32;
  else if constexpr (std::is_same_v<T, std::int16_t>) return DType::I16;
  else if constexpr (std::is_same_v<T, std::int8_t>) return DType::I8;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DType::U8;
  else static_assert(sizeof(T) == 0, "no safetensors dtype for this element type");
}
}  // namespace detail

template <class T>
void SafeTensorsWriter::add(const std::string& name, std::vector<std::int64_t> shape, std::span<const T> data) {
  std::size_t n = 1;
  for (auto d : shape) {
    require(d >= 0, "tensor '", name, "' has a negative dimension in shape ", shape_string(shape));
    n *= static_cast<std::size_t>(d);
  }
  require(n == data.size(), "tensor '", name, "' has ", data.size(), " elements but shape ", shape_string(shape),
          " holds ", n);
  add(name, detail::dtype_of<T>(), std::move(shape), data.data());
}

}  // namespace xfmr
