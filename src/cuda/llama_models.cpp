// llama_models.cpp: the Llama family's Decoder on CUDA, float32 and
// bfloat16 activations, every size Dynamic (models/language_model.hpp).
#include "xfmr/backend/cuda.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {
XFMR_LANGUAGE_MODEL_FAMILY(template, Llama, CudaBackend)
XFMR_LANGUAGE_MODEL_FAMILY(template, Llama, CudaBf16Backend)
}  // namespace xfmr
