// presets.hpp: the configurations xfmr ships, as types, and the run-time
// registry that maps a name onto one.
//
// A preset is a configuration (core/config.hpp) with a NAME and a DROPOUT.
// The shipped ones form three closed lists, one a model family:
//   LanguageModelPresets  (Decoder; xfmr-charlm, xfmr-lm, xfmr-bench)   tiny, shakespeare-small,
//                         shakespeare-llama, names, shakespeare-mid, shakespeare-large, and the
//                         published shapes: distilgpt2, gpt2-small, gpt2-medium, stories15m,
//                         stories42m, stories110m, smollm-135m
//   ClassifierPresets     (Classifier; xfmr-classify)          tiny, sst2, imdb
//   TranslatorPresets     (Seq2Seq; xfmr-translate)            tiny, multi30k
// A list answers by name at run time: names() and list() for a --help text,
// info(name) for the shape, and with(name, f), which calls
// f.template operator()<Preset>() or throws xfmr::Error naming the choices:
//
//   xfmr::LanguageModelPresets::with(name, [&]<class Cfg>() { xfmr::Decoder<Cfg, Be> model(V, seed); ... });
//
// make_language_model (models/language_model.hpp) does exactly that for
// the language models, compiled once in the library.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "xfmr/blocks/residual.hpp"
#include "xfmr/core/config.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/any_norm.hpp"
#include "xfmr/layers/positional.hpp"
#include "xfmr/layers/rms_norm.hpp"

namespace xfmr {

// A configuration's shape, parts and knobs at run time: a model's
// architecture (a configuration without a NAME is "custom", without a
// DROPOUT 0). make_language_model builds a LanguageModel of any
// architecture (its parts chosen at run time: AnyParts).
struct PresetInfo {
  std::string name = "custom";
  int max_t = 0, d_model = 0, n_heads = 0, n_kv_heads = 0, n_layers = 0, d_ff = 0;
  float dropout = 0.0f;
  bool pre_norm = true, rms_norm = false, gated = false, bias = true;
  std::string_view activation = "gelu", positions = "learned";
  // Knobs (ModelDims's): head widths (0: d_model / n_heads), the norms'
  // epsilon, rotary theta and scaling, biases on q/k/v without `bias`.
  int qk_head_dim = 0, v_head_dim = 0;
  double norm_eps = 1e-5, rope_theta = 10000.0;
  RopeScaling rope_scaling{};
  bool qkv_bias = false;

