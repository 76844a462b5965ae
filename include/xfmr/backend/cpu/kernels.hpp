// kernels.hpp: the CPU's hand-written row kernels, and the one place that
// picks which instruction set runs them and the families' operations
// (cpu/ops.hpp: each level's copy of them is in its table, CpuKernels::ops).
//
// A decoding step's single rows (y = W x), a few rows against one weight
// matrix (continuous batching), float32's decoding panels, the bf16 and
// int8 weight copies' products and one masked softmax row are each a few
// hundred nanoseconds to a few microseconds of work, where general kernels
// (Eigen's, BLAS's) spend a good part of it on horizontal sums, packing or
// scalar tails. They are written
// for each instruction-set level that matters, each level in its own
// translation unit compiled for it (src/kernels/), all in the one library:
//
//   portable  x86-64 (SSE2) or any other processor: Eigen's GEMV, plain loops
//   avx2      x86-64-v3 (AVX2, FMA, F16C): eight rows side by side
//   avx512    x86-64-v4 (AVX-512 F, BW, CD, DQ, VL): sixteen rows side by
//             side; its int8 products through AVX-512 VNNI where the CPU
//             has it, through AVX2's otherwise
//
// cpu_kernels() gives the table of the level in use: the best the CPU has
// (cpuid), or the one XFMR_CPU_LEVEL names (portable, avx2, avx512) for a
// test or a bug report, or the one set_cpu_level() chose last. Callers read
// the table once a call, outside their parallel regions (gemm.hpp,
// attention_rows.hpp, bf16_products.hpp, int8_products.hpp), and
// CpuBackend's constructor resolves it, so a bad XFMR_CPU_LEVEL is an
// xfmr::Error there.
//
// Within a level a row's outputs do not depend on the rows computed with it
// (a row of a batch gets the bits it gets alone); across levels float sums
// run in another order (8 or 16 lanes), while the int8 products, exact in
// int32, and the float panels' chains of multiply-adds are the same bits
// at every level.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "xfmr/core/int8.hpp"

