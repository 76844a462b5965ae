// language_models.cpp: make_language_model on the CPU, and the small
// presets' Decoders it builds; the published models' shapes compile in
// gpt2_models.cpp and llama_models.cpp (published_models.hpp).
#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/language_model.hpp"
#include "published_models.hpp"

namespace xfmr {
#define XFMR_EXTERN(P) XFMR_DECODER_MODEL(extern template, P, CpuBackend<float>)
XFMR_GPT2_PRESETS(XFMR_EXTERN)
XFMR_LLAMA_PRESETS(XFMR_EXTERN)
#undef XFMR_EXTERN
template std::unique_ptr<LanguageModel<CpuBackend<float>>> make_language_model(std::string_view, int, std::uint64_t,
                                                                               const DecoderOptions&);
}  // namespace xfmr
