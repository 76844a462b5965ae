// cpu_attention.hpp: CpuBackend's attention and rotary positions, as free
// functions of the scalar type: scaled dot-product attention forward and
// backward (row by row for few query rows, three GEMMs per head otherwise;
// dropout on the probabilities; key/value heads shared by query heads), and
// the turn of rotary position pairs. The backend owns the per-thread
// scratch tiles and passes them in.
#pragma once

#include <Eigen/Core>
#include <cmath>

#include "xfmr/backend/backend.hpp"
#include "xfmr/backend/checks.hpp"
#include "xfmr/backend/cpu_parallel.hpp"
#include "xfmr/backend/cpu_rows.hpp"
#include "xfmr/core/mask.hpp"

namespace xfmr::detail {

// Scratch elements attention needs for each thread (0: none).
inline long attention_forward_tiles(const AttentionDims& a) { return a.dropout > 0.0f ? long(a.Tq) * a.Tk : 0; }
inline long attention_backward_tiles(const AttentionDims& a) {
  return (a.dropout > 0.0f ? 2 : 1) * long(a.Tq) * a.Tk;
}

template <class S>
void attention_forward(const AttentionDims& a, const S* q, int ldq, const S* k, int ldk, const S* v, int ldv, S* y,
                       int ldy, S* probs, const AttentionMask& mask, S* scratch) {
  using MatR = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strided = Eigen::OuterStride<>;
  using Map = Eigen::Map<MatR, 0, Strided>;
  using CMap = Eigen::Map<const MatR, 0, Strided>;
  check_dropout_rate(a.dropout);
  check_kv_heads(a);
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
      if (a.Tq <= kRowAttentionRows && !drop) {
        for (int i = 0; i < a.Tq; ++i)
          attend(b, i, a, scale, qb + long(i) * ldq, kb, ldk, vb, ldv, p + long(i) * a.Tk, yb + long(i) * ldy, mask);
        continue;
      }
      const CMap Q(qb, a.Tq, a.QK_DIM, Strided(ldq));
      const CMap K(kb, a.Tk, a.QK_DIM, Strided(ldk));
      const CMap Vm(vb, a.Tk, a.V_DIM, Strided(ldv));
      Map P(p, a.Tq, a.Tk, Strided(a.Tk));
      P.noalias() = scale * Q * K.transpose();  // (Tq, Tk) scores
      for (int i = 0; i < a.Tq; ++i)
        masked_softmax_row<S>(b, i, a.Tq, a.Tk, p + long(i) * a.Tk, p + long(i) * a.Tk, mask);
      Map Y(yb, a.Tq, a.V_DIM, Strided(ldy));
      if (!drop) {
        Y.noalias() = P * Vm;  // (Tq, V_DIM)
        continue;
      }
      S* pd = scratch + (own_region ? thread_index() : 0) * tile;
      drop_probabilities(a, i_ * tile, tile, p, pd);
      Y.noalias() = CMap(pd, a.Tq, a.Tk, Strided(a.Tk)) * Vm;
    }
  });
}

// Threads over (sequence, key/value head); the query heads sharing a
// key/value head (grouped-query attention) add into its dK and dV in
// order, so the sums repeat on any thread count.
template <class S>
void attention_backward(const AttentionDims& a, const S* dy, int ldy, const S* q, int ldq, const S* k, int ldk,
                        const S* v, int ldv, const S* probs, S* dq, S* dk, S* dv, S* scratch) {
  using MatR = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strided = Eigen::OuterStride<>;
  using Map = Eigen::Map<MatR, 0, Strided>;
  using CMap = Eigen::Map<const MatR, 0, Strided>;
  check_unstrided_keys(a);
  check_dropout_rate(a.dropout);
  check_kv_heads(a);
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
      const bool rows = a.Tq <= kRowAttentionRows && !drop;
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
        if (first) dV.noalias() = W.transpose() * dY;  // (Tk, V_DIM)
        else dV.noalias() += W.transpose() * dY;
        dS.noalias() = dY * Vm.transpose();  // dP, (Tq, Tk)
        if (drop) undrop_gradient(a, bh * tile, tile, ds);
        for (int i = 0; i < a.Tq; ++i)
          softmax_backward_row<S>(a.Tk, p + long(i) * a.Tk, ds + long(i) * a.Tk, ds + long(i) * a.Tk);
        Map dQ(dqb, a.Tq, a.QK_DIM, Strided(ldq));
        dQ.noalias() = scale * dS * K;  // (Tq, QK_DIM)
        if (first) dK.noalias() = scale * dS.transpose() * Q;  // (Tk, QK_DIM)
        else dK.noalias() += scale * dS.transpose() * Q;
      }
    }
  });
}

// Rotary positions: each (2i, 2i+1) pair of each head turned by its angle
// (sign -1: turned back, the backward).
template <class S>
void rotate_pairs(int B, int T, int offset, int H, int hd, const S* table, S* x, int ld, S sign) {
  parallel_ranges(long(B) * T, long(B) * T * H * hd > kParallelWork, [=](long lo, long hi) {
    for (long r = lo; r < hi; ++r) {
      const S* cs = table + long(offset + int(r % T)) * hd;
      for (int h = 0; h < H; ++h) {
        S* v = x + r * ld + long(h) * hd;
        for (int i = 0; i < hd; i += 2) {
          const S c = cs[i], s = sign * cs[i + 1], x0 = v[i], x1 = v[i + 1];
          v[i] = x0 * c - x1 * s;
          v[i + 1] = x0 * s + x1 * c;
        }
      }
    }
  });
}

}  // namespace xfmr::detail
