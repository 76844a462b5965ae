// language_models.cpp: the shipped language-model presets' Decoders on the
// CPU, compiled once (models/language_model.hpp).
#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {
template std::unique_ptr<LanguageModel<CpuBackend<float>>> make_language_model(std::string_view, int, std::uint64_t,
                                                                               const DecoderOptions&);
}  // namespace xfmr
