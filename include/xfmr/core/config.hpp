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
#pragma once

#include <concepts>

namespace xfmr {

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
  else return Cfg::D_MODEL / Cfg::N_HEADS;
}

template <AttentionConfig Cfg>
consteval int v_head_dim() {
  if constexpr (requires { Cfg::V_HEAD_DIM; }) return Cfg::V_HEAD_DIM;
  else return Cfg::D_MODEL / Cfg::N_HEADS;
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

}  // namespace xfmr
