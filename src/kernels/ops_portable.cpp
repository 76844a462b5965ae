// ops_portable.cpp: the CPU families' float operations (backend/cpu/ops.hpp)
// compiled with the library's own flags: x86-64's baseline (SSE2) or any other
// processor's, for the CPUs below x86-64-v3. Its copy of every template, xfmr's and Eigen's, is in
// namespaces of its own (ops_portable, xfmr_eigen_portable), so the linker never
// takes one level's copy for another's (level_objects_share_no_symbols).
#define Eigen xfmr_eigen_portable
#define XFMR_CPU_OPS_NS ops_portable
#include "xfmr/backend/cpu/ops.hpp"

#include "kernels/levels.hpp"

namespace xfmr::detail {

const CpuOps<float>* portable_ops() {
  static const CpuOps<float> table = ops<float>(CpuLevel::portable);
  return &table;
}

}  // namespace xfmr::detail
