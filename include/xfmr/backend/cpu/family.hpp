// family.hpp: how CpuBackend<S> (cpu.hpp) is put together, and its options.
//
// Each family of operations, the CPU side of one layer family, lives in
// backend/cpu/<family>.hpp, named as its layer and its CUDA file
// (cuda/<family>.cu): a class template CpuXxx<S>, one of CpuBackend's public
// bases. Its members are declared in the class, with their contract, and
// defined out of line below it; XFMR_CPU_FAMILY(CpuXxx) at the end of the
// file declares CpuXxx<float> and CpuXxx<double> explicitly instantiated
// elsewhere (extern template). So the definitions, and Eigen's kernels, are
// compiled once, in src/cpu_backend_float.cpp and src/cpu_backend_double.cpp
// (each defines XFMR_CPU_INSTANTIATE as its scalar type before it includes
// cpu.hpp, turning each declaration into that type's instantiation); every
// other translation unit calls them. A family that reads CpuOptions takes
// them in its constructor.
#pragma once

namespace xfmr {

struct CpuOptions {
  // bf16 mixed precision (float only): every matrix product rounds its
  // operands to bfloat16 and sums in float32 (bf16.hpp; needs
  // bf16::available()), attention's score and context products included
  // (attention.hpp; its row-by-row kernels stay float32); the weights, the
  // activations between products and every other operation stay float32.
  bool bf16 = false;
  // int8 precision (float only; decoding): products whose weight has an int8
  // copy (WeightCopies, infer/weight_copies.hpp) read it, a scale a row
  // (int8_products.hpp); every other product and operation stays float32.
  // Training does not run in it: its weights change every step.
  bool int8 = false;
};

}  // namespace xfmr

#ifdef XFMR_CPU_INSTANTIATE
#define XFMR_CPU_FAMILY(Family) template class Family<XFMR_CPU_INSTANTIATE>
#else
#define XFMR_CPU_FAMILY(Family)        \
  extern template class Family<float>; \
  extern template class Family<double>
#endif
