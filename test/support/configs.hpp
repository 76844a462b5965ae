// configs.hpp: tiny configurations for gradient checks (double, seconds).
#pragma once

#include "xfmr/blocks/residual.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/positional.hpp"
#include "xfmr/layers/rms_norm.hpp"

namespace xfmr::test {

struct TinyPre {
  static constexpr int MAX_T = 6, D_MODEL = 8, N_HEADS = 2, N_LAYERS = 1, D_FF = 12;
  using Norm = PreNorm;
  using Activation = Gelu;
};

struct TinyPost {
  static constexpr int MAX_T = 6, D_MODEL = 8, N_HEADS = 2, N_LAYERS = 1, D_FF = 12;
  using Norm = PostNorm;
  using Activation = Relu;
};

// Query/key and value head sizes set independently of D_MODEL / N_HEADS.
struct TinySplitHeads {
  static constexpr int MAX_T = 6, D_MODEL = 8, N_HEADS = 2, N_LAYERS = 1, D_FF = 12;
  static constexpr int QK_HEAD_DIM = 3, V_HEAD_DIM = 5;
  using Norm = PreNorm;
  using Activation = Gelu;
};

// "Wide" heads: each head as wide as the model (H * head > D_MODEL).
struct TinyWideHeads {
  static constexpr int MAX_T = 6, D_MODEL = 6, N_HEADS = 3, N_LAYERS = 1, D_FF = 12;
  static constexpr int QK_HEAD_DIM = 6, V_HEAD_DIM = 6;
  using Norm = PostNorm;
  using Activation = Relu;
};

// RmsNorm in the Norm slot (blocks and the final norm), pre- and post-norm.
struct TinyRmsPre : TinyPre {
  template <int D, class Be>
  using NormLayer = RmsNorm<D, Be>;
};
struct TinyRmsPost : TinyPost {
  template <int D, class Be>
  using NormLayer = RmsNorm<D, Be>;
};

// Llama's choices: RmsNorm, SwiGLU, no biases in the projections, rotary
// positions, pre-norm.
struct TinyLlama : TinyRmsPre {
  using Activation = SwiGlu;
  using Positions = Rope;
  static constexpr bool BIAS = false;
};
// Grouped-query attention: four query heads sharing two key/value heads.
struct TinyGqa : TinyPre {
  static constexpr int N_HEADS = 4, N_KV_HEADS = 2;
};

// Rotary positions alone.
struct TinyRope : TinyPre {
  using Positions = Rope;
};

// Llama's block at a given shape, as a static configuration: pre-norm
// RMSNorm, SwiGLU, rotary positions, no biases, no dropout.
template <int T, int D, int H, int KV, int L, int FF>
struct LlamaShape {
  static constexpr int MAX_T = T, D_MODEL = D, N_HEADS = H, N_KV_HEADS = KV, N_LAYERS = L, D_FF = FF;
  static constexpr float DROPOUT = 0.0f;
  static constexpr bool BIAS = false;
  using Norm = PreNorm;
  template <int W, class Be>
  using NormLayer = RmsNorm<W, Be>;
  using Activation = SwiGlu;
  using Positions = Rope;
};

// Static configurations of some shipped presets (presets.hpp's values: the
// tests check the two agree), for the static-against-Dynamic comparisons.
struct ShakespeareSmallStatic {
  static constexpr const char* NAME = "shakespeare-small";
  static constexpr int MAX_T = 32, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 4, D_FF = 256;
  using Norm = PreNorm;
  using Activation = Relu;
  using Positions = Learned;
};
struct Sst2Static {
  static constexpr const char* NAME = "sst2";
  static constexpr int MAX_T = 64, D_MODEL = 128, N_HEADS = 4, N_LAYERS = 2, D_FF = 512;
  static constexpr float DROPOUT = 0.1f;
  using Norm = PostNorm;
  using Activation = Relu;
  using Positions = Learned;
};
struct ImdbStatic {
  static constexpr const char* NAME = "imdb";
  static constexpr int MAX_T = 512, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 2, D_FF = 256;
  static constexpr float DROPOUT = 0.1f;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};
struct TranslatorTinyStatic {
  static constexpr const char* NAME = "tiny";
  static constexpr int MAX_T = 24, D_MODEL = 32, N_HEADS = 2, N_LAYERS = 1, D_FF = 64;
  using Norm = PreNorm;
  using Activation = Relu;
  using Positions = Sinusoidal;
};

}  // namespace xfmr::test
