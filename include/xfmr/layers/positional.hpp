// positional.hpp: position information added to token embeddings,
// y[b,t,:] = x[b,t,:] + P[t,:] for t < T <= MAX_T.
//
// LearnedPositions: P is a parameter, "weight" (MAX_T, D), initialised N(0, 1)
//   like torch.nn.Embedding. Backward: dweight accumulates, dx assigned.
// SinusoidalPositions: P is fixed (Vaswani et al. 2017),
//   P[t, 2i] = sin(t / 10000^(2i/D)),  P[t, 2i+1] = cos(t / 10000^(2i/D)).
//   No parameters; backward is dx = dy.
// y may alias x and dx may alias dy (the operations are elementwise).
// Rope (rotary positions, Su et al. 2021; Llama): nothing is added to the
//   embeddings (NoPositions); self-attention turns each pair (2i, 2i+1) of
//   every query and key head by t / theta^(2i/QK_HEAD_DIM) radians
//   (RotaryPositions; theta 10000 unless ModelDims::rope_theta says, each
//   frequency scaled as ModelDims::rope_scaling says), in training, in
//   cached decoding and in beam search.
// DynamicPositions: one of the three, chosen at run time
//   (ModelParts::positions): AnyPositions in the token stem, and rotary
//   turns in self-attention when the parts say rope.
// MAX_T and D may be Dynamic (core/config.hpp): given at construction.
#pragma once

#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>
#include <type_traits>
#include <vector>

#include "xfmr/core/config.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

// Policy tags for a configuration's `using Positions = ...` (default Learned).
struct Learned {
  static constexpr const char* name = "learned";
};
struct Sinusoidal {
  static constexpr const char* name = "sinusoidal";
};
struct Rope {
  static constexpr const char* name = "rope";
};
struct DynamicPositions {
  static constexpr const char* name = "dynamic";
};

