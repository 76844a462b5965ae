// ops_avx512.cpp: the CPU families' float operations (backend/cpu/ops.hpp)
// compiled for x86-64-v4 (AVX-512 F, BW, CD, DQ, VL): Eigen's 16-wide
// packets, GCC's AVX-512 loops. Its copy of every template, xfmr's and Eigen's, is in
// namespaces of its own (ops_avx512, xfmr_eigen_avx512), so the linker never
// takes one level's copy for another's (level_objects_share_no_symbols).
#define Eigen xfmr_eigen_avx512
#define XFMR_CPU_OPS_NS ops_avx512
#include "xfmr/backend/cpu/ops.hpp"

#include "kernels/levels.hpp"

namespace xfmr::detail {

const CpuOps<float>* avx512_ops() {
  static const CpuOps<float> table = ops<float>(CpuLevel::avx512);
  return &table;
}

}  // namespace xfmr::detail
