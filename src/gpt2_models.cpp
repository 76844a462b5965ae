// gpt2_models.cpp: the GPT-2 family's Decoders on the CPU (published_models.hpp).
#include "xfmr/backend/cpu.hpp"
#include "published_models.hpp"

namespace xfmr {
#define XFMR_INSTANTIATE(P) XFMR_DECODER_MODEL(template, P, CpuBackend<float>)
XFMR_GPT2_PRESETS(XFMR_INSTANTIATE)
}  // namespace xfmr