namespace detail {
inline void require_length(int MAX_T, Shape bt, int rows, int offset) {
  require(bt.B > 0 && bt.T > 0, "batch ", bt.B, " x length ", bt.T, " must be positive");
  require(offset >= 0, "negative position offset ", offset);
  if (offset == 0) require(bt.T <= MAX_T, "sequence length ", bt.T, " exceeds MAX_T ", MAX_T);
  else require(offset + bt.T <= MAX_T, "positions ", offset, "..", offset + bt.T - 1, " exceed MAX_T ", MAX_T);
  require(rows == bt.rows(), "input has ", rows, " rows, expected B*T = ", bt.rows());
}
template <class Cfg>
struct positions_tag {
  using type = Learned;
};
template <class Cfg>
  requires requires { typename Cfg::Positions; }
struct positions_tag<Cfg> {
  using type = typename Cfg::Positions;
  static_assert(std::is_same_v<type, Learned> || std::is_same_v<type, Sinusoidal> || std::is_same_v<type, Rope> ||
                    std::is_same_v<type, DynamicPositions>,
                "Positions must be xfmr::Learned, xfmr::Sinusoidal, xfmr::Rope or xfmr::DynamicPositions");
};

// The divisor of the positions of pair i (columns 2i, 2i+1) of a width:
// theta^(2i / width), and under rope scaling the position's divisor that
// gives the scaled frequency (transformers' rope_scaling "linear", and
// "llama3" as _compute_llama3_parameters defines it).
inline double angle_divisor(int i, int width, double theta, const RopeScaling& scaling) {
  const double divisor = std::pow(theta, double(2 * i) / width);
  switch (scaling.kind) {
    case RopeScaling::none: return divisor;
    case RopeScaling::linear: return divisor * scaling.factor;
    case RopeScaling::llama3: {
      const double pi = 3.14159265358979323846;
      const double wavelength = 2 * pi * divisor, old = scaling.original_max_t;
      const double low_freq_wavelength = old / scaling.low_freq_factor;
      const double high_freq_wavelength = old / scaling.high_freq_factor;
      if (wavelength < high_freq_wavelength) return divisor;                   // high frequencies: kept
      if (wavelength > low_freq_wavelength) return divisor * scaling.factor;   // low frequencies: scaled
      const double smooth =
          (old / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
      const double inv_freq = 1.0 / divisor;
      return 1.0 / ((1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq);
    }
  }
  return divisor;
}

// The fixed tables of sinusoidal and rotary positions: for every position
// t < rows and pair i, the sine and cosine of t / angle_divisor(i), in that
// order or (cos_first) the other.
template <class S>
std::vector<S> angle_pairs(int rows, int width, bool cos_first, double theta = 10000.0,
                           const RopeScaling& scaling = {}) {
  std::vector<double> divisors(width / 2);
  for (int i = 0; i < width / 2; ++i) divisors[i] = angle_divisor(i, width, theta, scaling);
  std::vector<S> host(static_cast<std::size_t>(rows) * width);
  for (int t = 0; t < rows; ++t)
    for (int i = 0; i + 1 < width; i += 2) {
      const double angle = t / divisors[i / 2];
      host[std::size_t(t) * width + i] = S(cos_first ? std::cos(angle) : std::sin(angle));
      host[std::size_t(t) * width + i + 1] = S(cos_first ? std::sin(angle) : std::cos(angle));
    }
  return host;
}

// A host rotary table of these sizes and knobs, made once and shared by
// every layer (and model) that asks while one holds it: an attention layer
// each held its own, and Llama 3's (131,072 positions of 128 columns, 64 MB)
// came to 2 GB for an 8B model's 32 layers, and six seconds of its load.
template <class Tensor>
std::shared_ptr<const Tensor> shared_rotary_table(int max_t, int hd, double theta, const RopeScaling& scaling) {
  using S = typename Tensor::value_type;
  struct Entry {
    int max_t, hd;
    double theta;
    RopeScaling scaling;
    std::weak_ptr<const Tensor> table;
  };
  static std::mutex mutex;
  static std::vector<Entry> tables;
  const std::lock_guard lock(mutex);
  for (const Entry& e : tables)
    if (e.max_t == max_t && e.hd == hd && e.theta == theta && e.scaling == scaling)
      if (auto table = e.table.lock()) return table;
  auto table = std::make_shared<Tensor>(std::vector<std::int64_t>{max_t, hd});
  table->copy_from_host(angle_pairs<S>(max_t, hd, true, theta, scaling).data());
  std::erase_if(tables, [](const Entry& e) { return e.table.expired(); });
  tables.push_back({max_t, hd, theta, scaling, table});
  return table;
}

inline Rng& unused_rng() {
  static thread_local Rng rng(0);
  return rng;
}
}  // namespace detail

template <int MAX_T_, int D_, class Backend>
class LearnedPositions {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  explicit LearnedPositions(Rng& rng)
    requires(MAX_T_ != Dynamic && D_ != Dynamic)
      : LearnedPositions(MAX_T_, D_, rng) {}
  LearnedPositions(int max_t, int width, Rng& rng)
      : MAX_T(max_t, "context length"), D(width, "positions width"), weight_{MAX_T, D}, dweight_{MAX_T, D} {
    if (rng.initialises()) weight_.generate([&] { return S(rng.normal()); });
  }

  // offset: the position of the first row of each sequence (incremental
  // decoding); backward supports offset 0 only.
  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y, Shape bt, int offset = 0) {
    detail::require_length(MAX_T, bt, x.rows, offset);
    require_width(x, D, "positions input");
    require_rows(y, x.rows, "LearnedPositions output");
    bt_ = bt;
    be.add_positions_forward(bt.B, bt.T, D, x.data, weight_.data() + std::size_t(offset) * D, y.data);
  }

  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx) {
    require_rows(dy, bt_.rows(), "LearnedPositions output gradient");
    be.add_positions_backward(bt_.B, bt_.T, D, dy.data, dweight_.data());
    if (dx.data) {
      require_rows(dx, bt_.rows(), "LearnedPositions input gradient");
      be.copy(dy.size(), dy.data, dx.data);
    }
  }

  void visit(ParameterVisitor<Backend> f) {
    f("weight", weight_, dweight_);
  }

 private:
  [[no_unique_address]] Dim<MAX_T_> MAX_T;
  [[no_unique_address]] Dim<D_> D;
  Tensor weight_, dweight_;  // (MAX_T, D)
  Shape bt_;
};

