// gpt2_models.cpp: the GPT family's Decoder on the CPU (pre-norm LayerNorm,
// GELU, learned positions: GPT-2 of any size, tiny, names), every size
// Dynamic (models/language_model.hpp).
#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {
XFMR_LANGUAGE_MODEL_FAMILY(template, Gpt, CpuBackend<float>)
}  // namespace xfmr
