// cpu_backend_float.cpp: CpuBackend<float> and its families' classes
// (backend/cpu/<family>.hpp), compiled here once, where every other
// translation unit declares them instantiated elsewhere. The operations
// they call are compiled once a CPU level, in src/kernels/ops_<level>.cpp.
#include "xfmr/backend/cpu.hpp"

namespace xfmr {

XFMR_CPU_BACKEND_INSTANTIATE(float);

}  // namespace xfmr
