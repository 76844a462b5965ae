// language_models.cpp: the language models' Decoder on the CPU, every size
// and every part Dynamic (families::Any, presets.hpp's AnyParts): one
// compiled model for every decoder architecture (models/language_model.hpp).
#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {
XFMR_LANGUAGE_MODEL_FAMILY(template, Any, CpuBackend<float>)
}  // namespace xfmr
