// translation_models.cpp: the Seq2Seq model on the CPU, every size and
// every part Dynamic (AnyParts) (models/translation_model.hpp).
#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/translation_model.hpp"

namespace xfmr {
#define XFMR_TRANSLATION(F, Be) XFMR_TRANSLATION_FAMILY(template, F, Be)
XFMR_TRANSLATION_FAMILIES(XFMR_TRANSLATION, CpuBackend<float>)
}  // namespace xfmr
