// llama_models.cpp: the Llama family's Decoder on the CPU (pre-norm RMSNorm,
// SwiGLU, rotary positions: Llama, Qwen2, Mistral, llama2.c), every size
// Dynamic (models/language_model.hpp).
#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {
XFMR_LANGUAGE_MODEL_FAMILY(template, Llama, CpuBackend<float>)
}  // namespace xfmr
