// presets.hpp: a model's architecture (PresetInfo: ModelDims's sizes,
// knobs and parts, a name, a dropout rate), the architectures xfmr ships as
// named values of it, and the configurations of Dynamic parts the library
// compiles.
//
// The shipped presets form three closed lists, one a kind of model:
//   LanguageModelPresets  (LanguageModel; xfmr-charlm, xfmr-lm, xfmr-bench)   tiny, shakespeare-small,
//                         shakespeare-llama, names, shakespeare-mid, shakespeare-large, and the
//                         published shapes: distilgpt2, gpt2-small, gpt2-medium, stories15m,
//                         stories42m, stories110m, smollm-135m
//   ClassifierPresets     (ClassifierModel; xfmr-classify)      tiny, sst2, imdb
//   TranslatorPresets     (TranslationModel; xfmr-translate)    tiny, multi30k
// A list answers by name at run time: names() and list() for a --help text,
// info(name) for the architecture (an unknown name is an xfmr::Error naming
// the choices), all() for the values:
//
//   auto model = xfmr::make_language_model<Be>(xfmr::LanguageModelPresets::info("shakespeare-small"), V, seed);
//
// A static configuration (core/config.hpp: sizes and parts as a struct's
// constants and types) describes an architecture at compile time for those
// who want the compiler to check it; preset_info<Cfg>() is its PresetInfo.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "xfmr/blocks/residual.hpp"
#include "xfmr/core/config.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/any_norm.hpp"
#include "xfmr/layers/positional.hpp"
#include "xfmr/layers/rms_norm.hpp"

namespace xfmr {

// A model's architecture: its sizes, knobs and parts (ModelDims, the one
// description of them), with a name and a dropout rate (a configuration
// without a NAME is "custom", without a DROPOUT 0). The presets are named
// values of it (LanguageModelPresets and the others below), a checkpoint
// records it (io/architecture.hpp's JSON), and make_language_model builds
// a LanguageModel of any of it (its parts chosen at run time: AnyParts).
struct PresetInfo : ModelDims {
  std::string name = "custom";
  float dropout = 0.0f;

