// bf16.hpp: matrix products with bfloat16 operands and float32 accumulation
// on the CPU, for CpuBackend's bf16 precision (CpuOptions::bf16).
//
// bfloat16 keeps float32's exponent and 8 of its 24 significant bits, so a
// value rounds to within 2^-8 of itself (relative; round to nearest, ties to
// even, as PyTorch's .to(torch.bfloat16)). gemm() rounds both operands so
// and multiplies them, summing in float32 into a float32 C: on AVX512-BF16
// (native(): two products per float32 lane and instruction, twice float32's
// FMA rate) through oneDNN's matmul; elsewhere through oneDNN's sgemm on
// the rounded operands widened back to float32, whose products are exact
// (8 significant bits times 8), so the same numbers to float32's summation
// order, at float32's speed plus the rounding. Decoding gains either way:
// a single row against a bf16 weight copy reads half of float32's bytes
// (cpu/kernels.hpp's gemv_rows_bf16, AVX2 and AVX-512). Everything else in a bf16 model stays float32:
// the weights (the master copy the optimizer updates), the activations
// between products, every reduction.
//
// Error of one product against float32 on the same inputs: each term
// a_i b_i moves by at most (2 2^-8 + 2^-16) |a_i b_i| when rounded, so
// |C_bf16 - C_fp32| <= (2^-7 + 2^-16) sum_i |a_i b_i|, plus float32's own
// summation error (test_bf16 checks this bound element by element).
//
// available() says whether products can run so: xfmr built with oneDNN
// (Debian's libdnnl-dev; CMake's XFMR_DNNL), on any processor. Without,
// gemm() throws xfmr::Error saying why (unavailable_reason()); the programs
// then fall back to float32 with a notice. oneDNN is included by
// src/onednn.cpp alone.
#pragma once

#include <bit>
#include <cstdint>
#include <string>

namespace xfmr {

// One bfloat16 value as its 16 bits (bf16::from_float's): the activations'
// type of a backend that stores them in bfloat16 (CudaBf16Backend). It has
// no arithmetic: kernels widen it to float32 and round results back.
struct Bf16 {
  std::uint16_t bits;
};

}  // namespace xfmr

namespace xfmr::bf16 {

// The bfloat16 nearest x (ties to even), as its 16 bits; NaN stays NaN, and
// values past bfloat16's largest round to infinity.
inline std::uint16_t from_float(float x) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);  // a quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}
inline float to_float(std::uint16_t b) { return std::bit_cast<float>(std::uint32_t(b) << 16); }
// x rounded to bfloat16 and back.
inline float round(float x) { return to_float(from_float(x)); }

bool available();
// Whether the products run on the processor's bfloat16 instructions
// (AVX512-BF16), rather than as float32 products of the rounded operands.
bool native();
// Why available() is false ("" when it is true).
std::string unavailable_reason();

// Row-major C = alpha op(A) op(B) + beta C (CpuBackend::gemm's arguments),
// with A and B rounded to bfloat16 and the products summed in float32.
// B_bits, when given, is B already rounded (the same layout and leading
// dimension, as from_float's bits: a bf16 weight copy), and B is not read.
// Called from several threads at once (DataParallel's shards), each runs on
// its own; from one thread, oneDNN threads it over OpenMP.
void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc, const std::uint16_t* B_bits = nullptr);

}  // namespace xfmr::bf16
