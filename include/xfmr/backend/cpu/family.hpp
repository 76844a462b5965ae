// family.hpp: how CpuBackend<S> (cpu.hpp) is put together, and its options.
//
// Each family of operations, the CPU side of one layer family, lives in
// backend/cpu/<family>.hpp, named as its layer and its CUDA file
// (cuda/<family>.cu): a class template CpuXxx<S>, one of CpuBackend's public
// bases, whose members state the contract and forward to the operations
// themselves: function templates of the scalar type in xfmr::detail's inline
// namespace XFMR_CPU_OPS_NS, below them in the same file. The operations
// are compiled once for each instruction-set level (src/kernels/ops_*.cpp,
// float) and once more for double (src/cpu_backend_double.cpp), each level
// in a namespace of its own (ops_portable, ops_avx2, ops_avx512, with a copy
// of Eigen's templates of its own), and CpuOps<S> (cpu/ops.hpp) is the table
// of one copy: cpu_ops<S>() gives float the level the CPU runs
// (cpu/kernels.hpp decides it, with the row kernels), double the portable
// one. So a build for any x86-64 runs the families' Eigen expressions and
// loops with AVX2 or AVX-512 where the processor has them, whatever the
// flags of the program that includes these headers.
//
// XFMR_CPU_FAMILY(CpuXxx) at the end of a family's file declares CpuXxx<float>
// and CpuXxx<double> explicitly instantiated elsewhere (extern template): in
// src/cpu_backend_float.cpp and src/cpu_backend_double.cpp
// (XFMR_CPU_BACKEND_INSTANTIATE, cpu.hpp). A family that reads CpuOptions
// takes them in its constructor.
#pragma once

#include <type_traits>

namespace xfmr {

struct CpuOptions {
  // bf16 mixed precision (float only): every matrix product rounds its
  // operands to bfloat16 and sums in float32 (bf16.hpp; needs
  // bf16::available()), attention's score and context products included
  // (attention.hpp; its row-by-row kernels stay float32); the weights, the
  // activations between products and every other operation stay float32.
  bool bf16 = false;
  // bf16 weights (float only; a LoRA run's frozen base): products whose
  // weight has a bf16 copy (WeightCopies) read it, in either orientation
  // (the forward's x W^T, the backward's dy W); every other product
  // (attention's, the adapters') and operation stays float32.
  bool bf16_weights = false;
  // int8 precision (float only; decoding): products whose weight has an int8
  // copy (WeightCopies, infer/weight_copies.hpp) read it, a scale a row
  // (int8_products.hpp); every other product and operation stays float32.
  // Training every weight does not run in it (its weights change every
  // step); a LoRA run's frozen base does (make_frozen_base_backend).
  bool int8 = false;
  // 4-bit precision (float only; decoding): products whose weight has a
  // 4-bit copy read it, blocks of 32 weights with a scale each
  // (q4_products.hpp; through the weight untransposed, the 4-bit weights
  // widened); every other product and operation stays float32. Training
  // every weight does not run in it; a LoRA run's frozen base does.
  bool q4 = false;
};

}  // namespace xfmr

// The namespace this translation unit's operations are compiled in; a level's
// file of src/kernels/ names its own before it includes anything.
#ifndef XFMR_CPU_OPS_NS
#define XFMR_CPU_OPS_NS ops_portable
#endif

namespace xfmr::detail {

template <class S>
struct CpuOps;  // cpu/ops.hpp
// The operations in use: float's at the level cpu_kernels() runs, double's
// portable (src/kernels/levels.cpp, src/cpu_backend_double.cpp).
const CpuOps<float>& float_ops();
const CpuOps<double>& double_ops();
template <class S>
const CpuOps<S>& cpu_ops() {
  if constexpr (std::is_same_v<S, float>) return float_ops();
  else return double_ops();
}

}  // namespace xfmr::detail

#define XFMR_CPU_FAMILY(Family)        \
  extern template class Family<float>; \
  extern template class Family<double>
