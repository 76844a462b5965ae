// config.hpp: what a model configuration provides, and the sizes derived
// from it.
//
// A configuration is a struct of static constexpr sizes plus policy types:
//   struct Tiny {
//     static constexpr int MAX_T = 8, D_MODEL = 16, N_HEADS = 2, N_LAYERS = 2, D_FF = 32;
//     using Norm = xfmr::PreNorm;        // or PostNorm
//     using Activation = xfmr::Gelu;     // or Relu, SwiGlu
//   };
// Optional: QK_HEAD_DIM and V_HEAD_DIM (default D_MODEL / N_HEADS) for heads
// whose query/key or value width differs from D_MODEL / N_HEADS;
//   template <int D, class Be> using NormLayer = xfmr::RmsNorm<D, Be>;
// for RMS norms in the blocks and the final norm (default LayerNorm;
// residual.hpp); Positions = Learned, Sinusoidal or Rope (positional.hpp,
// default Learned); BIAS = false for attention and
// feed-forward projections without biases (default true); N_KV_HEADS
// (dividing N_HEADS) for grouped-query attention.
//
// Any of the sizes may be xfmr::Dynamic, as in Eigen: the size is then held
// at run time, given at construction in a ModelDims (below), and one
// compiled model serves every shape of its family. A static size is checked
// by the compiler and costs nothing; a Dynamic one is checked where parts
// meet (an xfmr::Error naming both sizes). Every backend call already takes
// run-time sizes, so the two compute the same bits (test_dynamic).
// ModelDims also carries the run-time knobs of an architecture: the norms'
// epsilon, rotary positions' theta and scaling, and the projections'
// biases (a static configuration's defaults: model_dims<Cfg>()); and its
// parts (ModelParts), which a configuration whose parts are Dynamic
// (DynamicNorm, AnyNorm, DynamicActivation, DynamicPositions) builds
// from, as it builds its Dynamic sizes from the sizes; a configuration
// with static parts keeps its own, and the ModelParts given are not read.
#pragma once

#include <concepts>
#include <initializer_list>
#include <string>
#include <string_view>

#include "xfmr/core/error.hpp"

namespace xfmr {

// A size held at run time (Eigen's Dynamic).
inline constexpr int Dynamic = -1;

// A size that is N at compile time, or held at run time when N is Dynamic
// (Eigen's variable_if_dynamic): empty when static.
template <int N>
struct Dim {
  static_assert(N > 0, "a static size must be positive (or xfmr::Dynamic)");
  static constexpr bool is_static = true;
  constexpr Dim() = default;
  explicit Dim(int n, const char* what = "size") {
    require(n == N, what, " ", n, " does not match the static size ", N);
  }
  static constexpr int value() { return N; }
  constexpr operator int() const { return N; }
};
template <>
struct Dim<Dynamic> {
  static constexpr bool is_static = false;
  Dim() = default;
  explicit Dim(int n, const char* what = "size") : n_(n) { require(n > 0, what, " ", n, " must be positive"); }
  int value() const { return n_; }
  operator int() const { return n_; }

 private:
  int n_ = 0;
};

// N when every one of sizes is static, else Dynamic: a size derived from others.
constexpr int static_or_dynamic(int n, std::initializer_list<int> sizes) {
  for (int s : sizes)
    if (s == Dynamic) return Dynamic;
  return n;
}

// Rotary positions' frequency scaling (transformers' rope_scaling): none;
// linear (every frequency divided by factor); or Llama 3's "llama3" (long
// wavelengths divided by factor, short ones kept, those between blended;
// transformers' _compute_llama3_parameters).
struct RopeScaling {
  enum Kind { none, linear, llama3 } kind = none;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_t = 8192;
  bool operator==(const RopeScaling&) const = default;
};

// An architecture's parts at run time: the norms' place (before the
// sublayer, or after the residual sum) and kind, the feed-forward's
// activation, and the position scheme.
struct ModelParts {
  enum class Activation { relu, gelu, swiglu, geglu };
  enum class Positions { learned, sinusoidal, rope };
  bool pre_norm = true;  // PreNorm, else PostNorm
  bool rms_norm = false;  // RmsNorm, else LayerNorm
  Activation activation = Activation::gelu;
  Positions positions = Positions::learned;
  bool operator==(const ModelParts&) const = default;

  bool gated() const { return activation == Activation::swiglu || activation == Activation::geglu; }
  bool rope() const { return positions == Positions::rope; }

