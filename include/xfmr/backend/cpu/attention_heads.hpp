// attention_heads.hpp: CpuBackend's materialised attention, as free
// functions of the scalar type: scaled dot-product attention forward and
// backward with the (B, H, Tq, Tk) probabilities, on the rows path (row by
// row, attention_rows.hpp) or the heads path (three GEMMs per head forward,
// four backward; dropout on the probabilities; key/value heads shared by
// query heads), as attention_plan.hpp decides and the caller passes in. The
// backend owns the per-thread scratch tiles and passes them in. With bf16 (CpuOptions::bf16, float
// only) each head's GEMMs multiply bfloat16-rounded operands and sum in
// float32 (bf16::gemm, on the calling thread); the softmax, its gradient and
// the row-by-row kernels stay float32.
#pragma once

#include <Eigen/Core>
#include <cmath>

#include "xfmr/backend/backend.hpp"
#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu/attention_rows.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/core/mask.hpp"

namespace xfmr::detail {
inline namespace XFMR_CPU_OPS_NS {

// Scratch elements attention needs for each thread (0: none).
inline long attention_forward_tiles(const AttentionDims& a) { return a.dropout > 0.0f ? long(a.Tq) * a.Tk : 0; }
inline long attention_backward_tiles(const AttentionDims& a) {
  return (a.dropout > 0.0f ? 2 : 1) * long(a.Tq) * a.Tk;
}

// One head's row-major C = alpha op(A) op(B) + beta C in bf16 (bf16.hpp):
// true when it ran so (bf16 asked, S float), false to leave it to Eigen.
template <class S>
bool head_product_bf16(bool bf16, bool ta, bool tb, int M, int N, int K, S alpha, const S* A, int lda, const S* B,
                       int ldb, S beta, S* C, int ldc) {
  if constexpr (std::is_same_v<S, float>) {
    if (bf16) bf16::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return bf16;
  } else {
    (void)bf16, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb,
        (void)beta, (void)C, (void)ldc;
    return false;
  }
}

template <class S>
void attention_forward(const AttentionDims& a, const S* q, int ldq, const S* k, int ldk, const S* v, int ldv, S* y,
                       int ldy, S* probs, const AttentionMask& mask, bool rows, S* scratch, bool bf16 = false) {
  using MatR = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strided = Eigen::OuterStride<>;
  using Map = Eigen::Map<MatR, 0, Strided>;
  using CMap = Eigen::Map<const MatR, 0, Strided>;
  const S scale = S(1) / std::sqrt(S(a.QK_DIM));
  const bool drop = a.dropout > 0.0f;
  const long tile = long(a.Tq) * a.Tk;
  const bool own_region = may_fork();
  const long work = long(a.B) * a.H * tile * (a.QK_DIM + a.V_DIM);
  const AttendRow<S> attend = row_kernel<S>(a);
  parallel_ranges(long(a.B) * a.H, work > kAttentionParallelWork, [=](long lo, long hi) {
    for (long i_ = lo; i_ < hi; ++i_) {
      const int b = int(i_ / a.H), h = int(i_ % a.H);
      const S* qb = q + long(b) * a.Tq * ldq + long(h) * a.QK_DIM;
      const S* kb = k + long(b) * a.kv_rows() * ldk + long(a.kv_head(h)) * a.QK_DIM;
      const S* vb = v + long(b) * a.kv_rows() * ldv + long(a.kv_head(h)) * a.V_DIM;
      S* yb = y + long(b) * a.Tq * ldy + long(h) * a.V_DIM;
      S* p = probs + i_ * tile;
      if (rows) {
        for (int i = 0; i < a.Tq; ++i)
          attend(b, i, a, scale, qb + long(i) * ldq, kb, ldk, vb, ldv, p + long(i) * a.Tk, yb + long(i) * ldy, mask);
        continue;
      }
      const CMap Q(qb, a.Tq, a.QK_DIM, Strided(ldq));
      const CMap K(kb, a.Tk, a.QK_DIM, Strided(ldk));
      const CMap Vm(vb, a.Tk, a.V_DIM, Strided(ldv));
      Map P(p, a.Tq, a.Tk, Strided(a.Tk));
      if (!head_product_bf16(bf16, false, true, a.Tq, a.Tk, a.QK_DIM, scale, qb, ldq, kb, ldk, S(0), p, a.Tk))
        P.noalias() = scale * Q * K.transpose();  // (Tq, Tk) scores
      for (int i = 0; i < a.Tq; ++i)
        masked_softmax_row<S>(b, i, a.Tq, a.Tk, p + long(i) * a.Tk, p + long(i) * a.Tk, mask);
      Map Y(yb, a.Tq, a.V_DIM, Strided(ldy));
      const S* weights = p;
      if (drop) {
        S* pd = scratch + (own_region ? thread_index() : 0) * tile;
        drop_probabilities(a, i_ * tile, tile, p, pd);
        weights = pd;
      }
      if (!head_product_bf16(bf16, false, false, a.Tq, a.V_DIM, a.Tk, S(1), weights, a.Tk, vb, ldv, S(0), yb, ldy))
        Y.noalias() = CMap(weights, a.Tq, a.Tk, Strided(a.Tk)) * Vm;  // (Tq, V_DIM)
    }
  });
}

// Threads over (sequence, key/value head); the query heads sharing a
// key/value head (grouped-query attention) add into its dK and dV in
// order, so the sums repeat on any thread count.
template <class S>
void attention_backward(const AttentionDims& a, const S* dy, int ldy, const S* q, int ldq, const S* k, int ldk,
                        const S* v, int ldv, const S* probs, S* dq, S* dk, S* dv, bool rows, S* scratch,
                        bool bf16 = false) {
  using MatR = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strided = Eigen::OuterStride<>;
  using Map = Eigen::Map<MatR, 0, Strided>;
  using CMap = Eigen::Map<const MatR, 0, Strided>;
  const S scale = S(1) / std::sqrt(S(a.QK_DIM));
  const bool drop = a.dropout > 0.0f;
  const int KVH = a.kv_heads(), group = a.H / KVH;
  const long tile = long(a.Tq) * a.Tk;
  // scratch: dS, and the dropped probabilities under dropout, for each thread
  // of this call's own region; called from inside another region (a
  // DataParallel shard) it runs on one thread, whatever that thread's number
  // there.
  const bool own_region = may_fork();
  const long work = long(a.B) * a.H * tile * (a.QK_DIM + a.V_DIM);
  const AttendRowBackward<S> attend_backward = row_backward_kernel<S>(a);
  parallel_ranges(long(a.B) * KVH, work > kParallelWork, [=](long lo, long hi) {
    for (long i_ = lo; i_ < hi; ++i_) {
      const int b = int(i_ / KVH), g = int(i_ % KVH);
      // This (sequence, key/value head)'s blocks; keys and values are unstrided (Tk rows).
      const S* kb = k + long(b) * a.Tk * ldk + long(g) * a.QK_DIM;
      const S* vb = v + long(b) * a.Tk * ldv + long(g) * a.V_DIM;
      S* dkb = dk + long(b) * a.Tk * ldk + long(g) * a.QK_DIM;
      S* dvb = dv + long(b) * a.Tk * ldv + long(g) * a.V_DIM;
      S* ds = scratch + (own_region ? thread_index() : 0) * (drop ? 2 * tile : tile);
      const CMap K(kb, a.Tk, a.QK_DIM, Strided(ldk));
      const CMap Vm(vb, a.Tk, a.V_DIM, Strided(ldv));
      Map dK(dkb, a.Tk, a.QK_DIM, Strided(ldk));
      Map dV(dvb, a.Tk, a.V_DIM, Strided(ldv));
      if (rows) {
        dK.setZero();
        dV.setZero();
      }
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const bool first = h == g * group;
        const long bh = long(b) * a.H + h;
        const S* dyb = dy + long(b) * a.Tq * ldy + long(h) * a.V_DIM;
        const S* qb = q + long(b) * a.Tq * ldq + long(h) * a.QK_DIM;
        const S* p = probs + bh * tile;
        S* dqb = dq + long(b) * a.Tq * ldq + long(h) * a.QK_DIM;
        if (rows) {
          for (int i = 0; i < a.Tq; ++i)
            attend_backward(a, scale, dyb + long(i) * ldy, qb + long(i) * ldq, kb, ldk, vb, ldv, p + long(i) * a.Tk,
                            ds, dqb + long(i) * ldq, dkb, dvb);
          continue;
        }
        const CMap dY(dyb, a.Tq, a.V_DIM, Strided(ldy));
        const CMap Q(qb, a.Tq, a.QK_DIM, Strided(ldq));
        Map dS(ds, a.Tq, a.Tk, Strided(a.Tk));
        const S* weights = p;
        if (drop) {  // the mask replayed from the forward's key
          drop_probabilities(a, bh * tile, tile, p, ds + tile);
          weights = ds + tile;
        }
        const CMap W(weights, a.Tq, a.Tk, Strided(a.Tk));
        const S into = first ? S(0) : S(1);  // dK, dV: the group's first head assigns, the others add
        if (!head_product_bf16(bf16, true, false, a.Tk, a.V_DIM, a.Tq, S(1), weights, a.Tk, dyb, ldy, into, dvb, ldv)) {
          if (first) dV.noalias() = W.transpose() * dY;  // (Tk, V_DIM)
          else dV.noalias() += W.transpose() * dY;
        }
        if (!head_product_bf16(bf16, false, true, a.Tq, a.Tk, a.V_DIM, S(1), dyb, ldy, vb, ldv, S(0), ds, a.Tk))
          dS.noalias() = dY * Vm.transpose();  // dP, (Tq, Tk)
        if (drop) undrop_gradient(a, bh * tile, tile, ds);
        for (int i = 0; i < a.Tq; ++i)
          softmax_backward_row<S>(a.Tk, p + long(i) * a.Tk, ds + long(i) * a.Tk, ds + long(i) * a.Tk);
        Map dQ(dqb, a.Tq, a.QK_DIM, Strided(ldq));
        if (!head_product_bf16(bf16, false, false, a.Tq, a.QK_DIM, a.Tk, scale, ds, a.Tk, kb, ldk, S(0), dqb, ldq))
          dQ.noalias() = scale * dS * K;  // (Tq, QK_DIM)
        if (!head_product_bf16(bf16, true, false, a.Tk, a.QK_DIM, a.Tq, scale, ds, a.Tk, qb, ldq, into, dkb, ldk)) {
          if (first) dK.noalias() = scale * dS.transpose() * Q;  // (Tk, QK_DIM)
          else dK.noalias() += scale * dS.transpose() * Q;
        }
      }
    }
  });
}

}  // namespace XFMR_CPU_OPS_NS
}  // namespace xfmr::detail