  // "D64 H4 L4 T32 FF256" (and "KV2" for grouped-query attention).
  std::string shape() const {
    std::string s = "D" + std::to_string(d_model) + " H" + std::to_string(n_heads);
    if (n_kv_heads != n_heads) s += " KV" + std::to_string(n_kv_heads);
    return s + " L" + std::to_string(n_layers) + " T" + std::to_string(max_t) + " FF" + std::to_string(d_ff);
  }
  // "pre-norm layer-norm gelu learned": the parts, as a family names them.
  std::string parts() const {
    return std::string(pre_norm ? "pre-norm " : "post-norm ") + (rms_norm ? "rms-norm " : "layer-norm ") +
           std::string(activation) + " " + std::string(positions);
  }
  // The parts as ModelParts: what a model of Dynamic parts is built with.
  ModelParts model_parts() const {
    ModelParts m;
    m.pre_norm = pre_norm, m.rms_norm = rms_norm;
    using Act = ModelParts::Activation;
    using Pos = ModelParts::Positions;
    m.activation = activation == "relu"     ? Act::relu
                   : activation == "gelu"   ? Act::gelu
                   : activation == "swiglu" ? Act::swiglu
                   : activation == "geglu"  ? Act::geglu
                                            : (detail::fail("unknown activation '", activation, "'"), Act::gelu);
    m.positions = positions == "learned"      ? Pos::learned
                  : positions == "sinusoidal" ? Pos::sinusoidal
                  : positions == "rope"       ? Pos::rope
                                              : (detail::fail("unknown positions '", positions, "'"), Pos::learned);
    return m;
  }
  ModelDims dims() const {
    ModelDims d;
    d.parts = model_parts();
    d.max_t = max_t, d.d_model = d_model, d.n_heads = n_heads, d.n_kv_heads = n_kv_heads, d.n_layers = n_layers;
    d.d_ff = d_ff, d.qk_head_dim = qk_head_dim, d.v_head_dim = v_head_dim, d.norm_eps = norm_eps;
    d.rope_theta = rope_theta, d.rope_scaling = rope_scaling, d.bias = bias, d.qkv_bias = qkv_bias;
    return d;
  }
  // The sizes and knobs of d, the parts and name kept.
  PresetInfo with_dims(const ModelDims& d) const {
    PresetInfo p = *this;
    p.max_t = d.max_t, p.d_model = d.d_model, p.n_heads = d.n_heads, p.n_kv_heads = d.kv_heads();
    p.n_layers = d.n_layers, p.d_ff = d.d_ff, p.qk_head_dim = d.qk_head_dim, p.v_head_dim = d.v_head_dim;
    p.norm_eps = d.norm_eps, p.rope_theta = d.rope_theta, p.rope_scaling = d.rope_scaling, p.bias = d.bias;
    p.qkv_bias = d.qkv_bias;
    return p;
  }
};

namespace detail {
struct AnyBackend;  // names a norm layer's type without building one
template <class Cfg>
constexpr bool rms_norm() {
  return !std::is_same_v<norm_layer_t<Cfg, Dynamic, AnyBackend>, LayerNorm<Dynamic, AnyBackend>>;
}
}  // namespace detail

// A configuration's architecture; dims (default: the configuration's own)
// for a Dynamic one's sizes.
template <BlockConfig Cfg>
PresetInfo preset_info(const ModelDims& dims = model_dims<Cfg>()) {
  PresetInfo p;
  if constexpr (requires { Cfg::NAME; }) p.name = Cfg::NAME;
  if constexpr (requires { Cfg::DROPOUT; }) p.dropout = float(Cfg::DROPOUT);
  p.pre_norm = std::is_same_v<typename Cfg::Norm, PreNorm>;
  p.rms_norm = detail::rms_norm<Cfg>();
  p.gated = Cfg::Activation::GATED;
  p.activation = Cfg::Activation::name;
  p.positions = detail::positions_tag<Cfg>::type::name;
  return p.with_dims(dims);
}

// DynamicParts<Norm, RMS, Activation, Positions>: a configuration of those
// parts (RMS: RmsNorm, else LayerNorm) with every size Dynamic, the sizes
// and knobs given at construction (ModelDims): one compiled model for every
// shape of a family. dynamic_of_t<Cfg> is the one with Cfg's parts.
template <class Norm_, bool RMS, class Activation_, class Positions_>
struct DynamicParts {
  static constexpr int MAX_T = Dynamic, D_MODEL = Dynamic, N_HEADS = Dynamic, N_KV_HEADS = Dynamic;
  static constexpr int N_LAYERS = Dynamic, D_FF = Dynamic;
  using Norm = Norm_;
  template <int W, class Be>
  using NormLayer = std::conditional_t<RMS, RmsNorm<W, Be>, LayerNorm<W, Be>>;
  using Activation = Activation_;
  using Positions = Positions_;
};

template <BlockConfig Cfg>
using dynamic_of_t = DynamicParts<typename Cfg::Norm, detail::rms_norm<Cfg>(), typename Cfg::Activation,
                                  typename detail::positions_tag<Cfg>::type>;

// AnyParts: every size and every part Dynamic: the norms' place and kind,
// the activation and the positions are the architecture's (ModelParts,
// given at construction with the sizes), so one compiled model serves every
// architecture the layers can build: GPT-2's, Llama's, the 2017
// Transformer's post-norm blocks, GeGLU with sinusoidal positions. The
// same bits as the static parts (each part calls the same operations).
struct AnyParts {
  static constexpr int MAX_T = Dynamic, D_MODEL = Dynamic, N_HEADS = Dynamic, N_KV_HEADS = Dynamic;
  static constexpr int N_LAYERS = Dynamic, D_FF = Dynamic;
  using Norm = DynamicNorm;
  template <int W, class Be>
  using NormLayer = AnyNorm<W, Be>;
  using Activation = DynamicActivation;
  using Positions = DynamicPositions;
};

// Whether a configuration's parts are chosen at run time (AnyParts').
template <class Cfg>
constexpr bool has_dynamic_parts() {
  return std::is_same_v<typename Cfg::Norm, DynamicNorm>;
}

template <class... Presets>
struct PresetList {
  static_assert(sizeof...(Presets) > 0, "a preset list names at least one preset");

