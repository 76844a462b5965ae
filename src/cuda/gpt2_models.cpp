// gpt2_models.cpp: the GPT family's Decoder on CUDA, float32 and bfloat16
// activations, every size Dynamic (models/language_model.hpp).
#include "xfmr/backend/cuda.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {
XFMR_LANGUAGE_MODEL_FAMILY(template, Gpt, CudaBackend)
XFMR_LANGUAGE_MODEL_FAMILY(template, Gpt, CudaBf16Backend)
}  // namespace xfmr
