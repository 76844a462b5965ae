// weight_sources.cpp: matrices read from safetensors files as they are
// needed (io/weight_sources.hpp), and the address space a deferred tensor
// reserves (core/tensor.hpp).
#include "xfmr/io/weight_sources.hpp"

#include <sys/mman.h>

#include <bit>
#include <exception>
#include <cmath>
#include <cstring>
#include <limits>
#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "xfmr/core/error.hpp"
#include "xfmr/core/half.hpp"
#include "xfmr/core/q4.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/backend/cpu/copy_source.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr {

namespace detail {

std::shared_ptr<void> reserve_address_space(std::size_t bytes) {
  const std::size_t n = bytes ? bytes : 1;
  void* p = system_call(
      [&] {
        void* m = ::mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        return m == MAP_FAILED ? nullptr : m;
      },
      "reserving ", n, " bytes of address space for a deferred tensor");
  return std::shared_ptr<void>(p, [n](void* q) { ::munmap(q, n); });
}

LargeBuffer allocate_large(std::size_t bytes) {
  const std::size_t n = bytes ? bytes : 1;
  void* p = system_call(
      [&] {
        void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return m == MAP_FAILED ? nullptr : m;
      },
      "allocating ", n, " bytes for a decoding copy of a weight matrix");
  return LargeBuffer(static_cast<std::byte*>(p), LargeBufferFree{n});
}
void LargeBufferFree::operator()(std::byte* p) const {
  if (p) ::munmap(p, bytes);
}

namespace {
struct LentSources {
  std::shared_mutex m;
  std::unordered_map<const void*, std::shared_ptr<const WeightSource>> by_key;
  std::atomic<int> count{0};
};
LentSources& lent_sources() {
  static LentSources s;
  return s;
}
}  // namespace

void register_lent(const void* key, std::shared_ptr<const WeightSource> source) {
  LentSources& l = lent_sources();
  const std::unique_lock lock(l.m);
  l.by_key[key] = std::move(source);
  l.count.store(int(l.by_key.size()), std::memory_order_relaxed);
}
void unregister_lent(const void* key) {
  LentSources& l = lent_sources();
  const std::unique_lock lock(l.m);
  l.by_key.erase(key);
  l.count.store(int(l.by_key.size()), std::memory_order_relaxed);
}
std::shared_ptr<const WeightSource> lent_source(const void* key) {
  LentSources& l = lent_sources();
  const std::shared_lock lock(l.m);
  const auto it = l.by_key.find(key);
  return it == l.by_key.end() ? nullptr : it->second;
}
bool any_lent() { return lent_sources().count.load(std::memory_order_relaxed) > 0; }

}  // namespace detail