  static constexpr std::array<std::string_view, sizeof...(Presets)> names() { return {Presets::NAME...}; }
  // "a, b, c": the names, for --help and errors.
  static std::string list() {
    std::string s;
    for (std::string_view n : names()) (s += s.empty() ? "" : ", ") += n;
    return s;
  }
  static bool contains(std::string_view name) {
    for (std::string_view n : names())
      if (n == name) return true;
    return false;
  }
  static PresetInfo info(std::string_view name) {
    return with(name, []<class P>() { return preset_info<P>(); });
  }
  // f.template operator()<P>() for the preset P named `name`; an unknown
  // name is an xfmr::Error naming the choices.
  template <class F>
  static decltype(auto) with(std::string_view name, F&& f) {
    return dispatch<F, Presets...>(name, f);
  }

 private:
  template <class F, class P, class... Rest>
  static decltype(auto) dispatch(std::string_view name, F& f) {
    if (name == P::NAME) return f.template operator()<P>();
    if constexpr (sizeof...(Rest) > 0) return dispatch<F, Rest...>(name, f);
    else detail::fail("unknown model '", name, "' (choose from ", list(), ")");
  }
};

namespace presets {

// Language models (Decoder) ------------------------------------------------

// For smoke tests and quick demonstrations.
struct Tiny {
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

// Llama's block at a given shape: pre-norm RMSNorm, SwiGLU, rotary
// positions, no biases, no dropout.
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

// shakespeare-small's shape as Llama builds it: RMSNorm, rotary positions,
// SwiGLU and no biases; D_FF 176 for three feed-forward matrices keeps the
// parameter count within 0.4% of shakespeare-small's (209,665 against
// 210,497 for 65 characters).
struct ShakespeareLlama : LlamaShape<32, 64, 4, 4, 4, 176> {
  static constexpr const char* NAME = "shakespeare-llama";
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

// GPT-2 small's shape (D768 H12 L12 T1024): GPT-2 checkpoints, the GPU benchmark.
struct Gpt2Small {
  static constexpr const char* NAME = "gpt2-small";
  static constexpr int MAX_T = 1024, D_MODEL = 768, N_HEADS = 12, N_LAYERS = 12, D_FF = 3072;
  static constexpr float DROPOUT = 0.0f;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};

// Published models' shapes (io/gpt2.hpp, io/hf_llama.hpp, io/llama2c.hpp
// load and save them; a checkpoint's config picks one by its sizes). No
// dropout: they load for decoding and fine-tuning (--dropout adds it).

// GPT-2 family: pre-norm LayerNorm, GELU (tanh), learned positions, biases, T1024.
// Hugging Face's distilgpt2: gpt2's width, 6 layers (82M parameters).
struct Distilgpt2 {
  static constexpr const char* NAME = "distilgpt2";
  static constexpr int MAX_T = 1024, D_MODEL = 768, N_HEADS = 12, N_LAYERS = 6, D_FF = 3072;
  static constexpr float DROPOUT = 0.0f;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};

// OpenAI's gpt2-medium: D1024 H16 L24 (355M parameters).
struct Gpt2Medium {
  static constexpr const char* NAME = "gpt2-medium";
  static constexpr int MAX_T = 1024, D_MODEL = 1024, N_HEADS = 16, N_LAYERS = 24, D_FF = 4096;
  static constexpr float DROPOUT = 0.0f;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};

// Llama family (LlamaShape above).
// llama2.c's TinyStories models (its README's table; D_FF as its model.py
// rounds 8/3 D up to a multiple of 32), vocabulary 32,000.
struct Stories15M : LlamaShape<256, 288, 6, 6, 6, 768> {
  static constexpr const char* NAME = "stories15m";
};
struct Stories42M : LlamaShape<1024, 512, 8, 8, 8, 1376> {
  static constexpr const char* NAME = "stories42m";
};
struct Stories110M : LlamaShape<1024, 768, 12, 12, 12, 2048> {
  static constexpr const char* NAME = "stories110m";
};

// Hugging Face's SmolLM-135M: 30 layers of D576, 9 query and 3 key/value
// heads, tied embeddings, vocabulary 49,152, context 2048.
struct SmolLM135M : LlamaShape<2048, 576, 9, 3, 30, 1536> {
  static constexpr const char* NAME = "smollm-135m";
};

// Classifiers (Classifier) -------------------------------------------------

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

// Translators (Seq2Seq; one configuration for both sides) -------------------

struct TranslatorTiny {
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

}  // namespace presets

using LanguageModelPresets =
    PresetList<presets::Tiny, presets::ShakespeareSmall, presets::ShakespeareLlama, presets::Names,
               presets::ShakespeareMid, presets::ShakespeareLarge, presets::Distilgpt2, presets::Gpt2Small,
               presets::Gpt2Medium, presets::Stories15M, presets::Stories42M, presets::Stories110M,
               presets::SmolLM135M>;
// The name of the LanguageModelPresets preset whose parts, sizes and knobs
// are p's (a published shape keeps its preset's name: --help lists them),
// else `otherwise`.
inline std::string preset_name_of(const PresetInfo& p, std::string otherwise) {
  for (const std::string_view name : LanguageModelPresets::names()) {
    const PresetInfo known = LanguageModelPresets::info(name);
    if (known.parts() == p.parts() && known.dims() == p.dims()) return known.name;
  }
  return otherwise;
}

// The published families' parts as Dynamic configurations (the typed
// formats' checks and readers name them), and Any: every part Dynamic, the
// one model make_language_model compiles (models/language_model.hpp).
namespace families {
using Gpt = DynamicParts<PreNorm, false, Gelu, Learned>;       // GPT-2, tiny, names
using GptRelu = DynamicParts<PreNorm, false, Relu, Learned>;   // the Shakespeare models
using Llama = DynamicParts<PreNorm, true, SwiGlu, Rope>;       // Llama, Qwen2, Mistral, llama2.c
using Any = AnyParts;                                          // every architecture: the one compiled
}  // namespace families

using ClassifierPresets = PresetList<presets::ClassifierTiny, presets::Sst2, presets::Imdb>;
using TranslatorPresets = PresetList<presets::TranslatorTiny, presets::Multi30k>;

// `arch`, whose parts must be Cfg's: what a family's model is built to
// (a configuration of Dynamic parts takes any).
template <class Cfg>
const PresetInfo& checked_parts(const PresetInfo& arch) {
  if constexpr (has_dynamic_parts<Cfg>()) {
    (void)arch.model_parts();  // (known names)
    return arch;
  }
  const PresetInfo own = preset_info<Cfg>();
  require(arch.parts() == own.parts(), "the architecture '", arch.name, "' (", arch.parts(), ") is not this model's (",
          own.parts(), ")");
  return arch;
}

namespace detail {
// make.template operator()<F>() for the family F of the tuple Families
// whose parts are arch's (the models' make_* functions: a model compiled
// once a family); none is an xfmr::Error naming the families there are.
template <class Families, class Make>
auto make_of_family(const PresetInfo& arch, Make&& make) {
  arch.dims().check();
  decltype(make.template operator()<std::tuple_element_t<0, Families>>()) model{};
  std::string have;
  auto one = [&]<class F>() {
    if constexpr (has_dynamic_parts<F>()) {
      if (!model) model = make.template operator()<F>();
      have += (have.empty() ? "" : "; ") + std::string("any parts");
    } else {
      const std::string parts = preset_info<F>().parts();
      if (!model && parts == arch.parts()) model = make.template operator()<F>();
      have += (have.empty() ? "" : "; ") + parts;
    }
  };
  [&]<class... F>(std::tuple<F...>*) { (one.template operator()<F>(), ...); }(static_cast<Families*>(nullptr));
  require(model != nullptr, "the architecture '", arch.name, "' has parts (", arch.parts(),
          ") that no compiled family has (", have, ")");
  return model;
}
}  // namespace detail

}  // namespace xfmr
