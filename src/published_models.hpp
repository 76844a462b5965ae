// published_models.hpp: which presets (presets.hpp) each library
// translation unit compiles, for every backend: the published models'
// shapes, one family a file (gpt2_models.cpp, llama_models.cpp and their
// cuda/ twins), and the small presets with make_language_model
// (language_models.cpp), which names the families' Decoders as extern.
//
// XFMR_<FAMILY>_PRESETS(X) calls X(Preset) for each of the family's.
#pragma once

#include <cstdint>
#include <memory>

#include "xfmr/models/language_model.hpp"

#define XFMR_GPT2_PRESETS(X) X(Distilgpt2) X(Gpt2Small) X(Gpt2Medium)
#define XFMR_LLAMA_PRESETS(X) X(Stories15M) X(Stories42M) X(Stories110M) X(SmolLM135M)

// make_decoder_model<presets::P, Be>, declared extern or instantiated.
#define XFMR_DECODER_MODEL(KEYWORDS, P, Be) \
  KEYWORDS std::unique_ptr<LanguageModel<Be>> make_decoder_model<presets::P, Be>(int, std::uint64_t, const DecoderOptions&);
