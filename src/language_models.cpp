// language_models.cpp: the GPT family with ReLU's Decoder on the CPU (the
// Shakespeare models), every size Dynamic (models/language_model.hpp).
#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {
XFMR_LANGUAGE_MODEL_FAMILY(template, GptRelu, CpuBackend<float>)
}  // namespace xfmr
