// llama_models.cpp: the Llama family's Decoders on CUDA (src/published_models.hpp).
#include "xfmr/backend/cuda.hpp"
#include "../src/published_models.hpp"

namespace xfmr {
#define XFMR_INSTANTIATE(P) XFMR_DECODER_MODEL(template, P, CudaBackend)
XFMR_LLAMA_PRESETS(XFMR_INSTANTIATE)
}  // namespace xfmr