namespace xfmr {

enum class CpuLevel { portable, avx2, avx512 };

// "portable", "avx2", "avx512".
const char* cpu_level_name(CpuLevel level);
// The best level this CPU runs, and every level it runs, lowest first.
CpuLevel best_cpu_level();
std::vector<CpuLevel> supported_cpu_levels();
// The level in use (see above), and a line naming it for a program's
// header: "avx512 (int8 through VNNI)", "avx2 (forced by XFMR_CPU_LEVEL)".
CpuLevel cpu_level();
std::string cpu_level_description();
// From now on, every thread's kernels are this level's; xfmr::Error if the
// CPU lacks it. For tests and measurements: not while a product runs.
void set_cpu_level(CpuLevel level);

namespace detail {

template <class S>
struct CpuOps;

struct CpuKernels {
  CpuLevel level;
  // The CPU families' float operations compiled for this level (cpu/ops.hpp).
  const CpuOps<float>* ops;
  // Rows [n0, n1) of y = W x, W (N, K) row-major with leading dimension ldw.
  void (*gemv_rows)(int n0, int n1, int K, const float* W, long ldw, const float* x, float* y);
  // Rows [n0, n1) of Y = X W^T for 2 <= M <= multi_rows rows of X (ldx
  // apart) into Y's rows (ldy apart), W read once for all of them: each
  // row's outputs the bits gemv_rows gives it. multi_rows 0: no such kernel.
  int multi_rows;
  void (*gemv_rows_multi)(int M, int n0, int n1, int K, const float* W, long ldw, const float* X, long ldx, float* Y,
                          long ldy);
  // Panels [b0, b1) of Y = X W^T (rows [16 b0, min(16 b1, N)) of each of
  // Y's rows, ldy apart) for 1 <= M <= kPanelMaxRows rows of X (ldx
  // apart), from W's float32 panels (pack_float_panels below, panel_stride
  // floats apart) over K columns: each output one chain of multiply-adds
  // over k in order from zero, so the same bits whatever M, whatever rows
  // come with it, at every level that has the kernel. Null: none.
  void (*panel_rows)(int b0, int b1, int N, int M, int K, const float* P, long panel_stride, const float* X, long ldx,
                     float* Y, long ldy);
  // Rows [n0, n1) of y = W x with W's bfloat16 bits (bf16.hpp) and x float
  // (already rounded to bfloat16 by the caller): the products exact, the
  // sums float32. Null: no such kernel (bf16::gemm then).
  void (*gemv_rows_bf16)(int n0, int n1, int K, const std::uint16_t* W, long ldw, const float* x, float* y);
  // Rows [n0, n1) of C (M, N) = the int8 product of U's M quantised rows
  // (ldu apart, their scales in `rows`) and Q (N, K) int8, a scale and a
  // sum of its q a row (int8_products.hpp gives the formula). Q is laid out
  // as int8_blocked says: false, its rows with leading dimension ldq; true,
  // in blocks of 16 rows (pack_int8_blocks below, ldq = int8_block_width(K))
  // with n0 a multiple of 16.
  void (*int8_product_rows)(int n0, int n1, int M, int K, const std::int8_t* Q, long ldq, const float* scale,
                            const std::int32_t* q_sum, const std::uint8_t* U, long ldu, const ActivationScale* rows,
                            float* C, long ldc);
  bool int8_blocked;
  const char* int8_isa;  // "VNNI", "AVX2", "plain loop"
  // Rows [n0, n1) of C (M, N) = the 4-bit product of core/q4.hpp: M rows of
  // activations quantised a block at a time (Q, ldq apart; their blocks'
  // scales and offsets lds apart) and the panels P of W (N, K); n0 a
  // multiple of 16. The same bits at every level (the sums exact, then one
  // fused multiply-add a block in the blocks' order).
  void (*q4_product_rows)(int n0, int n1, int M, int K, const std::byte* P, const std::int8_t* Q, long ldq,
                          const float* scale, const std::int32_t* offset, long lds, float* C, long ldc);
  const char* q4_isa;  // "VNNI", "AVX2", "plain loop"
  // out[0, Tk) = the softmax of in[0, n) over the keys that pad (Tk bytes or
  // null) leaves, zero at padded keys and from n on; all zero when no key is
  // left. in and out may alias.
  void (*softmax_row)(const float* in, float* out, int n, int Tk, const std::uint8_t* pad);
};

// The level in use's kernels.
const CpuKernels& cpu_kernels();

// The blocked layout of int8 weights (CpuKernels::int8_blocked): rows in
// blocks of 16 (the last padded with rows of zeros), each block K's
// columns in groups of four (the last padded with zeros), a group's 64
// bytes the four q of each of the block's 16 rows in turn. One 512-bit
// load is a group, which VNNI's vpdpbusd multiplies by four bytes of an
// activation row broadcast to every lane and sums into the block's 16
// outputs, so no output needs a horizontal sum; and a block, a thread's
// rows, are each one stream of consecutive bytes, which the processor
// prefetches best. Packing once, when a copy is kept, costs nothing per
// product.
inline constexpr int kInt8BlockRows = 16;
// The bytes of a row in a block: K rounded up to whole groups of four.
inline long int8_block_width(int K) {
  return (long(K) + 3) / 4 * 4;
}
inline std::size_t int8_blocked_bytes(int N, int K) {
  return std::size_t((N + kInt8BlockRows - 1) / kInt8BlockRows) * kInt8BlockRows * std::size_t(int8_block_width(K));
}
// Q (N, K), leading dimension ldq, into P's int8_blocked_bytes(N, K) bytes.
inline void pack_int8_blocks(int N, int K, const std::int8_t* Q, long ldq, std::int8_t* P) {
  const long width = int8_block_width(K);
  for (int r0 = 0; r0 < N; r0 += kInt8BlockRows)
    for (long k = 0; k < width; k += 4)
      for (int r = r0; r < r0 + kInt8BlockRows; ++r)
        for (long i = k; i < k + 4; ++i) *P++ = r < N && i < K ? Q[r * ldq + i] : std::int8_t(0);
}

// float32 weights for decoding (a few rows at a time, cpu/float_panels.hpp):
// rows in panels of 16 (the last padded with rows of zeros), a panel K
// groups of 16 floats, group k the panel's 16 rows' column k. One 64-byte
// load is a group, multiplied by an activation row's x_k broadcast and
// summed into the panel's 16 outputs: no horizontal sums, every output's
// sum in k's order (the same for any number of rows, unlike gemv_rows'
// 16 lanes), and a panel one stream of consecutive bytes. A few rows of
// gpt2-small's shapes stream their panels at the read bandwidth, where
// gemv_rows_multi's pairs of rows reach a third of it.
inline constexpr int kPanelRows = 16;
inline constexpr int kPanelMaxRows = 16;  // the most rows of X a panel product takes
inline long float_panel_count(int N) {
  return (long(N) + kPanelRows - 1) / kPanelRows;
}
// W (N, K), leading dimension ldw: its panels [b0, b1) into P (all of W's
// panels, K * kPanelRows floats each).
// Written a group at a time (64 consecutive bytes), the 16 rows read side by side.
inline void pack_float_panels(long b0, long b1, int N, int K, const float* W, long ldw, float* P) {
  for (long b = b0; b < b1; ++b) {
    float* panel = P + b * K * kPanelRows;
    const float* rows[kPanelRows];
    for (int i = 0; i < kPanelRows; ++i) rows[i] = b * kPanelRows + i < N ? W + (b * kPanelRows + i) * ldw : nullptr;
    for (int k = 0; k < K; ++k)
      for (int i = 0; i < kPanelRows; ++i) panel[long(k) * kPanelRows + i] = rows[i] ? rows[i][k] : 0.0f;
  }
}

// One output of the int8 product from its exact integer sum, in the
// formula's order (every level's).
inline float int8_output(std::int32_t sum, float weight_scale, float row_scale) {
  return float(sum) * weight_scale * row_scale;
}

}  // namespace detail
}  // namespace xfmr
