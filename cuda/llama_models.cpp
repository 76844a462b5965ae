// llama_models.cpp: the Llama family's Decoders on CUDA, float32 and bfloat16 activations (src/published_models.hpp).
#include "xfmr/backend/cuda.hpp"
#include "../src/published_models.hpp"

namespace xfmr {
#define XFMR_INSTANTIATE(P) XFMR_DECODER_MODEL(template, P, CudaBackend)
XFMR_LLAMA_PRESETS(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE
#define XFMR_INSTANTIATE(P) XFMR_DECODER_MODEL(template, P, CudaBf16Backend)
XFMR_LLAMA_PRESETS(XFMR_INSTANTIATE)
}  // namespace xfmr