template <int MAX_T_, int D_, class Backend>
class SinusoidalPositions {
  static_assert(D_ == Dynamic || D_ % 2 == 0, "sinusoidal positions pair sin and cos: D_MODEL must be even");

 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  explicit SinusoidalPositions(Rng& rng = detail::unused_rng())
    requires(MAX_T_ != Dynamic && D_ != Dynamic)
      : SinusoidalPositions(MAX_T_, D_, rng) {}
  SinusoidalPositions(int max_t, int width, Rng& = detail::unused_rng())
      : MAX_T(max_t, "context length"), D(width, "positions width"), table_{MAX_T, D} {
    require(D % 2 == 0, "sinusoidal positions pair sin and cos: the model width ", int(D), " must be even");
    table_.copy_from_host(detail::angle_pairs<S>(MAX_T, D, false).data());
  }

  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y, Shape bt, int offset = 0) {
    detail::require_length(MAX_T, bt, x.rows, offset);
    require_width(x, D, "positions input");
    require_rows(y, x.rows, "SinusoidalPositions output");
    bt_ = bt;
    be.add_positions_forward(bt.B, bt.T, D, x.data, table_.data() + std::size_t(offset) * D, y.data);
  }

  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx) {
    require_rows(dy, bt_.rows(), "SinusoidalPositions output gradient");
    require_rows(dx, bt_.rows(), "SinusoidalPositions input gradient");
    be.copy(dy.size(), dy.data, dx.data);
  }

  template <class F>
  void visit(F&&) {}

  const Tensor& table() const { return table_; }

 private:
  [[no_unique_address]] Dim<MAX_T_> MAX_T;
  [[no_unique_address]] Dim<D_> D;
  Tensor table_;  // (MAX_T, D), fixed
  Shape bt_;
};

// Nothing added: the token stem of a configuration with rotary positions
// (its attention turns queries and keys instead). Checks the lengths.
template <int MAX_T_, int D_, class Backend>
class NoPositions {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;

  explicit NoPositions(Rng& rng = detail::unused_rng())
    requires(MAX_T_ != Dynamic && D_ != Dynamic)
      : NoPositions(MAX_T_, D_, rng) {}
  NoPositions(int max_t, int width, Rng& = detail::unused_rng())
      : MAX_T(max_t, "context length"), D(width, "positions width") {}

  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y, Shape bt, int offset = 0) {
    detail::require_length(MAX_T, bt, x.rows, offset);
    require_width(x, D, "positions input");
    require_rows(y, x.rows, "positions output");
    rows_ = x.rows;
    if (y.data != x.data) be.copy(x.size(), x.data, y.data);
  }

  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx) {
    require_rows(dy, rows_, "positions output gradient");
    if (dx.data && dx.data != dy.data) be.copy(dy.size(), dy.data, dx.data);
  }

  template <class F>
  void visit(F&&) {}

 private:
  [[no_unique_address]] Dim<MAX_T_> MAX_T;
  [[no_unique_address]] Dim<D_> D;
  int rows_ = 0;
};

// Rotary positions for heads HD wide: the fixed (cos, sin) table of every
// position < MAX_T and pair, and the turn of a block of rows in place.
template <int MAX_T_, int HD_, class Backend>
class RotaryPositions {
  static_assert(HD_ == Dynamic || HD_ % 2 == 0,
                "rotary positions turn pairs of columns: the query/key head width must be even");

 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  RotaryPositions()
    requires(MAX_T_ != Dynamic && HD_ != Dynamic)
      : RotaryPositions(MAX_T_, HD_) {}
  // theta and scaling: ModelDims::rope_theta and rope_scaling.
  // A host table is shared with every layer of the same sizes and knobs
  // (detail::shared_rotary_table); a device's is the layer's own.
  RotaryPositions(int max_t, int head_width, double theta = 10000.0, const RopeScaling& scaling = {})
      : MAX_T(max_t, "context length"), HD(head_width, "rotary head width") {
    require(HD % 2 == 0, "rotary positions turn pairs of columns: the query/key head width ", int(HD),
            " must be even");
    if constexpr (std::is_same_v<Tensor, xfmr::Tensor<S>>) {
      table_ = detail::shared_rotary_table<Tensor>(MAX_T, HD, theta, scaling);
    } else {
      auto own = std::make_shared<Tensor>(std::vector<std::int64_t>{MAX_T, HD});
      own->copy_from_host(detail::angle_pairs<S>(MAX_T, HD, true, theta, scaling).data());
      table_ = std::move(own);
    }
  }