  // "D64 H4 L4 T32 FF256" (and "KV2" for grouped-query attention).
  std::string shape() const {
    std::string s = "D" + std::to_string(d_model) + " H" + std::to_string(n_heads);
    if (kv_heads() != n_heads) s += " KV" + std::to_string(kv_heads());
    return s + " L" + std::to_string(n_layers) + " T" + std::to_string(max_t) + " FF" + std::to_string(d_ff);
  }
  // "pre-norm layer-norm gelu learned": the parts, as they are named.
  std::string parts_name() const {
    return std::string(parts.pre_norm ? "pre-norm " : "post-norm ") + (parts.rms_norm ? "rms-norm " : "layer-norm ") +
           std::string(parts.activation_name()) + " " + std::string(parts.positions_name());
  }
  const ModelDims& dims() const { return *this; }
  // The sizes and knobs of d (key/value heads explicit), the parts and name kept.
  PresetInfo with_dims(const ModelDims& d) const {
    PresetInfo p = *this;
    const ModelParts keep = parts;
    static_cast<ModelDims&>(p) = d;
    p.parts = keep;
    p.n_kv_heads = d.kv_heads();
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

// Whether a configuration's parts are chosen at run time (AnyParts').
template <class Cfg>
constexpr bool has_dynamic_parts() {
  return std::is_same_v<typename Cfg::Norm, DynamicNorm>;
}

// A configuration's architecture; dims (default: the configuration's own)
// for a Dynamic one's sizes.
template <BlockConfig Cfg>
PresetInfo preset_info(const ModelDims& dims = model_dims<Cfg>()) {
  PresetInfo p;
  if constexpr (requires { Cfg::NAME; }) p.name = Cfg::NAME;
  if constexpr (requires { Cfg::DROPOUT; }) p.dropout = float(Cfg::DROPOUT);
  p.parts.pre_norm = std::is_same_v<typename Cfg::Norm, PreNorm>;
  p.parts.rms_norm = detail::rms_norm<Cfg>();
  if constexpr (!has_dynamic_parts<Cfg>()) {
    p.parts.activation = ModelParts::activation_named(Cfg::Activation::name);
    p.parts.positions = ModelParts::positions_named(detail::positions_tag<Cfg>::type::name);
  }
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


// A list of named architectures, the shipped presets of one kind of model:
// Table::all() is their values. names() and list() for a --help text,
// info(name) for the architecture (an unknown name is an xfmr::Error naming
// the choices).
template <class Table>
struct PresetList {
  static std::span<const PresetInfo> all() { return Table::all(); }
  static std::vector<std::string_view> names() {
    std::vector<std::string_view> out;
    for (const PresetInfo& p : all()) out.emplace_back(p.name);
    return out;
  }
  // "a, b, c": the names, for --help and errors.
  static std::string list() {
    std::string s;
    for (const PresetInfo& p : all()) (s += s.empty() ? "" : ", ") += p.name;
    return s;
  }
  static bool contains(std::string_view name) {
    for (const PresetInfo& p : all())
      if (p.name == name) return true;
    return false;
  }
  static PresetInfo info(std::string_view name) {
    for (const PresetInfo& p : all())
      if (p.name == name) return p;
    detail::fail("unknown model '", name, "' (choose from ", list(), ")");
  }
};

namespace presets {

// An architecture of the given parts and sizes (every knob its default).
inline PresetInfo make(std::string name, float dropout, ModelParts parts, int max_t, int d_model, int n_heads,
                       int n_kv_heads, int n_layers, int d_ff, bool bias = true) {
  PresetInfo p;
  p.name = std::move(name), p.dropout = dropout, p.parts = parts;
  p.max_t = max_t, p.d_model = d_model, p.n_heads = n_heads, p.n_kv_heads = n_kv_heads, p.n_layers = n_layers;
  p.d_ff = d_ff, p.bias = bias;
  return p;
}
using Act = ModelParts::Activation;
using Pos = ModelParts::Positions;
// GPT's parts (pre-norm LayerNorm, learned positions) with an activation;
// Llama's (pre-norm RMSNorm, SwiGLU, rotary positions, no biases, no dropout).
inline ModelParts gpt(Act a) { return {.pre_norm = true, .rms_norm = false, .activation = a, .positions = Pos::learned}; }
inline PresetInfo llama(std::string name, int max_t, int d, int h, int kv, int layers, int ff) {
  return make(std::move(name), 0.0f, {.pre_norm = true, .rms_norm = true, .activation = Act::swiglu, .positions = Pos::rope},
              max_t, d, h, kv, layers, ff, false);
}

// Language models (LanguageModel) -------------------------------------------
struct LanguageModelTable {
  static std::span<const PresetInfo> all() {
    static const std::vector<PresetInfo> presets = {
        // For smoke tests and quick demonstrations.
        make("tiny", 0.1f, gpt(Act::gelu), 16, 32, 2, 2, 2, 64),
        // Seed 002 (the "let's build GPT" character model).
        make("shakespeare-small", 0.0f, gpt(Act::relu), 32, 64, 4, 4, 4, 256),
        // shakespeare-small's shape as Llama builds it; D_FF 176 for three
        // feed-forward matrices keeps the parameter count within 0.4% of
        // shakespeare-small's (209,665 against 210,497 for 65 characters).
        llama("shakespeare-llama", 32, 64, 4, 4, 4, 176),
        // Seed 000 (makemore-style names): a context long enough for any name.
        make("names", 0.0f, gpt(Act::gelu), 16, 64, 4, 4, 4, 256),
        // Between the two Shakespeare models (the benchmark's middle size).
        make("shakespeare-mid", 0.0f, gpt(Act::relu), 128, 128, 4, 4, 4, 512),
        // Seed 002's scaled-up model, dropout 0.2.
        make("shakespeare-large", 0.2f, gpt(Act::relu), 256, 384, 6, 6, 6, 1536),
        // Published models' shapes (io/gpt2.hpp, io/hf_llama.hpp, io/llama2c.hpp
        // load and save them; a checkpoint's config is named after the one of
        // its architecture). No dropout: they load for decoding and
        // fine-tuning (--dropout adds it). Hugging Face's distilgpt2 (82M).
        make("distilgpt2", 0.0f, gpt(Act::gelu), 1024, 768, 12, 12, 6, 3072),
        // GPT-2 small (124M): GPT-2 checkpoints, the GPU benchmark.
        make("gpt2-small", 0.0f, gpt(Act::gelu), 1024, 768, 12, 12, 12, 3072),
        // OpenAI's gpt2-medium (355M).
        make("gpt2-medium", 0.0f, gpt(Act::gelu), 1024, 1024, 16, 16, 24, 4096),
        // llama2.c's TinyStories models (its README's table; D_FF as its
        // model.py rounds 8/3 D up to a multiple of 32), vocabulary 32,000.
        llama("stories15m", 256, 288, 6, 6, 6, 768),
        llama("stories42m", 1024, 512, 8, 8, 8, 1376),
        llama("stories110m", 1024, 768, 12, 12, 12, 2048),
        // Hugging Face's SmolLM-135M: 9 query and 3 key/value heads, tied
        // embeddings, vocabulary 49,152.
        llama("smollm-135m", 2048, 576, 9, 3, 30, 1536),
    };
    return presets;
  }
};

// Classifiers (ClassifierModel) ---------------------------------------------
struct ClassifierTable {
  static std::span<const PresetInfo> all() {
    const ModelParts post_relu{.pre_norm = false, .rms_norm = false, .activation = Act::relu, .positions = Pos::learned};
    static const std::vector<PresetInfo> presets = {
        make("tiny", 0.1f, post_relu, 32, 32, 2, 2, 1, 64),
        // Seed 004's sentiment model: post-norm encoder, mean pooling over words.
        make("sst2", 0.1f, post_relu, 64, 128, 4, 4, 2, 512),
        // Long reviews (IMDb: about 230 words on average): 512 tokens, a narrow
        // model; the vocabulary is capped by the recipe (RESULTS.md).
        make("imdb", 0.1f, gpt(Act::gelu), 512, 64, 4, 4, 2, 256),
    };
    return presets;
  }
};

// Translators (TranslationModel; one architecture for both sides) ----------
struct TranslatorTable {
  static std::span<const PresetInfo> all() {
    const ModelParts sinusoidal{.pre_norm = true, .rms_norm = false, .activation = Act::relu,
                                .positions = Pos::sinusoidal};
    static const std::vector<PresetInfo> presets = {
        make("tiny", 0.0f, sinusoidal, 24, 32, 2, 2, 1, 64),
        // Seed 001's encoder-decoder scaled to a 2-core machine; sinusoidal
        // positions as in seed 003.
        make("multi30k", 0.1f, sinusoidal, 64, 256, 4, 4, 3, 512),
    };
    return presets;
  }
};

}  // namespace presets

// The shipped presets: named values of the architecture (PresetInfo).
using LanguageModelPresets = PresetList<presets::LanguageModelTable>;
using ClassifierPresets = PresetList<presets::ClassifierTable>;
using TranslatorPresets = PresetList<presets::TranslatorTable>;

// The name of the LanguageModelPresets preset whose parts, sizes and knobs
// are p's (a published shape keeps its preset's name: --help lists them),
// else `otherwise`.
inline std::string preset_name_of(const PresetInfo& p, std::string otherwise) {
  for (const PresetInfo& known : LanguageModelPresets::all())
    if (known.dims() == p.dims()) return known.name;
  return otherwise;
}

// The one model make_language_model (and make_classifier,
// make_translation_model) compiles: every part Dynamic.
namespace families {
using Any = AnyParts;
}  // namespace families

// `arch`, whose parts must be Cfg's: what a family's model is built to
// (a configuration of Dynamic parts takes any).
template <class Cfg>
const PresetInfo& checked_parts(const PresetInfo& arch) {
  if constexpr (has_dynamic_parts<Cfg>()) return arch;
  const PresetInfo own = preset_info<Cfg>();
  require(arch.parts == own.parts, "the architecture '", arch.name, "' (", arch.parts_name(),
          ") is not this model's (", own.parts_name(), ")");
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
      const PresetInfo own = preset_info<F>();
      if (!model && own.parts == arch.parts) model = make.template operator()<F>();
      have += (have.empty() ? "" : "; ") + own.parts_name();
    }
  };
  [&]<class... F>(std::tuple<F...>*) { (one.template operator()<F>(), ...); }(static_cast<Families*>(nullptr));
  require(model != nullptr, "the architecture '", arch.name, "' has parts (", arch.parts_name(),
          ") that no compiled family has (", have, ")");
  return model;
}
}  // namespace detail

}  // namespace xfmr
