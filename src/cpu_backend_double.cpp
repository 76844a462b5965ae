// cpu_backend_double.cpp: CpuBackend<double>, its families' classes
// (backend/cpu/<family>.hpp) and their operations (backend/cpu/ops.hpp),
// compiled here once, where every other translation unit declares them
// instantiated elsewhere; double_ops() is the one table of double's
// operations, portable (gradient checks need no level).
#include "xfmr/backend/cpu.hpp"

namespace xfmr {

XFMR_CPU_BACKEND_INSTANTIATE(double);

const detail::CpuOps<double>& detail::double_ops() {
  static const CpuOps<double> table = ops<double>(CpuLevel::portable);
  return table;
}

}  // namespace xfmr