  // The parts' names ("gelu", "rope"), as configurations, checkpoints and
  // errors give them, and back (an unknown name is an xfmr::Error naming
  // `what` and the choices).
  static constexpr std::string_view kActivations[] = {"relu", "gelu", "swiglu", "geglu"};
  static constexpr std::string_view kPositions[] = {"learned", "sinusoidal", "rope"};
  std::string_view activation_name() const { return kActivations[int(activation)]; }
  std::string_view positions_name() const { return kPositions[int(positions)]; }
  static Activation activation_named(std::string_view name, std::string_view what = "activation") {
    for (int i = 0; i < 4; ++i)
      if (kActivations[i] == name) return Activation(i);
    detail::fail(what, " '", name, "' is not one of relu, gelu, swiglu, geglu");
  }
  static Positions positions_named(std::string_view name, std::string_view what = "positions") {
    for (int i = 0; i < 3; ++i)
      if (kPositions[i] == name) return Positions(i);
    detail::fail(what, " '", name, "' is not one of learned, sinusoidal, rope");
  }
};

// A model's sizes and knobs at run time: what a Dynamic configuration is
// built from, and what a static one is (model_dims<Cfg>()). head dims of 0
// mean d_model / n_heads; n_kv_heads 0 means n_heads.
struct ModelDims {
  int max_t = 0, d_model = 0, n_heads = 0, n_kv_heads = 0, n_layers = 0, d_ff = 0;
  int qk_head_dim = 0, v_head_dim = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling{};
  bool bias = true;       // the blocks' projections (attention and feed-forward)
  bool qkv_bias = false;  // biases on the query, key and value projections even without `bias` (Qwen2)
  ModelParts parts{};     // read by a configuration whose parts are Dynamic
  bool operator==(const ModelDims&) const = default;

  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int qk_head() const { return qk_head_dim > 0 ? qk_head_dim : (n_heads > 0 ? d_model / n_heads : 0); }
  int v_head() const { return v_head_dim > 0 ? v_head_dim : (n_heads > 0 ? d_model / n_heads : 0); }
  bool has_qkv_bias() const { return bias || qkv_bias; }

