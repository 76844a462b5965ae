// attention_plan.hpp: which kernels compute an attention call, decided here
// and nowhere else (test_attention_plan states the path of each case).
//
// A backend has up to three paths:
//   rows   one query row at a time, the probabilities (B, H, Tq, Tk)
//          materialised; no dropout. CPU: fixed-width dot products for up
//          to kCpuRowQueries query rows (shorter sequences, decoding steps);
//          CUDA: fused kernels, one warp a row, up to kCudaRowKeys keys and
//          heads of up to kCudaHeadDim.
//   heads  per-head matrix products over the materialised probabilities
//          (CPU: Eigen or bf16 per head; CUDA: cuBLAS strided batches), any
//          length, dropout too: for the callers that read the probabilities
//          (translate's attention map, keep_probabilities), decoding past the
//          row limits, and training where a backend does not tile.
//   tiled  an online softmax over tiles of queries and keys that saves each
//          query row's log-sum-exp instead of the probabilities: training
//          forwards past the row limits. CPU always; CUDA where
//          CudaOptions::flash_attention asks (off until its parity tests have
//          run on a GPU), heads of up to kCudaHeadDim.
// bf16 precision changes the arithmetic of heads and tiled (each product in
// bf16 on the CPU: attention_heads.hpp, attention_tiled.hpp; on CUDA the
// tiled path on the tensor cores for heads of 64 and 128:
// cuda/attention_bf16.cu), not the path.
// The layers ask plan_attention which of tiled and materialised to run
// (attention.hpp's SavedAttention); the backends' materialised entry points
// ask it which of rows and heads.
#pragma once

#include <algorithm>

#include "xfmr/backend/backend.hpp"

namespace xfmr {

enum class AttentionPath { rows, heads, tiled };

inline const char* attention_path_name(AttentionPath p) {
  return p == AttentionPath::rows ? "rows" : p == AttentionPath::heads ? "heads" : "tiled";
}

// What a call keeps: what a backward needs (a training forward: the tiled
// path's log-sum-exps will do), or the probabilities themselves.
enum class AttentionUse { training, probabilities };

// The reach of a backend's kernels (0: no limit).
struct AttentionKernels {
  int row_queries = 0, row_keys = 0, row_head = 0;  // the rows path's
  bool tiled = false;                               // whether it has the tiled path
  int tiled_head = 0;
};

inline constexpr int kCpuRowQueries = 64;  // from 64 rows Eigen's per-head GEMMs catch up (BENCHMARKS.md)
inline constexpr int kCudaRowKeys = 256, kCudaHeadDim = 128;  // cuda/attention.cu's fused kernels

inline constexpr AttentionKernels cpu_attention_kernels() { return {kCpuRowQueries, 0, 0, true, 0}; }
inline constexpr AttentionKernels cuda_attention_kernels(bool flash_attention) {
  return {0, kCudaRowKeys, kCudaHeadDim, flash_attention, kCudaHeadDim};
}

inline AttentionPath plan_attention(const AttentionDims& d, AttentionUse use, const AttentionKernels& k) {
  const auto within = [](int v, int limit) { return limit == 0 || v <= limit; };
  const int head = std::max(d.QK_DIM, d.V_DIM);
  if (d.dropout == 0.0f && within(d.Tq, k.row_queries) && within(d.Tk, k.row_keys) && within(head, k.row_head))
    return AttentionPath::rows;
  if (use == AttentionUse::training && k.tiled && within(head, k.tiled_head)) return AttentionPath::tiled;
  return AttentionPath::heads;
}

}  // namespace xfmr
