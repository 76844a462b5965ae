// presets.hpp: the closed list of character-LM configurations xfmr-charlm
// offers. Each is a compile-time configuration; with_lm_preset() maps a
// user's --model onto one, or fails naming the choices.
#pragma once

#include <string>

#include "xfmr/blocks/residual.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/positional.hpp"

namespace xfmr::examples {

// "a, b, c": the NAMEs of a closed preset list.
template <class... Presets>
std::string preset_names() {
  std::string s;
  ((s += (s.empty() ? "" : ", ") + std::string(Presets::NAME)), ...);
  return s;
}

// Calls f.template operator()<P>() for the preset P named `name`, or fails
// naming the choices.
template <class... Presets, class F>
void with_preset(const std::string& name, F&& f) {
  const bool found = ((name == Presets::NAME ? (f.template operator()<Presets>(), true) : false) || ...);
  if (!found) detail::fail("unknown model '", name, "' (choose from ", preset_names<Presets...>(), ")");
}

// For smoke tests and quick demonstrations.
struct LmTiny {
  static constexpr const char* NAME = "tiny";
  static constexpr int MAX_T = 16, D_MODEL = 32, N_HEADS = 2, N_LAYERS = 2, D_FF = 64;
  static constexpr float DROPOUT = 0.1f;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};

// Seed 002 (the "let's build GPT" character model): D64 H4 L4 T32 FF256.
struct ShakespeareSmall {
  static constexpr const char* NAME = "shakespeare-small";
  static constexpr int MAX_T = 32, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 4, D_FF = 256;
  static constexpr float DROPOUT = 0.0f;
  using Norm = PreNorm;
  using Activation = Relu;
  using Positions = Learned;
};

// shakespeare-small's shape as Llama builds it: RMSNorm, rotary positions,
// SwiGLU and no biases; D_FF 176 for three feed-forward matrices keeps the
// parameter count within 0.4% of shakespeare-small's (209,665 against
// 210,497 for 65 characters).
struct ShakespeareLlama {
  static constexpr const char* NAME = "shakespeare-llama";
  static constexpr int MAX_T = 32, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 4, D_FF = 176;
  static constexpr float DROPOUT = 0.0f;
  static constexpr bool BIAS = false;
  using Norm = PreNorm;
  template <int D, class Be>
  using NormLayer = RmsNorm<D, Be>;
  using Activation = SwiGlu;
  using Positions = Rope;
};

// Seed 000 (makemore-style names): a context long enough for any name.
struct Names {
  static constexpr const char* NAME = "names";
  static constexpr int MAX_T = 16, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 4, D_FF = 256;
  static constexpr float DROPOUT = 0.0f;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};

// Between the two Shakespeare models (the benchmark's middle size).
struct ShakespeareMid {
  static constexpr const char* NAME = "shakespeare-mid";
  static constexpr int MAX_T = 128, D_MODEL = 128, N_HEADS = 4, N_LAYERS = 4, D_FF = 512;
  static constexpr float DROPOUT = 0.0f;
  using Norm = PreNorm;
  using Activation = Relu;
  using Positions = Learned;
};

// Seed 002's scaled-up model: D384 H6 L6 T256, dropout 0.2.
struct ShakespeareLarge {
  static constexpr const char* NAME = "shakespeare-large";
  static constexpr int MAX_T = 256, D_MODEL = 384, N_HEADS = 6, N_LAYERS = 6, D_FF = 1536;
  static constexpr float DROPOUT = 0.2f;
  using Norm = PreNorm;
  using Activation = Relu;
  using Positions = Learned;
};

// GPT-2 small's shape (D768 H12 L12 T1024), for the GPU benchmark.
struct Gpt2Small {
  static constexpr const char* NAME = "gpt2-small";
  static constexpr int MAX_T = 1024, D_MODEL = 768, N_HEADS = 12, N_LAYERS = 12, D_FF = 3072;
  static constexpr float DROPOUT = 0.0f;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};

inline std::string lm_preset_names() {
  return preset_names<LmTiny, ShakespeareSmall, Names, ShakespeareMid, ShakespeareLarge, Gpt2Small>();
}
template <class F>
void with_lm_preset(const std::string& name, F&& f) {
  with_preset<LmTiny, ShakespeareSmall, ShakespeareLlama, Names, ShakespeareMid, ShakespeareLarge, Gpt2Small>(name, f);
}

}  // namespace xfmr::examples

namespace xfmr::examples {

// Classifier configurations for xfmr-classify.
struct ClassifierTiny {
  static constexpr const char* NAME = "tiny";
  static constexpr int MAX_T = 32, D_MODEL = 32, N_HEADS = 2, N_LAYERS = 1, D_FF = 64;
  static constexpr float DROPOUT = 0.1f;
  using Norm = PostNorm;
  using Activation = Relu;
  using Positions = Learned;
};

// Seed 004's sentiment model: post-norm encoder, mean pooling over words.
struct Sst2 {
  static constexpr const char* NAME = "sst2";
  static constexpr int MAX_T = 64, D_MODEL = 128, N_HEADS = 4, N_LAYERS = 2, D_FF = 512;
  static constexpr float DROPOUT = 0.1f;
  using Norm = PostNorm;
  using Activation = Relu;
  using Positions = Learned;
};

// Long reviews (IMDb: about 230 words on average): 512 tokens, a narrow
// model, mean pooling; the vocabulary is capped by the recipe (RESULTS.md).
struct Imdb {
  static constexpr const char* NAME = "imdb";
  static constexpr int MAX_T = 512, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 2, D_FF = 256;
  static constexpr float DROPOUT = 0.1f;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};

inline std::string classifier_preset_names() { return preset_names<ClassifierTiny, Sst2, Imdb>(); }
template <class F>
void with_classifier_preset(const std::string& name, F&& f) {
  with_preset<ClassifierTiny, Sst2, Imdb>(name, f);
}

}  // namespace xfmr::examples

namespace xfmr::examples {

// Translator configurations for xfmr-translate (one config for both sides).
struct TranslateTiny {
  static constexpr const char* NAME = "tiny";
  static constexpr int MAX_T = 24, D_MODEL = 32, N_HEADS = 2, N_LAYERS = 1, D_FF = 64;
  static constexpr float DROPOUT = 0.0f;
  using Norm = PreNorm;
  using Activation = Relu;
  using Positions = Sinusoidal;
};

// Seed 001's encoder-decoder scaled to a 2-core machine; sinusoidal
// positions as in seed 003.
struct Multi30k {
  static constexpr const char* NAME = "multi30k";
  static constexpr int MAX_T = 64, D_MODEL = 256, N_HEADS = 4, N_LAYERS = 3, D_FF = 512;
  static constexpr float DROPOUT = 0.1f;
  using Norm = PreNorm;
  using Activation = Relu;
  using Positions = Sinusoidal;
};

inline std::string translate_preset_names() { return preset_names<TranslateTiny, Multi30k>(); }
template <class F>
void with_translate_preset(const std::string& name, F&& f) {
  with_preset<TranslateTiny, Multi30k>(name, f);
}

}  // namespace xfmr::examples
