// attention_tiled.hpp: CpuBackend's tiled ("flash") attention, as free
// functions of the scalar type. The same attention as cpu/attention_heads.hpp's
// (masks, dropout replayed from the key, grouped key/value heads, bf16
// products under CpuOptions::bf16), computed a tile of queries by a tile of
// keys at a time (flash_tile) with an online softmax, so no (Tq, Tk) matrix is
// ever stored: the forward saves each query row's log-sum-exp (B, H, Tq),
// and the backward recomputes every tile's probabilities from it.
//
// Forward, per query tile: for each key tile, S = scale Q K^T (masked keys
// -inf), the running row maximum m and sum l rescale the output so far by
// exp(m_old - m_new), Y += dropped(exp(S - m)) V; at the end Y /= l and
// lse = m + log l (-inf for a row with no visible key: output zero).
// Backward, per (sequence, key/value head), its query heads in order:
// D = rowsum(dY o Y) (that is rowsum(P o dP), dropout or not), then per tile
// P = exp(S - lse), dV += dropped(P)^T dY, dP = undropped(dY V^T),
// dS = P o (dP - D), dQ += scale dS K, dK += scale dS^T Q.
// Threads: forward over (sequence, head), backward over (sequence,
// key/value head); each thread's order is fixed, so results repeat on any
// thread count. Per-thread scratch: flash_*_tiles elements.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "xfmr/backend/backend.hpp"
#include "xfmr/backend/cpu/attention_heads.hpp"
#include "xfmr/backend/cpu/attention_rows.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/core/mask.hpp"