namespace {

template <class T>
T stored_as(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Whether n floats are all finite: no exponent all ones (an integer test
// over the bits, which vectorises).
bool all_finite(const float* x, std::int64_t n) {
  std::uint32_t special = 0;
#ifdef _OPENMP
#pragma omp simd reduction(| : special)  // vectorised at -O2 too
#endif
  for (std::int64_t k = 0; k < n; ++k) {
    std::uint32_t bits;
    std::memcpy(&bits, x + k, sizeof bits);
    special |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return special == 0;
}

// The first of n bfloat16 values that is not finite, or -1: an integer
// test over the bits first, which vectorises.
std::int64_t first_bf16_not_finite(const std::byte* data, std::int64_t n) {
  std::uint32_t special = 0;
#ifdef _OPENMP
#pragma omp simd reduction(| : special)
#endif
  for (std::int64_t e = 0; e < n; ++e) special |= (stored_as<std::uint16_t>(data + 2 * e) & 0x7f80u) == 0x7f80u;
  if (special)
    for (std::int64_t e = 0; e < n; ++e)
      if ((stored_as<std::uint16_t>(data + 2 * e) & 0x7f80u) == 0x7f80u) return e;
  return -1;
}

// One piece: a tensor of the file and how its rows become the matrix's.
struct Piece {
  WeightPiece spec;
  TensorInfo info;
  std::int64_t rows = 0;          // the matrix's rows it gives
  std::int64_t first = 0;         // the matrix's row it starts at
  std::int64_t stored_cols = 0;   // the stored tensor's row width (its rows order) or row count (columns)
  std::vector<float> scales;      // I8: its scales
  bool q4 = false;                // U8 4-bit panels
};

class SafeTensorsWeights final : public WeightSource {
 public:
  SafeTensorsWeights(const SafeTensors& file, std::vector<WeightPiece> specs, std::int64_t rows, std::int64_t cols)
      : WeightSource(rows, cols), file_(file) {
    std::int64_t first = 0;
    for (auto& spec : specs) {
      Piece p;
      p.info = file.info(spec.tensor);
      const auto& shape = p.info.shape;
      const std::string where = file.source() + ": tensor '" + spec.tensor + "'";
      p.first = first;
      if (p.info.dtype == DType::U8) {
        p.q4 = true;
        require(specs.size() == 1 && spec.order == WeightPiece::rows, where, ": 4-bit panels are read whole");
        const std::vector<std::int64_t> expected{detail::q4_panels(rows), detail::q4_blocks(cols), detail::kQ4BlockBytes};
        require(shape == expected, where, " has shape ", shape_string(shape), "; the 4-bit panels of a ", rows, " x ",
                cols, " matrix are ", shape_string(expected));
        p.rows = rows;
      } else {
        require(p.info.dtype == DType::F32 || p.info.dtype == DType::F16 || p.info.dtype == DType::BF16 ||
                    p.info.dtype == DType::F64 || p.info.dtype == DType::I8,
                where, " has dtype ", dtype_name(p.info.dtype), " (F32, F16, BF16, F64 or int8 rows expected)");
        require(!shape.empty(), where, " is a scalar, not a matrix or a vector");
        std::int64_t inner = 1;
        for (std::size_t d = 1; d < shape.size(); ++d) inner *= shape[d];
        if (spec.order == WeightPiece::columns) {
          require(shape.size() == 2 && shape[0] == cols, where, " has shape ", shape_string(shape),
                  "; read by columns it needs ", cols, " rows");
          p.rows = shape[1];
          p.stored_cols = shape[1];
        } else {
          require(inner == cols, where, " has shape ", shape_string(shape), "; its rows must hold ", cols, " values");
          p.rows = shape[0];
          p.stored_cols = inner;
        }
        if (spec.order == WeightPiece::rotary_pairs)
          require(spec.head > 0 && spec.head % 2 == 0 && p.rows % spec.head == 0, where, ": ", p.rows,
                  " rows are not heads of ", spec.head, " rotary pairs");
        if (p.info.dtype == DType::I8) {
          require(spec.order == WeightPiece::rows && shape.size() == 2, where,
                  ": int8 rows are read as a matrix's rows");
          const std::string scale_name = spec.tensor + kScaleSuffix;
          require(file.contains(scale_name), where, " is int8 but has no scales '", scale_name, "'");
          const TensorInfo& si = file.info(scale_name);
          require(si.dtype == DType::F32 && si.shape == std::vector<std::int64_t>{shape[0]}, file.source(),
                  ": scales '", scale_name, "' are ", dtype_name(si.dtype), " ", shape_string(si.shape),
                  "; expected F32 [", shape[0], "]");
          p.scales = file.values<float>(scale_name);
          // What a scale computes must be finite too: scale x 127, the row's
          // largest weight (a scale of 3e38 is finite; its weights are not).
          for (std::size_t r = 0; r < p.scales.size(); ++r)
            require(std::isfinite(p.scales[r] * 127.0f) && p.scales[r] >= 0.0f, file.source(), ": scales '",
                    scale_name, "' hold ", p.scales[r], " at row ", r,
                    "; a scale must not be negative, and scale x 127 (the row's largest weight) ",
                    "must be finite (a scale below ", std::numeric_limits<float>::max() / 127.0f, ")");
        }
      }
      p.spec = std::move(spec);
      first += p.rows;
      pieces_.push_back(std::move(p));
    }
    require(first == rows, file.source(), ": ", name(), " give ", first, " rows, the model's matrix has ", rows);
  }

  void read_rows(std::int64_t r0, std::int64_t r1, float* out) const override {
    for (const Piece& p : pieces_) {
      const std::int64_t a = std::max(r0, p.first), b = std::min(r1, p.first + p.rows);
      if (a >= b) continue;
      read_piece(p, a - p.first, b - p.first, out + (a - r0) * cols());
    }
  }

  StoredWeights stored(StoredLayout layout) const override {
    if (pieces_.size() != 1 || pieces_[0].spec.order != WeightPiece::rows) return {};
    const Piece& p = pieces_[0];
    const std::byte* data = file_.bytes(p.spec.tensor).data();
    const StoredLayout mine = p.q4                          ? StoredLayout::q4_panels
                              : p.info.dtype == DType::BF16 ? StoredLayout::bf16_rows
                              : p.info.dtype == DType::I8   ? StoredLayout::int8_rows
                                                            : StoredLayout::none;
    if (mine != layout || mine == StoredLayout::none) return {};
    std::call_once(checked_, [&] {
      if (mine == StoredLayout::bf16_rows) check_finite_bf16(p, data);
      else if (mine == StoredLayout::int8_rows) check_int8(p, data);
      else check_q4_scales(p, data);
    });
    return {mine, data, mine == StoredLayout::int8_rows ? p.scales : std::vector<float>{}};
  }

  void release() const override {
    for (const Piece& p : pieces_) file_.release(p.spec.tensor);
  }
  // Only a piece read as its rows, whose rows' bytes lie apart from the
  // others' (a reordered or transposed piece's are given back whole).
  void release_rows(std::int64_t r0, std::int64_t r1) const override {
    for (const Piece& p : pieces_) {
      const std::int64_t a = std::max(r0, p.first), b = std::min(r1, p.first + p.rows);
      if (a >= b || p.q4 || p.spec.order != WeightPiece::rows) continue;
      const std::size_t row_bytes = std::size_t(cols()) * dtype_size(p.info.dtype);
      file_.release(p.spec.tensor, std::size_t(a - p.first) * row_bytes, std::size_t(b - p.first) * row_bytes);
    }
  }

  std::string name() const override {
    std::string n = file_.source() + ": tensor" + (pieces_.size() > 1 ? "s" : "");
    for (std::size_t i = 0; i < pieces_.size(); ++i) n += (i ? ", '" : " '") + pieces_[i].spec.tensor + "'";
    return n;
  }

 private:
  [[noreturn]] void not_finite(const Piece& p, float v, std::int64_t element) const {
    detail::fail(file_.source(), ": tensor '", p.spec.tensor, "' holds ", v, " at element ", element,
                 "; a checkpoint's values must be finite");
  }
  // The stored row of the piece's row r.
  static std::int64_t stored_row(const Piece& p, std::int64_t r) {
    if (p.spec.order != WeightPiece::rotary_pairs) return r;
    const std::int64_t head = p.spec.head, h = r / head, j = r % head;
    return h * head + (j % 2) * (head / 2) + j / 2;
  }
  // Element e of the stored tensor as float.
  static float element(const Piece& p, const std::byte* data, std::int64_t e) {
    switch (p.info.dtype) {
      case DType::F32: return stored_as<float>(data + 4 * e);
      case DType::F16: return detail::half_to_float(stored_as<std::uint16_t>(data + 2 * e));
      case DType::BF16: return std::bit_cast<float>(std::uint32_t(stored_as<std::uint16_t>(data + 2 * e)) << 16);
      case DType::F64: return float(stored_as<double>(data + 8 * e));
      default: return 0.0f;
    }
  }

  void read_piece(const Piece& p, std::int64_t a, std::int64_t b, float* out) const {
    const std::byte* data = file_.bytes(p.spec.tensor).data();
    const std::int64_t C = cols();
    if (p.q4) {
      for (std::int64_t r = a; r < b; ++r) detail::q4_dequantise_row(data, C, r, out + (r - a) * C);
      return;
    }
    if (p.spec.order == WeightPiece::columns) {  // stored (cols, rows): element (c, r)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t r = a; r < b; ++r) {
          const std::int64_t e = c * p.stored_cols + r;
          const float v = element(p, data, e);
          if (!std::isfinite(v)) not_finite(p, v, e);
          out[(r - a) * C + c] = v;
        }
      return;
    }
    for (std::int64_t r = a; r < b; ++r) {
      const std::int64_t s = stored_row(p, r);
      float* o = out + (r - a) * C;
      if (p.info.dtype == DType::I8) {
        const auto* q = reinterpret_cast<const std::int8_t*>(data) + s * C;
        const float scale = p.scales[std::size_t(s)];
        for (std::int64_t c = 0; c < C; ++c) {
          if (q[c] == -128) int8_out_of_range(p, s * C + c);
          o[c] = scale * float(q[c]);
        }
        continue;
      }
      if (p.info.dtype == DType::F32) {
        std::memcpy(o, data + 4 * s * C, std::size_t(C) * sizeof(float));
      } else if (p.info.dtype == DType::BF16) {  // a shift each: one vectorised loop
        const std::byte* row = data + 2 * s * C;
#ifdef _OPENMP
#pragma omp simd
#endif
        for (std::int64_t c = 0; c < C; ++c) {
          const std::uint32_t bits = std::uint32_t(stored_as<std::uint16_t>(row + 2 * c)) << 16;
          std::memcpy(o + c, &bits, sizeof bits);
        }
      } else {
        for (std::int64_t c = 0; c < C; ++c) o[c] = element(p, data, s * C + c);
      }
      if (!all_finite(o, C))
        for (std::int64_t c = 0; c < C; ++c)
          if (!std::isfinite(o[c])) not_finite(p, o[c], s * C + c);
    }
  }

  [[noreturn]] void int8_out_of_range(const Piece& p, std::int64_t e) const {
    detail::fail(file_.source(), ": int8 tensor '", p.spec.tensor, "' holds -128 at element ", e,
                 "; symmetric int8 weights lie in [-127, 127]");
  }
  void check_finite_bf16(const Piece& p, const std::byte* data) const {
    const std::int64_t e = first_bf16_not_finite(data, p.rows * cols());
    if (e >= 0) not_finite(p, element(p, data, e), e);
  }
  void check_int8(const Piece& p, const std::byte* data) const {
    const auto* q = reinterpret_cast<const std::int8_t*>(data);
    const std::int64_t n = p.rows * cols();
    std::uint32_t bad = 0;  // a test that vectorises, then the first one found
#ifdef _OPENMP
#pragma omp simd reduction(| : bad)
#endif
    for (std::int64_t e = 0; e < n; ++e) bad |= q[e] == -128;
    if (bad)
      for (std::int64_t e = 0; e < n; ++e)
        if (q[e] == -128) int8_out_of_range(p, e);
  }
  void check_q4_scales(const Piece& p, const std::byte* data) const {
    const std::int64_t blocks = detail::q4_blocks(cols()), n = detail::q4_panels(rows()) * blocks;
    for (std::int64_t i = 0; i < n; ++i)
      for (int r = 0; r < detail::kQ4PanelRows; ++r) {
        const float d = detail::half_to_float(stored_as<std::uint16_t>(data + i * detail::kQ4BlockBytes + 2 * r));
        require(std::isfinite(d), file_.source(), ": 4-bit tensor '", p.spec.tensor, "' holds a scale of ", d,
                " (row ", (i / blocks) * detail::kQ4PanelRows + r, ", block ", i % blocks,
                "); a checkpoint's values must be finite");
      }
  }

  SafeTensors file_;
  std::vector<Piece> pieces_;
  mutable std::once_flag checked_;
};

// The pieces of a GGUF file's tensors (gguf_weights).
class GgufWeights final : public WeightSource {
 public:
  GgufWeights(std::shared_ptr<const GgufFile> file, std::vector<WeightPiece> specs, std::int64_t rows,
              std::int64_t cols)
      : WeightSource(rows, cols), file_(std::move(file)) {
    std::int64_t first = 0;
    for (auto& spec : specs) {
      const GgufTensor& t = file_->tensor(spec.tensor);
      const std::string where = file_->path().string() + ": tensor '" + spec.tensor + "'";
      GgufPiece p{spec, &t, first, 0};
      if (t.shape.size() == 1) {
        require(cols == 1, where, " is a vector of ", t.shape[0], "; the model's matrix has rows of ", cols);
        p.rows = std::int64_t(t.shape[0]);
      } else {
        require(std::int64_t(t.shape[0]) == cols, where, " has rows of ", t.shape[0], " values; the model's of ",
                cols);
        p.rows = std::int64_t(t.rows());
      }
      if (spec.order == WeightPiece::rotary_pairs)
        require(spec.head > 0 && spec.head % 2 == 0 && p.rows % spec.head == 0, where, ": ", p.rows,
                " rows are not heads of ", spec.head, " rotary pairs");
      require(spec.order != WeightPiece::columns, where, ": GGUF tensors are read by rows");
      first += p.rows;
      pieces_.push_back(std::move(p));
    }
    require(first == rows, name(), " give ", first, " rows, the model's matrix has ", rows);
  }

  void read_rows(std::int64_t r0, std::int64_t r1, float* out) const override {
    const std::int64_t C = cols();
    for (const GgufPiece& p : pieces_) {
      const std::int64_t a = std::max(r0, p.first) - p.first, b = std::min(r1, p.first + p.rows) - p.first;
      if (a >= b) continue;
      float* o = out + (a + p.first - r0) * C;
      if (p.tensor->shape.size() == 1) {  // a vector: small, decoded whole
        const std::vector<float> all = file_->values(*p.tensor);
        for (std::int64_t r = a; r < b; ++r) o[r - a] = all[std::size_t(stored_row(p, r))];
      } else if (p.spec.order == WeightPiece::rows) {
        file_->read_rows(*p.tensor, std::uint64_t(a), std::uint64_t(b - a), o);
      } else {
        for (std::int64_t r = a; r < b; ++r) file_->read_rows(*p.tensor, std::uint64_t(stored_row(p, r)), 1, o + (r - a) * C);
      }
      if (!all_finite(o, (b - a) * C))
        for (std::int64_t e = 0; e < (b - a) * C; ++e)
          require(std::isfinite(o[e]), file_->path().string(), ": tensor '", p.spec.tensor, "' holds ", o[e],
                  " in row ", stored_row(p, a + e / C), "; a checkpoint's values must be finite");
    }
  }

  StoredWeights stored(StoredLayout layout) const override {
    if (layout != StoredLayout::bf16_rows || !whole_rows(GgmlType::bf16)) return {};
    const GgufPiece& p = pieces_[0];
    const std::byte* data = file_->bytes(*p.tensor).data();
    std::call_once(checked_, [&] {
      const std::int64_t e = first_bf16_not_finite(data, p.rows * cols());
      require(e < 0, file_->path().string(), ": tensor '", p.spec.tensor, "' holds a value that is not finite at element ",
              e, "; a checkpoint's values must be finite");
    });
    return {StoredLayout::bf16_rows, data, {}};
  }

  // A Q4_0 block is a float16 scale d and 16 bytes whose low nibbles are
  // q[0, 16) and high nibbles q[16, 32), w = d (q - 8): a panel's group g
  // of a row is that row's bytes 4g..4g+3 as they are (core/q4.hpp). Every
  // piece must be a Q4_0 matrix (in any order: a row is found where it is
  // stored). Each panel's rows are read in order into its bytes (a few KiB,
  // in cache), the panels shared among the threads.
  bool q4_panels(std::byte* P) const override {
    for (const GgufPiece& p : pieces_)
      if (p.tensor->type != GgmlType::q4_0 || p.tensor->shape.size() < 2) return false;
    const long N = long(rows()), K = long(cols()), blocks = detail::q4_blocks(K);
    constexpr int kBlock = 18;  // ggml's block_q4_0
    // Row r's first block in the file.
    auto row = [this, blocks](long r) {
      const GgufPiece* p = &pieces_[0];
      while (r >= p->first + p->rows) ++p;
      return std::pair{p, file_->bytes(*p->tensor).data() + stored_row(*p, r - p->first) * blocks * kBlock};
    };
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(detail::thread_count()));
    std::exception_ptr* error = errors.data();
    detail::parallel_ranges(detail::q4_panels(N), N * K > detail::kParallelWork, [=, this](long lo, long hi) {
      try {
        for (long pn = lo; pn < hi; ++pn) {
          std::byte* panel = P + detail::q4_offset(K, pn, 0);
          for (int i = 0; i < detail::kQ4PanelRows; ++i) {
            const long r = pn * detail::kQ4PanelRows + i;
            if (r >= N) {  // a padding row: scale 0, q = 8
              for (long b = 0; b < blocks; ++b) {
                std::byte* out = panel + b * detail::kQ4BlockBytes;
                std::memset(out + 2 * i, 0, 2);
                for (int g = 0; g < 4; ++g) std::memset(out + 32 + 64 * g + 4 * i, 0x88, 4);
              }
              continue;
            }
            const auto [piece, first] = row(r);
            for (long b = 0; b < blocks; ++b) {
              std::byte* out = panel + b * detail::kQ4BlockBytes;
              const std::byte* block = first + b * kBlock;
              const float d = detail::half_to_float(stored_as<std::uint16_t>(block));
              require(std::isfinite(d), file_->path().string(), ": Q4_0 tensor '", piece->spec.tensor,
                      "' holds a scale of ", d, " (row ", stored_row(*piece, r - piece->first), ", block ", b,
                      "); a checkpoint's values must be finite");
              std::memcpy(out + 2 * i, block, 2);
              for (int g = 0; g < 4; ++g) std::memcpy(out + 32 + 64 * g + 4 * i, block + 2 + 4 * g, 4);
            }
          }
        }
      } catch (...) {
        error[detail::thread_index()] = std::current_exception();
      }
    });
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    return true;
  }

  void release() const override {
    for (const GgufPiece& p : pieces_) file_->release(*p.tensor);
  }
  void release_rows(std::int64_t r0, std::int64_t r1) const override {
    for (const GgufPiece& p : pieces_) {
      const std::int64_t a = std::max(r0, p.first), b = std::min(r1, p.first + p.rows);
      if (a >= b || p.spec.order != WeightPiece::rows || p.tensor->shape.size() == 1) continue;
      const std::uint64_t row_bytes = ggml_bytes(p.tensor->type, p.tensor->shape[0]);
      file_->release(*p.tensor, std::uint64_t(a - p.first) * row_bytes, std::uint64_t(b - p.first) * row_bytes);
    }
  }

  std::string name() const override {
    std::string n = file_->path().string() + ": tensor" + (pieces_.size() > 1 ? "s" : "");
    for (std::size_t i = 0; i < pieces_.size(); ++i) n += (i ? ", '" : " '") + pieces_[i].spec.tensor + "'";
    return n;
  }

 private:
  struct GgufPiece {
    WeightPiece spec;
    const GgufTensor* tensor;
    std::int64_t first = 0, rows = 0;  // the matrix's rows it gives
  };
  // One matrix of `type` read as its rows.
  bool whole_rows(GgmlType type) const {
    return pieces_.size() == 1 && pieces_[0].spec.order == WeightPiece::rows && pieces_[0].tensor->type == type &&
           pieces_[0].tensor->shape.size() >= 2;
  }
  static std::int64_t stored_row(const GgufPiece& p, std::int64_t r) {
    if (p.spec.order != WeightPiece::rotary_pairs) return r;
    const std::int64_t head = p.spec.head, h = r / head, j = r % head;
    return h * head + (j % 2) * (head / 2) + j / 2;
  }

  std::shared_ptr<const GgufFile> file_;
  std::vector<GgufPiece> pieces_;
  mutable std::once_flag checked_;
};

}  // namespace

std::shared_ptr<const WeightSource> safetensors_weights(const SafeTensors& file, std::vector<WeightPiece> pieces,
                                                        std::int64_t rows, std::int64_t cols) {
  return std::make_shared<SafeTensorsWeights>(file, std::move(pieces), rows, cols);
}

std::shared_ptr<const WeightSource> gguf_weights(std::shared_ptr<const GgufFile> file, std::vector<WeightPiece> pieces,
                                                 std::int64_t rows, std::int64_t cols) {
  return std::make_shared<GgufWeights>(std::move(file), std::move(pieces), rows, cols);
}

std::vector<float> read_all(const WeightSource& source) {
  std::vector<float> v(std::size_t(source.rows() * source.cols()));
  source.read_rows(0, source.rows(), v.data());
  return v;
}

}  // namespace xfmr
