// classifier_models.cpp: the Classifier on the CPU, every size and every
// part Dynamic (AnyParts) (models/classifier_model.hpp).
#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/classifier_model.hpp"

namespace xfmr {
#define XFMR_CLASSIFIER(F, Be) XFMR_CLASSIFIER_FAMILY(template, F, Be)
XFMR_CLASSIFIER_FAMILIES(XFMR_CLASSIFIER, CpuBackend<float>)
}  // namespace xfmr
