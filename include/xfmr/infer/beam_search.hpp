// beam_search.hpp: batched beam search with the GNMT length penalty.
//
// B independent inputs are decoded with `beam` hypotheses each, as B*beam
// sequences (sequence b*beam + k is hypothesis k of input b). Each step:
//   step(ids)      feeds the newest token of every sequence (B*beam ids) and
//                  returns the next-token logits (B*beam, V);
//   reorder(order) makes sequence i continue from sequence order[i]'s state
//                  (its KV cache).
// A hypothesis that emits EOS is finished; its score is log P(y) / lp(|y|)
// with lp(n) = ((5 + n) / 6)^alpha (Wu et al. 2016), |y| counting EOS. An
// input stops when it has `beam` finished hypotheses, or at max_len, where
// its unfinished beams are scored as they stand. The best score wins.
// beam = 1 is greedy decoding.
#pragma once

#include <algorithm>
#include <cmath>
#include <string_view>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "xfmr/core/error.hpp"

namespace xfmr {

struct BeamOptions {
  int beam = 4;
  double length_penalty = 0.6;  // alpha; 0 = none
  int max_len = 64;             // generated tokens, EOS included
  std::int32_t bos = 1, eos = 2;
};

struct Hypothesis {
  std::vector<std::int32_t> tokens;  // generated tokens, EOS excluded
  double log_prob = 0;
  double score = 0;  // log_prob / lp(length)
  bool finished = false;
};

inline double gnmt_length_penalty(int length, double alpha) {
  return std::pow((5.0 + length) / 6.0, alpha);
}

// GNMT's alpha: 0 none, 0.6 usual. Within [-10, 10] the divisor
// ((5 + length) / 6)^alpha is finite and nonzero for any int length; beyond,
// it overflows or vanishes and every score is infinite (the search then
// picks a hypothesis at random, silently).
inline constexpr double kMaxLengthPenalty = 10;
inline void check_length_penalty(double alpha, std::string_view what = "length penalty") {
  require(std::isfinite(alpha) && std::abs(alpha) <= kMaxLengthPenalty, what, " ", alpha, " outside [",
          -kMaxLengthPenalty, ", ", kMaxLengthPenalty, "] (GNMT's alpha: 0 for none, 0.6 usual)");
}

template <class Step, class Reorder>
std::vector<Hypothesis> beam_search(int B, int V, const BeamOptions& opt, Step&& step, Reorder&& reorder) {
  require(opt.beam >= 1, "beam size ", opt.beam, " must be at least 1");
  require(opt.max_len >= 1, "max length ", opt.max_len, " must be at least 1");
  check_length_penalty(opt.length_penalty);
  require(B >= 1 && V >= 2, "beam search over ", B, " inputs and ", V, " tokens");
  const int K = opt.beam, N = B * K;
  const double NEG = -std::numeric_limits<double>::infinity();
  std::vector<std::vector<std::int32_t>> seqs(N);
  std::vector<double> logp(N, NEG);
  for (int b = 0; b < B; ++b) logp[b * K] = 0.0;  // one live hypothesis per input to start
  std::vector<std::vector<Hypothesis>> finished(B);
  std::vector<char> done(B, 0);
  std::vector<std::int32_t> ids(N, opt.bos);
  std::vector<int> order(N);
  std::vector<double> lsm(V);
  struct Cand {
    double logp;
    int parent;
    std::int32_t token;
  };
  std::vector<Cand> cands;
  for (int t = 0; t < opt.max_len; ++t) {
    const auto logits = step(std::span<const std::int32_t>(ids));
    require(logits.size() == std::size_t(N) * V, "step returned ", logits.size(), " logits, expected ", N, " x ", V);
    std::vector<std::vector<std::int32_t>> next_seqs(N);
    std::vector<double> next_logp(N, NEG);
    for (int b = 0; b < B; ++b) {
      for (int k = 0; k < K; ++k) order[b * K + k] = b * K + k;
      if (done[b]) continue;
      cands.clear();
      for (int k = 0; k < K; ++k) {
        const int i = b * K + k;
        if (logp[i] == NEG) continue;
        const auto row = logits.subspan(std::size_t(i) * V, V);
        const double mx = double(*std::max_element(row.begin(), row.end()));
        double sum = 0;
        for (int v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
        const double lse = mx + std::log(sum);
        for (int v = 0; v < V; ++v) cands.push_back({logp[i] + double(row[v]) - lse, k, v});
      }
      const std::size_t keep = std::min<std::size_t>(cands.size(), 2 * K);
      std::partial_sort(cands.begin(), cands.begin() + keep, cands.end(), [](const Cand& x, const Cand& y) {
        return x.logp > y.logp || (x.logp == y.logp && (x.parent < y.parent || (x.parent == y.parent && x.token < y.token)));
      });
      int alive = 0;
      for (std::size_t c = 0; c < keep && alive < K; ++c) {
        const Cand& cd = cands[c];
        const auto& parent = seqs[b * K + cd.parent];
        if (cd.token == opt.eos) {
          if (int(finished[b].size()) < K)
            finished[b].push_back({parent, cd.logp, cd.logp / gnmt_length_penalty(int(parent.size()) + 1, opt.length_penalty), true});
          continue;
        }
        const int i = b * K + alive++;
        order[i] = b * K + cd.parent;
        next_seqs[i] = parent;
        next_seqs[i].push_back(cd.token);
        next_logp[i] = cd.logp;
      }
      if (int(finished[b].size()) >= K) done[b] = 1;
    }
    seqs = std::move(next_seqs);
    logp = std::move(next_logp);
    if (std::all_of(done.begin(), done.end(), [](char d) { return d != 0; })) break;
    reorder(std::span<const int>(order));
    for (int i = 0; i < N; ++i) ids[i] = seqs[i].empty() ? opt.eos : seqs[i].back();
  }
  std::vector<Hypothesis> best(B);
  for (int b = 0; b < B; ++b) {
    auto& f = finished[b];
    if (!done[b])  // ran out of length: score the live beams as they are
      for (int k = 0; k < K; ++k)
        if (logp[b * K + k] != NEG)
          f.push_back({seqs[b * K + k], logp[b * K + k],
                       logp[b * K + k] / gnmt_length_penalty(int(seqs[b * K + k].size()), opt.length_penalty), false});
    require(!f.empty(), "beam search produced no hypothesis for input ", b);
    best[b] = *std::max_element(f.begin(), f.end(), [](const Hypothesis& x, const Hypothesis& y) { return x.score < y.score; });
  }
  return best;
}

}  // namespace xfmr
