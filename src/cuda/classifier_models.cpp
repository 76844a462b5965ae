// classifier_models.cpp: the Classifier on CUDA, float32 and bfloat16
// activations, every size and every part Dynamic (AnyParts)
// (models/classifier_model.hpp).
#include "xfmr/backend/cuda.hpp"
#include "xfmr/models/classifier_model.hpp"

namespace xfmr {
#define XFMR_CLASSIFIER(F, Be) XFMR_CLASSIFIER_FAMILY(template, F, Be)
XFMR_CLASSIFIER_FAMILIES(XFMR_CLASSIFIER, CudaBackend)
XFMR_CLASSIFIER_FAMILIES(XFMR_CLASSIFIER, CudaBf16Backend)
}  // namespace xfmr
