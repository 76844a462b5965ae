// cpu_backend_float.cpp: CpuBackend<float>, every family of operations
// (backend/cpu/<family>.hpp), compiled here once: with XFMR_CPU_INSTANTIATE,
// each family's XFMR_CPU_FAMILY line instantiates it for float where every
// other translation unit declares it instantiated elsewhere.
#define XFMR_CPU_INSTANTIATE float
#include "xfmr/backend/cpu.hpp"
