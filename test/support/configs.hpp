// configs.hpp: tiny configurations for gradient checks (double, seconds).
#pragma once

#include "xfmr/blocks/residual.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/positional.hpp"

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

}  // namespace xfmr::test
