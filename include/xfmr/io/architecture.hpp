// architecture.hpp: a language model's architecture (PresetInfo: its parts,
// sizes and knobs) in a checkpoint's metadata, so that any xfmr checkpoint
// builds its model again without a preset compiled in for its shape.
//
// architecture_json(p): {"name", "parts": {...}, "dims": {...}} as text.
// architecture_from_json(text, source): the inverse; a field missing or out
//   of range, or a part no family has, is an xfmr::Error naming it.
// language_model_metadata(model): the metadata that records a
//   LanguageModel's architecture ("architecture", and "preset": its name).
// architecture_of(metadata, source): the "architecture" a checkpoint
//   records, or, for one written before it did, its "preset" looked up in
//   LanguageModelPresets.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/presets.hpp"

namespace xfmr {

std::string architecture_json(const PresetInfo& p);
PresetInfo architecture_from_json(std::string_view text, const std::string& source);

template <class Backend>
Metadata language_model_metadata(const LanguageModel<Backend>& model) {
  return {{"architecture", architecture_json(model.preset())}, {"preset", model.preset().name}};
}

PresetInfo architecture_of(const Metadata& metadata, const std::filesystem::path& source);

}  // namespace xfmr
