// translation_models.cpp: the Seq2Seq model on CUDA, float32 and bfloat16
// activations, every size and every part Dynamic (AnyParts)
// (models/translation_model.hpp).
#include "xfmr/backend/cuda.hpp"
#include "xfmr/models/translation_model.hpp"

namespace xfmr {
#define XFMR_TRANSLATION(F, Be) XFMR_TRANSLATION_FAMILY(template, F, Be)
XFMR_TRANSLATION_FAMILIES(XFMR_TRANSLATION, CudaBackend)
XFMR_TRANSLATION_FAMILIES(XFMR_TRANSLATION, CudaBf16Backend)
}  // namespace xfmr
