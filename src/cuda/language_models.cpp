// language_models.cpp: the language models' Decoder on CUDA, float32 and
// bfloat16 activations, every size and every part Dynamic (families::Any):
// one compiled model for every decoder architecture
// (models/language_model.hpp).
#include "xfmr/backend/cuda.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {
XFMR_LANGUAGE_MODEL_FAMILY(template, Any, CudaBackend)
XFMR_LANGUAGE_MODEL_FAMILY(template, Any, CudaBf16Backend)
}  // namespace xfmr
