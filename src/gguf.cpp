// gguf.cpp: io/gguf.hpp's reader: the file mapped, every count and offset
// checked against the bytes there are before it is used, and the types'
// decoding into float32.
#include "xfmr/io/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include "xfmr/backend/bf16.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/half.hpp"
#include "xfmr/io/safetensors.hpp"

namespace xfmr {

struct GgufFile::Mapping {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  ~Mapping() {
    if (data) ::munmap(const_cast<std::byte*>(data), size);
  }
};

namespace {

struct TypeTraits {
  std::uint64_t block, bytes;  // values a block, bytes a block
  const char* name;
};

// The block sizes of the types read; block 0 for the others.
TypeTraits traits(GgmlType t) {
  switch (t) {
    case GgmlType::f32: return {1, 4, "F32"};
    case GgmlType::f16: return {1, 2, "F16"};
    case GgmlType::bf16: return {1, 2, "BF16"};
    case GgmlType::q8_0: return {32, 34, "Q8_0"};
    case GgmlType::q4_0: return {32, 18, "Q4_0"};
    case GgmlType::q4_k: return {256, 144, "Q4_K"};
    case GgmlType::q6_k: return {256, 210, "Q6_K"};
    case GgmlType::q4_1: return {0, 0, "Q4_1"};
    case GgmlType::q5_0: return {0, 0, "Q5_0"};
    case GgmlType::q5_1: return {0, 0, "Q5_1"};
    case GgmlType::q8_1: return {0, 0, "Q8_1"};
    case GgmlType::q2_k: return {0, 0, "Q2_K"};
    case GgmlType::q3_k: return {0, 0, "Q3_K"};
    case GgmlType::q5_k: return {0, 0, "Q5_K"};
    case GgmlType::q8_k: return {0, 0, "Q8_K"};
  }
  return {0, 0, nullptr};
}

std::uint16_t u16_at(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Reads the header's fields in order, each checked to lie in the file.
class Cursor {
 public:
  Cursor(const std::byte* data, std::size_t size, std::string file) : p_(data), end_(data + size), file_(std::move(file)) {}

  template <class T>
  T scalar(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const std::uint64_t n = scalar<std::uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_), std::size_t(n));
    p_ += n;
    return s;
  }
  // A count of items at least `each` bytes long that the rest of the file could hold.
  std::uint64_t count(const char* what, std::uint64_t each) {
    const std::uint64_t n = scalar<std::uint64_t>(what);
    require(n <= left() / std::max<std::uint64_t>(each, 1), file_, ": ", what, " ", n, " is more than the ", left(),
            " bytes left could hold");
    return n;
  }
  std::uint64_t position(const std::byte* start) const { return std::uint64_t(p_ - start); }
  const std::string& file() const { return file_; }

 private:
  std::uint64_t left() const { return std::uint64_t(end_ - p_); }
  void need(std::uint64_t n, const char* what) const {
    require(n <= left(), file_, ": the file ends inside ", what, " (", n, " bytes wanted, ", left(), " left)");
  }