  // Throws xfmr::Error naming the first size that cannot build a model.
  void check() const {
    require(max_t > 0, "context length (max_t) ", max_t, " must be positive");
    require(d_model > 0, "model width (d_model) ", d_model, " must be positive");
    require(n_heads > 0, "head count (n_heads) ", n_heads, " must be positive");
    require(n_layers > 0, "layer count (n_layers) ", n_layers, " must be positive");
    require(d_ff > 0, "feed-forward width (d_ff) ", d_ff, " must be positive");
    require(kv_heads() > 0 && n_heads % kv_heads() == 0, "key/value heads (n_kv_heads) ", kv_heads(),
            " must divide the heads ", n_heads);
    require(qk_head_dim > 0 || d_model % n_heads == 0, "model width ", d_model, " is not divisible by the heads ",
            n_heads);
    require(qk_head() > 0 && v_head() > 0, "head widths ", qk_head(), " and ", v_head(), " must be positive");
    require(norm_eps > 0, "norm epsilon ", norm_eps, " must be positive");
    require(rope_theta > 1, "rotary theta ", rope_theta, " must exceed 1");
    if (rope_scaling.kind != RopeScaling::none)
      require(rope_scaling.factor >= 1, "rope scaling factor ", rope_scaling.factor, " must be at least 1");
    if (rope_scaling.kind == RopeScaling::llama3)
      require(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor && rope_scaling.low_freq_factor > 0 &&
                  rope_scaling.original_max_t > 0,
              "llama3 rope scaling needs high_freq_factor (", rope_scaling.high_freq_factor, ") > low_freq_factor (",
              rope_scaling.low_freq_factor, ") > 0 and a positive original context (",
              rope_scaling.original_max_t, ")");
  }
};

template <class Cfg>
concept AttentionConfig = requires {
  { Cfg::D_MODEL } -> std::convertible_to<int>;
  { Cfg::N_HEADS } -> std::convertible_to<int>;
  { Cfg::MAX_T } -> std::convertible_to<int>;
};

template <class Cfg>
concept BlockConfig = AttentionConfig<Cfg> && requires {
  { Cfg::D_FF } -> std::convertible_to<int>;
  typename Cfg::Norm;
  typename Cfg::Activation;
};

template <AttentionConfig Cfg>
consteval int qk_head_dim() {
  if constexpr (requires { Cfg::QK_HEAD_DIM; }) return Cfg::QK_HEAD_DIM;
  else return static_or_dynamic(Cfg::D_MODEL / Cfg::N_HEADS, {Cfg::D_MODEL, Cfg::N_HEADS});
}

template <AttentionConfig Cfg>
consteval int v_head_dim() {
  if constexpr (requires { Cfg::V_HEAD_DIM; }) return Cfg::V_HEAD_DIM;
  else return static_or_dynamic(Cfg::D_MODEL / Cfg::N_HEADS, {Cfg::D_MODEL, Cfg::N_HEADS});
}

// Key/value heads (Cfg::N_KV_HEADS, default N_HEADS): fewer is grouped-query
// attention, each key/value head shared by N_HEADS / N_KV_HEADS query heads.
template <AttentionConfig Cfg>
consteval int kv_heads() {
  if constexpr (requires { Cfg::N_KV_HEADS; }) return Cfg::N_KV_HEADS;
  else return Cfg::N_HEADS;
}

// Whether the blocks' linear projections have biases (Cfg::BIAS, default true).
template <AttentionConfig Cfg>
consteval bool linear_bias() {
  if constexpr (requires { Cfg::BIAS; }) return Cfg::BIAS;
  else return true;
}

template <AttentionConfig Cfg>
consteval bool head_dims_are_explicit() {
  return requires { Cfg::QK_HEAD_DIM; } && requires { Cfg::V_HEAD_DIM; };
}

// Whether every size of the configuration is static.
template <AttentionConfig Cfg>
consteval bool is_static_config() {
  constexpr int sizes[] = {Cfg::D_MODEL, Cfg::N_HEADS, Cfg::MAX_T, kv_heads<Cfg>(), qk_head_dim<Cfg>(),
                           v_head_dim<Cfg>()};
  for (int s : sizes)
    if (s == Dynamic) return false;
  if constexpr (requires { Cfg::D_FF; }) {
    if (Cfg::D_FF == Dynamic) return false;
  }
  if constexpr (requires { Cfg::N_LAYERS; }) {
    if (Cfg::N_LAYERS == Dynamic) return false;
  }
  return true;
}

// The run-time dims of a configuration: its sizes (0 where Dynamic) and its
// knobs' defaults (Cfg::NORM_EPS, Cfg::ROPE_THETA where it sets them).
template <AttentionConfig Cfg>
ModelDims model_dims() {
  auto size = [](int n) { return n == Dynamic ? 0 : n; };
  ModelDims d;
  d.max_t = size(Cfg::MAX_T);
  d.d_model = size(Cfg::D_MODEL);
  d.n_heads = size(Cfg::N_HEADS);
  if constexpr (requires { Cfg::N_KV_HEADS; }) d.n_kv_heads = size(Cfg::N_KV_HEADS);  // else 0: one a head
  if constexpr (requires { Cfg::N_LAYERS; }) d.n_layers = size(Cfg::N_LAYERS);
  if constexpr (requires { Cfg::D_FF; }) d.d_ff = size(Cfg::D_FF);
  if constexpr (requires { Cfg::QK_HEAD_DIM; }) d.qk_head_dim = size(Cfg::QK_HEAD_DIM);
  if constexpr (requires { Cfg::V_HEAD_DIM; }) d.v_head_dim = size(Cfg::V_HEAD_DIM);
  if constexpr (requires { Cfg::NORM_EPS; }) d.norm_eps = Cfg::NORM_EPS;
  if constexpr (requires { Cfg::ROPE_THETA; }) d.rope_theta = Cfg::ROPE_THETA;
  d.bias = linear_bias<Cfg>();
  return d;
}

// Throws unless dims agree with every static size of Cfg and can build a model.
template <AttentionConfig Cfg>
void check_model_dims(const ModelDims& d) {
  d.check();
  auto same = [](int fixed, int given, const char* what) {
    require(fixed == Dynamic || fixed == given, what, " ", given, " does not match the configuration's ", fixed);
  };
  same(Cfg::MAX_T, d.max_t, "context length");
  same(Cfg::D_MODEL, d.d_model, "model width");
  same(Cfg::N_HEADS, d.n_heads, "head count");
  same(kv_heads<Cfg>(), d.kv_heads(), "key/value head count");
  same(qk_head_dim<Cfg>(), d.qk_head(), "query/key head width");
  same(v_head_dim<Cfg>(), d.v_head(), "value head width");
  if constexpr (requires { Cfg::N_LAYERS; }) same(Cfg::N_LAYERS, d.n_layers, "layer count");
  if constexpr (requires { Cfg::D_FF; }) same(Cfg::D_FF, d.d_ff, "feed-forward width");
}

}  // namespace xfmr