namespace xfmr::detail {
inline namespace XFMR_CPU_OPS_NS {

inline constexpr int kFlashRows = 64;   // query rows of a tile
inline constexpr int kFlashKeys = 128;  // keys of a tile

// A tile's shape: kFlashRows x kFlashKeys, or twice both with bf16 products
// (each tile product is then a oneDNN call, whose fixed cost wants more work).
struct FlashTile {
  int rows, keys;
};
inline FlashTile flash_tile(bool bf16) {
  return bf16 ? FlashTile{2 * kFlashRows, 2 * kFlashKeys} : FlashTile{kFlashRows, kFlashKeys};
}
inline long flash_forward_tiles(bool bf16 = false) {
  const FlashTile t = flash_tile(bf16);
  return long(t.rows) * t.keys + 2 * t.rows;
}
inline long flash_backward_tiles(bool bf16 = false) {
  const FlashTile t = flash_tile(bf16);
  return 2 * long(t.rows) * t.keys + t.rows;
}

// Row-major C = alpha op(A) op(B) + beta C of one tile: bf16 where asked
// (head_product_bf16), Eigen otherwise.
template <class S>
void tile_product(bool bf16, bool ta, bool tb, int M, int N, int K, S alpha, const S* A, int lda, const S* B,
                  int ldb, S beta, S* C, int ldc) {
  using MatR = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strided = Eigen::OuterStride<>;
  using CMap = Eigen::Map<const MatR, 0, Strided>;
  if (head_product_bf16(bf16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  Eigen::Map<MatR, 0, Strided> c(C, M, N, Strided(ldc));
  if (beta == S(0)) c.setZero();
  else if (beta != S(1)) c *= beta;
  const CMap a(A, ta ? K : M, ta ? M : K, Strided(lda)), b(B, tb ? N : K, tb ? K : N, Strided(ldb));
  if (!ta && !tb) c.noalias() += alpha * a * b;
  else if (!ta) c.noalias() += alpha * a * b.transpose();
  else if (!tb) c.noalias() += alpha * a.transpose() * b;
  else c.noalias() += alpha * a.transpose() * b.transpose();
}

// Of a tile's keys from j0 (cols of them), the first this many are not
// past query row i's causal limit.
inline int tile_visible(const AttentionDims& a, const AttentionMask& mask, int i, int j0, int cols) {
  return std::clamp(visible_keys(mask, i, a.Tq, a.Tk) - j0, 0, cols);
}

// Sequence b's padding bytes from key j0 (nullptr: no padding).
inline const std::uint8_t* tile_padding(const AttentionDims& a, const AttentionMask& mask, int b, int j0) {
  return mask.key_padding ? mask.key_padding + long(b) * a.Tk + j0 : nullptr;
}

// One tile's masked scores: s (rows, lds) = scale Q[i0..] K[j0..]^T, -inf
// where a key is masked (past the causal limit, or padded).
template <class S>
void flash_scores(bool bf16, const AttentionDims& a, int b, int i0, int rows, int j0, int cols, S scale, const S* qb,
                  int ldq, const S* kb, int ldk, const AttentionMask& mask, S* s, int lds) {
  constexpr S kMasked = -std::numeric_limits<S>::infinity();
  tile_product(bf16, false, true, rows, cols, a.QK_DIM, scale, qb + long(i0) * ldq, ldq, kb + long(j0) * ldk, ldk,
               S(0), s, lds);
  const std::uint8_t* pad = tile_padding(a, mask, b, j0);
  for (int r = 0; r < rows; ++r) {
    S* sr = s + long(r) * lds;
    const int visible = tile_visible(a, mask, i0 + r, j0, cols);
    std::fill(sr + visible, sr + cols, kMasked);
    if (pad)
      for (int c = 0; c < visible; ++c)
        if (pad[c]) sr[c] = kMasked;
  }
}

// Keys [0, end) can be visible to query rows [i0, i0 + rows).
inline int flash_key_end(const AttentionDims& a, const AttentionMask& mask, int i0, int rows) {
  return mask.causal ? std::clamp(i0 + rows + a.Tk - a.Tq, 0, a.Tk) : a.Tk;
}

// exp(x - shift) over a tile row of cols whose first `visible` keys are
// within the causal limit; exactly 0 where a key is masked (past the limit,
// or padded: pad, the tile's bytes, or nullptr). Eigen's vectorised exp.
template <class S>
void exp_shifted(S* x, int visible, int cols, S shift, const std::uint8_t* pad) {
  Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>> e(x, visible);
  e = (e - shift).exp();
  std::fill(x + visible, x + cols, S(0));
  if (pad)
    for (int c = 0; c < visible; ++c)
      if (pad[c]) x[c] = S(0);
}

// In place over a tile, the dropout mask of probabilities element
// ((b H + h) Tq + i0 + r) Tk + j0 + c, times 1 / (1 - rate).
template <class S>
void flash_dropout(const AttentionDims& a, long bh, int i0, int rows, int j0, int cols, S* t, int ldt) {
  const S keep_scale = S(1) / (S(1) - S(a.dropout));
  for (int r = 0; r < rows; ++r) {
    const long first = (bh * a.Tq + i0 + r) * a.Tk + j0;
    S* tr = t + long(r) * ldt;
    for (int c = 0; c < cols; ++c)
      tr[c] = dropout_keeps(a.dropout_key, std::uint64_t(first + c), a.dropout) ? tr[c] * keep_scale : S(0);
  }
}

template <class S>
void flash_attention_forward(const AttentionDims& a, const S* q, int ldq, const S* k, int ldk, const S* v, int ldv,
                             S* y, int ldy, S* lse, const AttentionMask& mask, S* scratch, bool bf16 = false) {
  constexpr S kNegInf = -std::numeric_limits<S>::infinity();
  const S scale = S(1) / std::sqrt(S(a.QK_DIM));
  const bool drop = a.dropout > 0.0f, own_region = may_fork();
  const long work = long(a.B) * a.H * a.Tq * a.Tk * (a.QK_DIM + a.V_DIM);
  const FlashTile tile = flash_tile(bf16);
  const int R = tile.rows, C = tile.keys;
  parallel_ranges(long(a.B) * a.H, work > kAttentionParallelWork, [=](long lo, long hi) {
    S* s = scratch + (own_region ? thread_index() : 0) * flash_forward_tiles(bf16);
    S* m = s + long(R) * C;
    S* l = m + R;
    for (long bh = lo; bh < hi; ++bh) {
      const int b = int(bh / a.H), h = int(bh % a.H);
      const S* qb = q + long(b) * a.Tq * ldq + long(h) * a.QK_DIM;
      const S* kb = k + long(b) * a.kv_rows() * ldk + long(a.kv_head(h)) * a.QK_DIM;
      const S* vb = v + long(b) * a.kv_rows() * ldv + long(a.kv_head(h)) * a.V_DIM;
      S* yb = y + long(b) * a.Tq * ldy + long(h) * a.V_DIM;
      for (int i0 = 0; i0 < a.Tq; i0 += R) {
        const int rows = std::min(R, a.Tq - i0);
        std::fill(m, m + rows, kNegInf);
        std::fill(l, l + rows, S(0));
        for (int r = 0; r < rows; ++r) std::fill_n(yb + long(i0 + r) * ldy, a.V_DIM, S(0));
        const int end = flash_key_end(a, mask, i0, rows);
        for (int j0 = 0; j0 < end; j0 += C) {
          const int cols = std::min(C, end - j0);
          flash_scores(bf16, a, b, i0, rows, j0, cols, scale, qb, ldq, kb, ldk, mask, s, C);
          const std::uint8_t* pad = tile_padding(a, mask, b, j0);
          for (int r = 0; r < rows; ++r) {
            S* sr = s + long(r) * C;
            const S top = std::max(m[r], *std::max_element(sr, sr + cols));
            if (top == kNegInf) {  // nothing visible yet: the row stays zero
              std::fill(sr, sr + cols, S(0));
              continue;
            }
            exp_shifted(sr, tile_visible(a, mask, i0 + r, j0, cols), cols, top, pad);
            const S rescale = std::exp(m[r] - top);  // 0 on the first visible tile
            l[r] = l[r] * rescale + Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>(sr, cols).sum();
            m[r] = top;
            if (rescale != S(1))
              Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>(yb + long(i0 + r) * ldy, a.V_DIM) *= rescale;
          }
          if (drop) flash_dropout(a, bh, i0, rows, j0, cols, s, C);
          tile_product(bf16, false, false, rows, a.V_DIM, cols, S(1), s, C, vb + long(j0) * ldv, ldv, S(1),
                       yb + long(i0) * ldy, ldy);
        }
        S* lse_b = lse + bh * a.Tq + i0;
        for (int r = 0; r < rows; ++r) {
          if (l[r] > S(0)) {
            Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>(yb + long(i0 + r) * ldy, a.V_DIM) *= S(1) / l[r];
            lse_b[r] = m[r] + std::log(l[r]);
          } else {
            lse_b[r] = kNegInf;
          }
        }
      }
    }
  });
}

template <class S>
void flash_attention_backward(const AttentionDims& a, const S* dy, int ldy, const S* y, int ldo, const S* q, int ldq,
                              const S* k, int ldk, const S* v, int ldv, const S* lse, const AttentionMask& mask, S* dq,
                              S* dk, S* dv, S* scratch, bool bf16 = false) {
  constexpr S kNegInf = -std::numeric_limits<S>::infinity();
  const S scale = S(1) / std::sqrt(S(a.QK_DIM));
  const bool drop = a.dropout > 0.0f, own_region = may_fork();
  const int KVH = a.kv_heads(), group = a.H / KVH;
  const long work = long(a.B) * a.H * a.Tq * a.Tk * (a.QK_DIM + a.V_DIM);
  const FlashTile tile = flash_tile(bf16);
  const int R = tile.rows, C = tile.keys;
  parallel_ranges(long(a.B) * KVH, work > kParallelWork, [=](long lo, long hi) {
    S* p = scratch + (own_region ? thread_index() : 0) * flash_backward_tiles(bf16);  // P, then dS
    S* dp = p + long(R) * C;                                    // dropped P, then dP
    S* dot = dp + long(R) * C;                                  // D per row
    for (long i_ = lo; i_ < hi; ++i_) {
      const int b = int(i_ / KVH), g = int(i_ % KVH);
      const S* kb = k + long(b) * a.Tk * ldk + long(g) * a.QK_DIM;
      const S* vb = v + long(b) * a.Tk * ldv + long(g) * a.V_DIM;
      S* dkb = dk + long(b) * a.Tk * ldk + long(g) * a.QK_DIM;
      S* dvb = dv + long(b) * a.Tk * ldv + long(g) * a.V_DIM;
      for (int j = 0; j < a.Tk; ++j) {
        std::fill_n(dkb + long(j) * ldk, a.QK_DIM, S(0));
        std::fill_n(dvb + long(j) * ldv, a.V_DIM, S(0));
      }
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const long bh = long(b) * a.H + h;
        const S* qb = q + long(b) * a.Tq * ldq + long(h) * a.QK_DIM;
        const S* dyb = dy + long(b) * a.Tq * ldy + long(h) * a.V_DIM;
        const S* yb = y + long(b) * a.Tq * ldo + long(h) * a.V_DIM;
        const S* lse_b = lse + bh * a.Tq;
        S* dqb = dq + long(b) * a.Tq * ldq + long(h) * a.QK_DIM;
        for (int i0 = 0; i0 < a.Tq; i0 += R) {
          const int rows = std::min(R, a.Tq - i0);
          for (int r = 0; r < rows; ++r) {
            const long row = i0 + r;
            std::fill_n(dqb + row * ldq, a.QK_DIM, S(0));
            S d = 0;
            for (int c = 0; c < a.V_DIM; ++c) d += dyb[row * ldy + c] * yb[row * ldo + c];
            dot[r] = d;
          }
          const int end = flash_key_end(a, mask, i0, rows);
          for (int j0 = 0; j0 < end; j0 += C) {
            const int cols = std::min(C, end - j0);
            flash_scores(bf16, a, b, i0, rows, j0, cols, scale, qb, ldq, kb, ldk, mask, p, C);
            const std::uint8_t* pad = tile_padding(a, mask, b, j0);
            for (int r = 0; r < rows; ++r) {
              S* pr = p + long(r) * C;
              if (lse_b[i0 + r] == kNegInf) std::fill(pr, pr + cols, S(0));
              else exp_shifted(pr, tile_visible(a, mask, i0 + r, j0, cols), cols, lse_b[i0 + r], pad);
            }
            const S* weights = p;
            if (drop) {
              for (int r = 0; r < rows; ++r) std::copy_n(p + long(r) * C, cols, dp + long(r) * C);
              flash_dropout(a, bh, i0, rows, j0, cols, dp, C);
              weights = dp;
            }
            tile_product(bf16, true, false, cols, a.V_DIM, rows, S(1), weights, C, dyb + long(i0) * ldy, ldy,
                         S(1), dvb + long(j0) * ldv, ldv);
            tile_product(bf16, false, true, rows, cols, a.V_DIM, S(1), dyb + long(i0) * ldy, ldy, vb + long(j0) * ldv,
                         ldv, S(0), dp, C);
            if (drop) flash_dropout(a, bh, i0, rows, j0, cols, dp, C);
            for (int r = 0; r < rows; ++r) {
              S* pr = p + long(r) * C;
              const S* dpr = dp + long(r) * C;
              for (int c = 0; c < cols; ++c) pr[c] *= dpr[c] - dot[r];  // dS, in P's place
            }
            tile_product(bf16, false, false, rows, a.QK_DIM, cols, scale, p, C, kb + long(j0) * ldk, ldk,
                         S(1), dqb + long(i0) * ldq, ldq);
            tile_product(bf16, true, false, cols, a.QK_DIM, rows, scale, p, C, qb + long(i0) * ldq, ldq,
                         S(1), dkb + long(j0) * ldk, ldk);
          }
        }
      }
    }
  });
}

}  // namespace XFMR_CPU_OPS_NS
}  // namespace xfmr::detail
