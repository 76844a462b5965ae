// levels.hpp: what each level's translation unit of src/kernels/ gives
// levels.cpp, which puts the tables of backend/cpu/kernels.hpp together.
// Each is compiled for its own instruction set; nothing in this header
// emits code.
#pragma once

#include <cstdint>

#include "xfmr/backend/cpu/kernels.hpp"

namespace xfmr::detail {

// The CPU families' float operations at each level (src/kernels/ops_*.cpp).
const CpuOps<float>* portable_ops();
const CpuOps<float>* avx2_ops();
const CpuOps<float>* avx512_ops();

namespace portable {
CpuKernels kernels();
}
namespace avx2 {
CpuKernels kernels();
}
namespace avx512 {
CpuKernels kernels();  // no int8 products: VNNI's or AVX2's
}
namespace avx2 {
void q4_product_rows(int n0, int n1, int M, int K, const std::byte* P, const std::int8_t* Q, long ldq,
                     const float* scale, const std::int32_t* offset, long lds, float* C, long ldc);
}
namespace avx512_vnni {
void q4_product_rows(int n0, int n1, int M, int K, const std::byte* P, const std::int8_t* Q, long ldq,
                     const float* scale, const std::int32_t* offset, long lds, float* C, long ldc);
void int8_product_rows(int n0, int n1, int M, int K, const std::int8_t* Q, long ldq, const float* scale,
                       const std::int32_t* q_sum, const std::uint8_t* U, long ldu, const ActivationScale* rows,
                       float* C, long ldc);
}

}  // namespace xfmr::detail
