// classifier_models.cpp: the classifier families' Classifiers on CUDA,
// float32 and bfloat16 activations, every size Dynamic
// (models/classifier_model.hpp).
#include "xfmr/backend/cuda.hpp"
#include "xfmr/models/classifier_model.hpp"

namespace xfmr {
#define XFMR_CLASSIFIER(F, Be) XFMR_CLASSIFIER_FAMILY(template, F, Be)
XFMR_CLASSIFIER_FAMILIES(XFMR_CLASSIFIER, CudaBackend)
XFMR_CLASSIFIER_FAMILIES(XFMR_CLASSIFIER, CudaBf16Backend)
}  // namespace xfmr