  // Rows b*T + t of x (row stride ld), positions offset + t, `heads` heads of
  // HD columns from x's first column: turned forward, or back (backward).
  void forward(Backend& be, int B, int T, int offset, int heads, A* x, int ld) const {
    check(T, offset);
    be.rope_forward(B, T, offset, heads, HD, table_->data(), x, ld);
  }
  void backward(Backend& be, int B, int T, int offset, int heads, A* dx, int ld) const {
    check(T, offset);
    be.rope_backward(B, T, offset, heads, HD, table_->data(), dx, ld);
  }

  const Tensor& table() const { return *table_; }

 private:
  void check(int T, int offset) const {
    require(T > 0 && offset >= 0 && offset + T <= MAX_T, "rotary positions ", offset, "..", offset + T - 1,
            " outside [0, MAX_T ", MAX_T, ")");
  }
  [[no_unique_address]] Dim<MAX_T_> MAX_T;
  [[no_unique_address]] Dim<HD_> HD;
  std::shared_ptr<const Tensor> table_;  // (MAX_T, HD): (cos, sin) per pair
};

}  // namespace xfmr

namespace xfmr {

template <class Cfg>
constexpr bool rotary_positions() {
  return std::is_same_v<typename detail::positions_tag<Cfg>::type, Rope>;
}
template <class Cfg>
constexpr bool dynamic_positions() {
  return std::is_same_v<typename detail::positions_tag<Cfg>::type, DynamicPositions>;
}

// The token stem's positions chosen at run time (ModelParts::positions):
// learned (its parameter "weight", drawn from the generator as
// LearnedPositions draws it), sinusoidal, or none (rotary: the attention
// turns queries and keys), each as its own layer computes it.
template <int MAX_T_, int D_, class Backend>
class AnyPositions {
 public:
  using A = typename Backend::Activation;
  using Kind = ModelParts::Positions;

  AnyPositions(int max_t, int width, Rng& rng, Kind kind) {
    if (kind == Kind::learned) learned_.emplace(max_t, width, rng);
    else if (kind == Kind::sinusoidal) sinusoidal_.emplace(max_t, width, rng);
    else none_.emplace(max_t, width, rng);
  }

  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y, Shape bt, int offset = 0) {
    if (learned_) learned_->forward(be, x, y, bt, offset);
    else if (sinusoidal_) sinusoidal_->forward(be, x, y, bt, offset);
    else none_->forward(be, x, y, bt, offset);
  }
  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx) {
    if (learned_) learned_->backward(be, dy, dx);
    else if (sinusoidal_) sinusoidal_->backward(be, dy, dx);
    else none_->backward(be, dy, dx);
  }
  void visit(ParameterVisitor<Backend> f) {
    if (learned_) learned_->visit(f);
  }

 private:
  std::optional<LearnedPositions<MAX_T_, D_, Backend>> learned_;
  std::optional<SinusoidalPositions<MAX_T_, D_, Backend>> sinusoidal_;
  std::optional<NoPositions<MAX_T_, D_, Backend>> none_;
};

// The positions layer a configuration's token stem asks for.
template <class Cfg, class Backend>
using PositionsFor = std::conditional_t<
    dynamic_positions<Cfg>(), AnyPositions<Cfg::MAX_T, Cfg::D_MODEL, Backend>,
    std::conditional_t<
        rotary_positions<Cfg>(), NoPositions<Cfg::MAX_T, Cfg::D_MODEL, Backend>,
        std::conditional_t<std::is_same_v<typename detail::positions_tag<Cfg>::type, Sinusoidal>,
                           SinusoidalPositions<Cfg::MAX_T, Cfg::D_MODEL, Backend>,
                           LearnedPositions<Cfg::MAX_T, Cfg::D_MODEL, Backend>>>>;

// A configuration's positions layer for the token stem: the parts' kind to an AnyPositions.
template <class Positions>
Positions make_positions(const ModelDims& d, Rng& rng) {
  if constexpr (std::is_constructible_v<Positions, int, int, Rng&, ModelParts::Positions>)
    return Positions(d.max_t, d.d_model, rng, d.parts.positions);
  else return Positions(d.max_t, d.d_model, rng);
}

}  // namespace xfmr