  const std::byte* p_;
  const std::byte* end_;
  std::string file_;
};

std::uint64_t scalar_size(GgufValue::Type t) {
  using T = GgufValue::Type;
  switch (t) {
    case T::u8: case T::i8: case T::boolean: return 1;
    case T::u16: case T::i16: return 2;
    case T::u32: case T::i32: case T::f32: return 4;
    case T::u64: case T::i64: case T::f64: return 8;
    case T::string: return 8;  // at least its length
    case T::array: return 12;
  }
  return 0;
}

// One scalar or string of type t into v (appended).
void read_item(Cursor& c, GgufValue::Type t, GgufValue& v, const std::string& key) {
  using T = GgufValue::Type;
  auto integer = [&](std::int64_t x) {
    v.integers.push_back(x);
    v.numbers.push_back(double(x));
  };
  switch (t) {
    case T::u8: return integer(c.scalar<std::uint8_t>("a value"));
    case T::i8: return integer(c.scalar<std::int8_t>("a value"));
    case T::u16: return integer(c.scalar<std::uint16_t>("a value"));
    case T::i16: return integer(c.scalar<std::int16_t>("a value"));
    case T::u32: return integer(c.scalar<std::uint32_t>("a value"));
    case T::i32: return integer(c.scalar<std::int32_t>("a value"));
    case T::boolean: return integer(c.scalar<std::uint8_t>("a value") != 0);
    case T::u64: {
      const std::uint64_t x = c.scalar<std::uint64_t>("a value");
      require(x <= std::uint64_t(std::numeric_limits<std::int64_t>::max()), c.file(), ": '", key, "' holds ", x,
              ", past what xfmr reads");
      return integer(std::int64_t(x));
    }
    case T::i64: return integer(c.scalar<std::int64_t>("a value"));
    case T::f32: return v.numbers.push_back(c.scalar<float>("a value"));
    case T::f64: return v.numbers.push_back(c.scalar<double>("a value"));
    case T::string: return v.strings.push_back(c.string("a string"));
    case T::array: break;
  }
  detail::fail(c.file(), ": '", key, "' has value type ", std::uint32_t(t), ", which GGUF does not define");
}

}  // namespace

std::string ggml_type_name(GgmlType t) {
  const char* n = traits(t).name;
  return n ? n : "type " + std::to_string(std::uint32_t(t));
}

GgmlType ggml_type_named(std::string_view name, std::string_view what) {
  if (name == "f32") return GgmlType::f32;
  if (name == "f16") return GgmlType::f16;
  if (name == "bf16") return GgmlType::bf16;
  if (name == "q8_0") return GgmlType::q8_0;
  if (name == "q4_0") return GgmlType::q4_0;
  detail::fail("unknown ", what, " '", name, "' (f32, f16, bf16, q8_0 or q4_0)");
}

std::uint64_t ggml_bytes(GgmlType t, std::uint64_t count) {
  const TypeTraits k = traits(t);
  require(k.block > 0, "GGUF tensors of type ", ggml_type_name(t), " are not read by xfmr (F32, F16, BF16, Q8_0, Q4_0, "
                       "Q4_K and Q6_K are)");
  require(count % k.block == 0, ggml_type_name(t), " holds values in blocks of ", k.block, "; ", count,
          " values are not whole blocks");
  return count / k.block * k.bytes;
}

