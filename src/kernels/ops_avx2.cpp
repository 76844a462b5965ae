// ops_avx2.cpp: the CPU families' float operations (backend/cpu/ops.hpp)
// compiled for x86-64-v3 (AVX2, FMA, F16C): Eigen's 8-wide packets, GCC's AVX2
// loops. Its copy of every template, xfmr's and Eigen's, is in
// namespaces of its own (ops_avx2, xfmr_eigen_avx2), so the linker never
// takes one level's copy for another's (level_objects_share_no_symbols).
#define Eigen xfmr_eigen_avx2
#define XFMR_CPU_OPS_NS ops_avx2
#include "xfmr/backend/cpu/ops.hpp"

#include "kernels/levels.hpp"

namespace xfmr::detail {

const CpuOps<float>* avx2_ops() {
  static const CpuOps<float> table = ops<float>(CpuLevel::avx2);
  return &table;
}

}  // namespace xfmr::detail
