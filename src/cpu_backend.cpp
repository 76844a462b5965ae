// cpu_backend.cpp: CpuBackend<float> and CpuBackend<double>, every family of
// operations (backend/cpu/<family>.hpp), compiled here once: with
// XFMR_CPU_INSTANTIATE, each family's XFMR_CPU_FAMILY line instantiates it
// where every other translation unit declares it instantiated elsewhere.
#define XFMR_CPU_INSTANTIATE
#include "xfmr/backend/cpu.hpp"