void ggml_dequantize(GgmlType t, const std::byte* p, std::uint64_t count, float* y) {
  (void)ggml_bytes(t, count);  // a type read, whole blocks
  switch (t) {
    case GgmlType::f32:
      std::memcpy(y, p, std::size_t(count) * 4);
      return;
    case GgmlType::f16:
      for (std::uint64_t i = 0; i < count; ++i) y[i] = detail::half_to_float(u16_at(p + 2 * i));
      return;
    case GgmlType::bf16:
      for (std::uint64_t i = 0; i < count; ++i) y[i] = bf16::to_float(u16_at(p + 2 * i));
      return;
    case GgmlType::q8_0:
      for (std::uint64_t b = 0; b < count / 32; ++b, p += 34, y += 32) {
        const float d = detail::half_to_float(u16_at(p));
        for (int j = 0; j < 32; ++j) y[j] = d * float(std::int8_t(p[2 + j]));
      }
      return;
    case GgmlType::q4_0:
      for (std::uint64_t b = 0; b < count / 32; ++b, p += 18, y += 32) {
        const float d = detail::half_to_float(u16_at(p));
        for (int j = 0; j < 16; ++j) {
          const unsigned q = unsigned(p[2 + j]);
          y[j] = d * float(int(q & 0x0f) - 8);
          y[j + 16] = d * float(int(q >> 4) - 8);
        }
      }
      return;
    case GgmlType::q4_k:
      // Eight sub-blocks of 32, each with a 6-bit scale and minimum packed
      // in 12 bytes: pairs 0-3 in the low 6 bits of bytes 0-3 (scales) and
      // 4-7 (minimums), pairs 4-7 from bytes 8-11's nibbles and the top 2
      // bits of bytes 0-7. Values: 64 at a time from 32 bytes, low nibbles
      // the first 32 (sub-block 2i), high nibbles the next (2i + 1).
      for (std::uint64_t b = 0; b < count / 256; ++b, p += 144) {
        const float d = detail::half_to_float(u16_at(p)), dmin = detail::half_to_float(u16_at(p + 2));
        const auto* s = reinterpret_cast<const std::uint8_t*>(p + 4);
        const auto* q = reinterpret_cast<const std::uint8_t*>(p + 16);
        auto scale_min = [&](int j, int& sc, int& m) {
          if (j < 4) {
            sc = s[j] & 63, m = s[j + 4] & 63;
          } else {
            sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
          }
        };
        for (int i = 0; i < 4; ++i, q += 32, y += 64) {
          int sc1, m1, sc2, m2;
          scale_min(2 * i, sc1, m1);
          scale_min(2 * i + 1, sc2, m2);
          for (int l = 0; l < 32; ++l) {
            y[l] = d * float(sc1) * float(q[l] & 0x0f) - dmin * float(m1);
            y[l + 32] = d * float(sc2) * float(q[l] >> 4) - dmin * float(m2);
          }
        }
      }
      return;
    case GgmlType::q6_k:
      // Two halves of 128: 64 bytes of low nibbles, 32 of high 2-bit pairs,
      // 8 signed scales (one per 16 values); a value is its 6 bits minus 32.
      for (std::uint64_t b = 0; b < count / 256; ++b, p += 210) {
        const auto* ql = reinterpret_cast<const std::uint8_t*>(p);
        const auto* qh = reinterpret_cast<const std::uint8_t*>(p + 128);
        const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192);
        const float d = detail::half_to_float(u16_at(p + 208));
        for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128)
          for (int l = 0; l < 32; ++l) {
            const int g = l / 16;
            const int q1 = int((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = int((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * float(sc[g]) * float(q1);
            y[l + 32] = d * float(sc[g + 2]) * float(q2);
            y[l + 64] = d * float(sc[g + 4]) * float(q3);
            y[l + 96] = d * float(sc[g + 6]) * float(q4);
          }
      }
      return;
    default: break;
  }
}

GgufFile GgufFile::open(const std::filesystem::path& path) {
  const std::string file = path.string();
  std::error_code ec;
  require(std::filesystem::is_regular_file(path, ec), file, ": no such file (a GGUF model file)");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  require(fd >= 0, file, ": cannot open for reading");
  struct stat info {};
  const bool sized = ::fstat(fd, &info) == 0;
  auto map = std::make_shared<Mapping>();
  if (sized && info.st_size > 0) {
    void* m = ::mmap(nullptr, std::size_t(info.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) map->data = static_cast<const std::byte*>(m), map->size = std::size_t(info.st_size);
  }
  ::close(fd);
  require(sized, file, ": cannot determine its size");
  require(map->data, file, ": empty, or cannot be mapped into memory");

  GgufFile g;
  g.path_ = path;
  Cursor c(map->data, map->size, file);
  const std::uint32_t magic = c.scalar<std::uint32_t>("the magic");
  require(magic == 0x46554747u, file, ": not a GGUF file (it does not start with 'GGUF')");
  g.version_ = c.scalar<std::uint32_t>("the version");
  require(g.version_ == 2 || g.version_ == 3, file, ": GGUF version ", g.version_, " (xfmr reads 2 and 3)");
  const std::uint64_t n_tensors = c.scalar<std::uint64_t>("the tensor count");
  const std::uint64_t n_keys = c.count("the key count", 8 + 4);
  for (std::uint64_t k = 0; k < n_keys; ++k) {
    std::string key = c.string("a key");
    GgufValue v;
    v.type = GgufValue::Type(c.scalar<std::uint32_t>("a value type"));
    if (v.type == GgufValue::Type::array) {
      v.array = true;
      v.type = GgufValue::Type(c.scalar<std::uint32_t>("an array's type"));
      require(v.type != GgufValue::Type::array && scalar_size(v.type) > 0, file, ": '", key,
              "' is an array of type ", std::uint32_t(v.type), ", which xfmr does not read");
      const std::uint64_t n = c.count("an array's length", scalar_size(v.type));
      for (std::uint64_t i = 0; i < n; ++i) read_item(c, v.type, v, key);
    } else {
      read_item(c, v.type, v, key);
    }
    require(g.metadata_.emplace(key, std::move(v)).second, file, ": the key '", key, "' appears twice");
  }
  if (g.has("general.alignment")) {
    const std::int64_t a = g.integer("general.alignment");
    require(a > 0 && (a & (a - 1)) == 0 && a <= (1 << 20), file, ": general.alignment ", a,
            " is not a power of two up to 2^20");
    g.alignment_ = std::uint64_t(a);
  }
  require(n_tensors <= (map->size - c.position(map->data)) / (8 + 4 + 4 + 8), file, ": the tensor count ", n_tensors,
          " is more than the file could describe");
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.string("a tensor's name");
    const std::uint32_t dims = c.scalar<std::uint32_t>("a tensor's dimension count");
    require(dims >= 1 && dims <= 4, file, ": tensor '", t.name, "' has ", dims, " dimensions (1 to 4)");
    t.elements = 1;
    for (std::uint32_t d = 0; d < dims; ++d) {
      const std::uint64_t n = c.scalar<std::uint64_t>("a tensor's dimension");
      require(n >= 1 && n <= (std::uint64_t(1) << 40) && t.elements <= (std::uint64_t(1) << 40) / n, file, ": tensor '",
              t.name, "' has a dimension ", n, " past what a file holds");
      t.shape.push_back(n);
      t.elements *= n;
    }
    t.type = GgmlType(c.scalar<std::uint32_t>("a tensor's type"));
    t.offset = c.scalar<std::uint64_t>("a tensor's offset");
    require(traits(t.type).block > 0, file, ": tensor '", t.name, "' is ", ggml_type_name(t.type),
            ", a type xfmr does not read (F32, F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K)");
    require(t.shape[0] % traits(t.type).block == 0, file, ": tensor '", t.name, "' rows of ", t.shape[0],
            " values are not whole ", ggml_type_name(t.type), " blocks of ", traits(t.type).block);
    t.bytes = ggml_bytes(t.type, t.elements);
    g.tensors_.push_back(std::move(t));
  }
  g.data_ = (c.position(map->data) + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  const std::uint64_t data_bytes = map->size >= g.data_ ? map->size - g.data_ : 0;
  for (const GgufTensor& t : g.tensors_) {
    require(t.offset % g.alignment_ == 0, file, ": tensor '", t.name, "' starts at ", t.offset,
            ", not a multiple of the alignment ", g.alignment_);
    require(t.offset <= data_bytes && t.bytes <= data_bytes - t.offset, file, ": tensor '", t.name, "' (", t.bytes,
            " bytes at ", t.offset, ") lies past the end of the data (", data_bytes, " bytes)");
  }
  for (std::size_t i = 0; i < g.tensors_.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      require(g.tensors_[i].name != g.tensors_[j].name, file, ": tensor '", g.tensors_[i].name, "' appears twice");
  g.map_ = std::move(map);
  return g;
}

const GgufValue& GgufFile::value(std::string_view key) const {
  const auto it = metadata_.find(key);
  require(it != metadata_.end(), path_.string(), ": no metadata key '", key, "'");
  return it->second;
}

std::string GgufFile::string(std::string_view key) const {
  const GgufValue& v = value(key);
  require(!v.array && v.type == GgufValue::Type::string, path_.string(), ": '", key, "' is not a string");
  return v.strings.front();
}

std::int64_t GgufFile::integer(std::string_view key) const {
  const GgufValue& v = value(key);
  require(!v.array && !v.integers.empty(), path_.string(), ": '", key, "' is not an integer");
  return v.integers.front();
}

double GgufFile::number(std::string_view key) const {
  const GgufValue& v = value(key);
  require(!v.array && !v.numbers.empty(), path_.string(), ": '", key, "' is not a number");
  return v.numbers.front();
}

bool GgufFile::boolean(std::string_view key) const {
  const GgufValue& v = value(key);
  require(!v.array && v.type == GgufValue::Type::boolean, path_.string(), ": '", key, "' is not a boolean");
  return v.integers.front() != 0;
}

bool GgufFile::has_tensor(std::string_view name) const {
  return std::any_of(tensors_.begin(), tensors_.end(), [&](const GgufTensor& t) { return t.name == name; });
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  for (const GgufTensor& t : tensors_)
    if (t.name == name) return t;
  detail::fail(path_.string(), ": no tensor '", name, "'");
}

std::span<const std::byte> GgufFile::bytes(const GgufTensor& t) const {
  return {map_->data + data_ + t.offset, std::size_t(t.bytes)};
}

void GgufFile::read_rows(const GgufTensor& t, std::uint64_t first, std::uint64_t count, float* out) const {
  require(first <= t.rows() && count <= t.rows() - first, path_.string(), ": rows ", first, "..", first + count,
          " of tensor '", t.name, "', which has ", t.rows());
  const std::uint64_t row_bytes = ggml_bytes(t.type, t.shape[0]);
  ggml_dequantize(t.type, bytes(t).data() + first * row_bytes, count * t.shape[0], out);
}

bool is_gguf_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
}

void GgufFile::release(const GgufTensor& t, std::uint64_t from, std::uint64_t to) const {
  to = std::min(to, t.bytes);
  if (from >= to) return;
  static const std::uintptr_t page = std::uintptr_t(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(bytes(t).data()) + from, end = begin + (to - from);
  const std::uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;  // whole pages only
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

std::vector<float> GgufFile::values(const GgufTensor& t) const {
  std::vector<float> out(std::size_t(t.elements));
  read_rows(t, 0, t.rows(), out.data());
  return out;
}

namespace {

void put_string(std::string& out, std::string_view s) {
  const std::uint64_t n = s.size();
  out.append(reinterpret_cast<const char*>(&n), 8).append(s);
}
template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

std::vector<std::byte> ggml_quantize(GgmlType t, std::span<const float> x) {
  std::vector<std::byte> out(std::size_t(ggml_bytes(t, x.size())));
  std::byte* p = out.data();
  auto put16 = [](std::byte* at, std::uint16_t v) { std::memcpy(at, &v, 2); };
  switch (t) {
    case GgmlType::f32: std::memcpy(p, x.data(), x.size() * 4); break;
    case GgmlType::f16:
      for (std::size_t i = 0; i < x.size(); ++i) put16(p + 2 * i, detail::float_to_half(x[i]));
      break;
    case GgmlType::bf16:
      for (std::size_t i = 0; i < x.size(); ++i) put16(p + 2 * i, bf16::from_float(x[i]));
      break;
    case GgmlType::q8_0:
      for (std::size_t b = 0; b < x.size() / 32; ++b, p += 34) {
        const float* v = x.data() + 32 * b;
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(v[j]));
        const float d = amax / 127, id = d != 0 ? 1 / d : 0;
        put16(p, detail::float_to_half(d));
        for (int j = 0; j < 32; ++j) p[2 + j] = std::byte(std::int8_t(std::lround(v[j] * id)));
      }
      break;
    case GgmlType::q4_0:
      for (std::size_t b = 0; b < x.size() / 32; ++b, p += 18) {
        const float* v = x.data() + 32 * b;
        float amax = 0, max = 0;  // the value of largest magnitude, with its sign
        for (int j = 0; j < 32; ++j)
          if (std::abs(v[j]) > amax) amax = std::abs(v[j]), max = v[j];
        const float d = max / -8, id = d != 0 ? 1 / d : 0;
        put16(p, detail::float_to_half(d));
        for (int j = 0; j < 16; ++j) {
          const int lo = std::min(15, int(std::int8_t(v[j] * id + 8.5f)));
          const int hi = std::min(15, int(std::int8_t(v[j + 16] * id + 8.5f)));
          p[2 + j] = std::byte(std::uint8_t(lo | (hi << 4)));
        }
      }
      break;
    default:
      detail::fail("GGUF tensors are written as F32, F16, BF16, Q8_0 or Q4_0 (not ", ggml_type_name(t), ")");
  }
  return out;
}

void GgufWriter::add(const std::string& key, const std::string& value) {
  put_string(meta_, key), put(meta_, std::uint32_t(GgufValue::Type::string)), put_string(meta_, value), ++keys_;
}
void GgufWriter::add(const std::string& key, std::uint32_t value) {
  put_string(meta_, key), put(meta_, std::uint32_t(GgufValue::Type::u32)), put(meta_, value), ++keys_;
}
void GgufWriter::add(const std::string& key, float value) {
  put_string(meta_, key), put(meta_, std::uint32_t(GgufValue::Type::f32)), put(meta_, value), ++keys_;
}
void GgufWriter::add(const std::string& key, bool value) {
  put_string(meta_, key), put(meta_, std::uint32_t(GgufValue::Type::boolean)), put(meta_, std::uint8_t(value)), ++keys_;
}
void GgufWriter::add(const std::string& key, const std::vector<std::string>& values) {
  put_string(meta_, key), put(meta_, std::uint32_t(GgufValue::Type::array)), put(meta_, std::uint32_t(GgufValue::Type::string));
  put(meta_, std::uint64_t(values.size()));
  for (const std::string& v : values) put_string(meta_, v);
  ++keys_;
}
void GgufWriter::add(const std::string& key, const std::vector<float>& values) {
  put_string(meta_, key), put(meta_, std::uint32_t(GgufValue::Type::array)), put(meta_, std::uint32_t(GgufValue::Type::f32));
  put(meta_, std::uint64_t(values.size()));
  for (float v : values) put(meta_, v);
  ++keys_;
}
void GgufWriter::add(const std::string& key, const std::vector<std::int32_t>& values) {
  put_string(meta_, key), put(meta_, std::uint32_t(GgufValue::Type::array)), put(meta_, std::uint32_t(GgufValue::Type::i32));
  put(meta_, std::uint64_t(values.size()));
  for (std::int32_t v : values) put(meta_, v);
  ++keys_;
}

void GgufWriter::add_tensor(const std::string& name, std::vector<std::uint64_t> shape, GgmlType type,
                            std::span<const float> values) {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) n *= d;
  require(n == values.size(), "GGUF tensor '", name, "': ", values.size(), " values for ", n, " elements");
  const std::vector<std::byte> bytes = ggml_quantize(type, values);
  put_string(infos_, name), put(infos_, std::uint32_t(shape.size()));
  for (std::uint64_t d : shape) put(infos_, d);
  put(infos_, std::uint32_t(type)), put(infos_, std::uint64_t(data_.size()));
  data_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  data_.resize((data_.size() + 31) / 32 * 32, '\0');
  ++tensors_;
}

void GgufWriter::write(const std::filesystem::path& path) const {
  std::string out = "GGUF";
  put(out, std::uint32_t(3)), put(out, tensors_), put(out, keys_);
  out += meta_;
  out += infos_;
  out.resize((out.size() + 31) / 32 * 32, '\0');
  out += data_;
  write_file_atomic(path, std::span(reinterpret_cast<const std::byte*>(out.data()), out.size()));
}

}  // namespace xfmr
