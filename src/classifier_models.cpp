// classifier_models.cpp: the classifier families' Classifiers on the CPU,
// every size Dynamic (models/classifier_model.hpp).
#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/classifier_model.hpp"

namespace xfmr {
#define XFMR_CLASSIFIER(F, Be) XFMR_CLASSIFIER_FAMILY(template, F, Be)
XFMR_CLASSIFIER_FAMILIES(XFMR_CLASSIFIER, CpuBackend<float>)
}  // namespace xfmr
