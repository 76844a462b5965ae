// cpu_decode.hpp: detail::DecodeLanes, CpuBackend's fused decoding step:
// one new position of one sequence through every self-attention block in
// a single call (backend.hpp's decode_layers), in two lanes.
//
// Why: a decoding step of a small model streams all of its weights once
// for one row of work, and on a 2-core VM the weights of shakespeare-small
// (0.77 MB) only just fit one core's L2: a step's other memory (the caches,
// the activations) pushes part of them out. Two lanes, one on each core
// (Partner::run_lockstep), each hold half of every layer:
//   - attention: lane 0 the first ceil(H/2) heads, lane 1 the rest: their
//     rows of the fused q/k/v projection, their keys and values (written
//     straight into the cache row), their attention, and their columns of
//     the output projection, which gives a partial sum over D;
//   - feed-forward: the first and second halves of the D_FF units, rows of
//     fc1 and columns of fc2, again a partial sum over D.
// After each sublayer the lanes swap partial sums and both form the same
// residual, x + ((p0 + p1) + bias) in this order, so each keeps an
// identical copy of the stream without a handoff; the layer norms run on
// both. Alone (the partner busy, or measured dearer: the exchanges cost a
// cache line's trip between the cores each), the caller runs both lanes'
// shares itself, with the same arithmetic: the result does not depend on
// which way a step went. Either way the step runs without the blocks' own
// per-operation dispatch and buffers.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>

#include "xfmr/backend/backend.hpp"
#include "xfmr/backend/cpu_gemm.hpp"
#include "xfmr/backend/cpu_partner.hpp"
#include "xfmr/backend/cpu_rows.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr::detail {

// GELU, tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi)
// (CpuBackend's GELU and the decoding step).
template <class S>
inline constexpr S kGeluC = S(0.7978845608028654);
template <class S>
S gelu_tanh(S v) {
  return S(0.5) * v * (S(1) + std::tanh(kGeluC<S> * (v + S(0.044715) * v * v * v)));
}

template <class S>
class DecodeLanes {
 public:
  // x (D) -> y (D) through layers; be provides the layer norm, so that it
  // rounds as the blocks' own forward does (on one thread: D must stay
  // within kParallelWork).
  template <class Be>
  void run(Be& be, const DecodeShape& s, std::span<const DecodeLayer<S>> layers, const S* x, S* y) {
    Plan plan{s, layers.data(), int(layers.size()), x, y, {1, s.H, 1, s.position + 1, s.QK, s.V, 0}};
    plan.attend = row_kernel<S>(plan.dims);
    plan.scale = S(1) / std::sqrt(S(s.QK));
    const int split_heads = (s.H + 1) / 2, split_units = std::min(s.FF, (s.FF / 2 + 15) / 16 * 16);
    // Each lane's buffers, on lines of their own: x, in, part, sum (D), q
    // (H*QK), ctx (H*V), hidden (D_FF), probs (position + 1).
    auto padded = [](long n) { return (n + 15) / 16 * 16; };
    const long sizes[] = {s.D, s.D, s.D, s.D, long(s.H) * s.QK, long(s.H) * s.V, s.FF, s.position + 1L};
    long total = 0;
    for (long n : sizes) total += padded(n);
    for (int l = 0; l < 2; ++l) {
      memory_[l].resize(std::size_t(total));
      S* p = memory_[l].data();
      S** ptrs[] = {&plan.lane[l].x, &plan.lane[l].in, &plan.lane[l].part, &plan.lane[l].sum,
                    &plan.lane[l].q, &plan.lane[l].ctx, &plan.lane[l].hidden, &plan.lane[l].probs};
      for (int i = 0; i < 8; ++i) *ptrs[i] = p, p += padded(sizes[i]);
      plan.lane[l].heads[0] = l == 0 ? 0 : split_heads, plan.lane[l].heads[1] = l == 0 ? split_heads : s.H;
      plan.lane[l].units[0] = l == 0 ? 0 : split_units, plan.lane[l].units[1] = l == 0 ? split_units : s.FF;
    }
    // The partner works from its own copy of the plan: reading the
    // caller's stack on every access would bounce its lines between the
    // cores.
    const auto step = [&be, &plan](int l, Partner::Lockstep& lockstep) {
      const Plan mine = plan;
      lane_step(be, mine, l, lockstep);
    };
    Partner::instance().run_lockstep(step, s.D * sizeof(S));
  }

 private:
  struct Lane {
    int heads[2], units[2];  // this lane's heads and feed-forward units
    S *x, *in, *part, *sum;  // (D): residual, sublayer input, partial sum, PostNorm sum
    S *q, *ctx, *hidden, *probs;
  };
  struct Plan {
    DecodeShape s;
    const DecodeLayer<S>* layers;
    int n_layers;
    const S* x;
    S* y;
    AttentionDims dims;
    AttendRow<S> attend = nullptr;
    S scale = 0;
    Lane lane[2] = {};
  };

