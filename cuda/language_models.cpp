// language_models.cpp: make_language_model on CUDA, and the small presets'
// Decoders it builds; the published models' shapes compile in
// gpt2_models.cpp and llama_models.cpp (src/published_models.hpp).
#include "xfmr/backend/cuda.hpp"
#include "xfmr/models/language_model.hpp"
#include "../src/published_models.hpp"

namespace xfmr {
#define XFMR_EXTERN(P) XFMR_DECODER_MODEL(extern template, P, CudaBackend)
XFMR_GPT2_PRESETS(XFMR_EXTERN)
XFMR_LLAMA_PRESETS(XFMR_EXTERN)
#undef XFMR_EXTERN
#define XFMR_EXTERN(P) XFMR_DECODER_MODEL(extern template, P, CudaBf16Backend)
XFMR_GPT2_PRESETS(XFMR_EXTERN)
XFMR_LLAMA_PRESETS(XFMR_EXTERN)
#undef XFMR_EXTERN
template std::unique_ptr<LanguageModel<CudaBackend>> make_language_model(std::string_view, int, std::uint64_t,
                                                                         const DecoderOptions&);
template std::unique_ptr<LanguageModel<CudaBf16Backend>> make_language_model(std::string_view, int, std::uint64_t,
                                                                             const DecoderOptions&);
}  // namespace xfmr
