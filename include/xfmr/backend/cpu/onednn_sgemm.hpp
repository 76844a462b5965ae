// onednn_sgemm.hpp: detail::onednn_sgemm, row-major C = alpha op(A) op(B) +
// beta C in float on oneDNN's sgemm (src/onednn.cpp), which picks its
// kernel from the processor's instruction sets. Returns false, doing
// nothing, where xfmr is built without oneDNN. cpu/gemm.hpp says which
// products go there.
#pragma once

namespace xfmr::detail {

bool onednn_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                  int ldb, float beta, float* C, int ldc);
// Whether xfmr is built with oneDNN (onednn_sgemm then runs every call).
bool onednn_sgemm_available();

}  // namespace xfmr::detail