  // Lane l's share of sublayer `sub` (0 attention, 1 feed-forward) of
  // layer w for the normalised (PreNorm) or raw input `in`: lane.part (D).
  static void share(const Plan& p, const Lane& lane, int sub, const DecodeLayer<S>& w, const S* in) {
    const DecodeShape& s = p.s;
    const int t = s.position, qkv_rows = s.H * s.QK, ctx_w = s.H * s.V;
    S* part = lane.part;
    if (sub == 0) {
      const int h0 = lane.heads[0], h1 = lane.heads[1];
      if (h0 == h1) {
        std::fill_n(part, s.D, S(0));
        return;
      }
      const int qk0 = h0 * s.QK, qk1 = h1 * s.QK, v0 = h0 * s.V, v1 = h1 * s.V;
      S* k = w.keys + long(t) * qkv_rows;
      S* v = w.values + long(t) * ctx_w;
      const long ld = s.D;
      gemv(qk0, qk1, s.D, w.qkv_weight, ld, in, lane.q);                                   // q rows
      gemv(0, qk1 - qk0, s.D, w.qkv_weight + (qkv_rows + qk0) * ld, ld, in, k + qk0);      // k rows
      gemv(0, v1 - v0, s.D, w.qkv_weight + (2 * qkv_rows + v0) * ld, ld, in, v + v0);      // v rows
      if (w.qkv_bias) {
        for (int i = qk0; i < qk1; ++i) lane.q[i] += w.qkv_bias[i];
        for (int i = qk0; i < qk1; ++i) k[i] += w.qkv_bias[qkv_rows + i];
        for (int i = v0; i < v1; ++i) v[i] += w.qkv_bias[2 * qkv_rows + i];
      }
      for (int h = h0; h < h1; ++h)
        p.attend(0, 0, p.dims, p.scale, lane.q + h * s.QK, w.keys + h * s.QK, qkv_rows, w.values + h * s.V, ctx_w,
                 lane.probs, lane.ctx + h * s.V, AttentionMask{true, nullptr});
      gemv(0, s.D, v1 - v0, w.proj_weight + v0, ctx_w, lane.ctx + v0, part);
    } else {
      const int f0 = lane.units[0], f1 = lane.units[1];
      if (f0 == f1) {
        std::fill_n(part, s.D, S(0));
        return;
      }
      S* h = lane.hidden;
      gemv(f0, f1, s.D, w.fc1_weight, s.D, in, h);
      if (w.fc1_bias)
        for (int i = f0; i < f1; ++i) h[i] += w.fc1_bias[i];
      for (int i = f0; i < f1; ++i) h[i] = s.gelu ? gelu_tanh(h[i]) : h[i] > S(0) ? h[i] : S(0);
      gemv(0, s.D, f1 - f0, w.fc2_weight + f0, s.FF, h + f0, part);
    }
  }

  // Lane l's whole step; alone, lane 0 runs lane 1's shares too.
  template <class Be>
  static void lane_step(Be& be, const Plan& p, int l, Partner::Lockstep& lockstep) {
    const DecodeShape& s = p.s;
    const Lane& lane = p.lane[l];
    const S* cur = p.x;  // this lane's residual stream: the input, then lane.x
    S mean, rstd;
    for (int i = 0; i < p.n_layers; ++i) {
      const DecodeLayer<S>& w = p.layers[i];
      for (int sub = 0; sub < 2; ++sub) {
        const S* gamma = sub == 0 ? w.ln1_weight : w.ln2_weight;
        const S* beta = sub == 0 ? w.ln1_bias : w.ln2_bias;
        const S eps = sub == 0 ? w.ln1_eps : w.ln2_eps;
        const S* in = cur;
        if (s.pre_norm) {
          be.layer_norm_forward(1, s.D, cur, gamma, beta, eps, lane.in, &mean, &rstd);
          in = lane.in;
        }
        share(p, lane, sub, w, in);
        const S* other;
        if (lockstep.paired(l)) {
          other = static_cast<const S*>(lockstep.exchange(l, lane.part, s.D * sizeof(S)));
        } else {
          share(p, p.lane[1], sub, w, in);
          other = p.lane[1].part;
        }
        const S* p0 = l == 0 ? lane.part : other;
        const S* p1 = l == 0 ? other : lane.part;
        const S* bias = sub == 0 ? w.proj_bias : w.fc2_bias;
        const bool last = i + 1 == p.n_layers && sub == 1;
        S* out = last && l == 0 ? p.y : lane.x;
        S* sum = s.pre_norm ? out : lane.sum;
        for (int d = 0; d < s.D; ++d) sum[d] = cur[d] + ((p0[d] + p1[d]) + (bias ? bias[d] : S(0)));
        if (!s.pre_norm) be.layer_norm_forward(1, s.D, sum, gamma, beta, eps, out, &mean, &rstd);
        cur = out;
      }
    }
  }

  AlignedVector<S> memory_[2];  // each lane's buffers
};

}  // namespace xfmr::detail
