// language_models.cpp: the GPT family with ReLU's Decoder on CUDA, float32
// and bfloat16 activations, every size Dynamic (models/language_model.hpp).
#include "xfmr/backend/cuda.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {
XFMR_LANGUAGE_MODEL_FAMILY(template, GptRelu, CudaBackend)
XFMR_LANGUAGE_MODEL_FAMILY(template, GptRelu, CudaBf16Backend)
}  // namespace xfmr
