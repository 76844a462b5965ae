// cpu_backend_double.cpp: CpuBackend<double>, every family of operations
// (backend/cpu/<family>.hpp), compiled here once: with XFMR_CPU_INSTANTIATE,
// each family's XFMR_CPU_FAMILY line instantiates it for double where every
// other translation unit declares it instantiated elsewhere.
#define XFMR_CPU_INSTANTIATE double
#include "xfmr/backend/cpu.hpp"
