// sampling.hpp: choosing the next token from a row of logits.
//
// temperature 0 (or below 3e-39) is greedy (arg-max). Otherwise the logits are divided by the
// temperature, softmaxed, restricted to the top_k most likely tokens (0 = no
// limit) and then to the smallest set whose probability reaches top_p (1 = no
// limit), renormalised, and sampled with the given generator. A logit that
// is not a finite number is an error. Only top-p sorts, and only the
// likeliest candidates, so a draw over a large vocabulary costs a pass or
// two over the logits; the draw walks the candidates in no set order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include <Eigen/Core>

#include "xfmr/core/error.hpp"
#include "xfmr/core/rng.hpp"

namespace xfmr {

struct SamplingOptions {
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;

  void validate() const {
    require(temperature >= 0.0 && std::isfinite(temperature), "temperature ", temperature, " must be >= 0");
    require(top_k >= 0, "top-k ", top_k, " must be >= 0 (0 = no limit)");
    require(top_p > 0.0 && top_p <= 1.0, "top-p ", top_p, " outside (0, 1]");
  }
};

namespace detail {
// The first index of the largest of x (not empty), and whether every x is
// finite, in one pass the compiler vectorises: sixteen running maxima and
// sums of v - v (0 for a finite v, NaN otherwise) side by side.
template <class S>
int first_arg_max(std::span<const S> x, bool& finite) {
  constexpr int kLanes = 16;
  const int n = static_cast<int>(x.size());
  S top[kLanes], nan[kLanes];
  for (int j = 0; j < kLanes; ++j) top[j] = x[0], nan[j] = 0;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const S v = x[i + j];
      top[j] = top[j] < v ? v : top[j];
      nan[j] += v - v;
    }
  for (; i < n; ++i) top[0] = top[0] < x[i] ? x[i] : top[0], nan[0] += x[i] - x[i];
  S largest = top[0], sum = 0;
  for (int j = 0; j < kLanes; ++j) largest = largest < top[j] ? top[j] : largest, sum += nan[j];
  finite = sum == 0;
  return static_cast<int>(std::find(x.begin(), x.end(), largest) - x.begin());
}
}  // namespace detail

class Sampler {
 public:
  explicit Sampler(SamplingOptions opts) : opts_(opts) { opts_.validate(); }

  template <class S>
  std::int32_t operator()(std::span<const S> logits, Rng& rng) {
    require(!logits.empty(), "cannot sample from an empty row of logits");
    const int n = static_cast<int>(logits.size());
    // Logits that overflowed (a checkpoint's weights) would draw any id.
    bool finite = true;
    const int best = detail::first_arg_max(logits, finite);
    if (!finite) {
      const auto bad = std::find_if(logits.begin(), logits.end(), [](S v) { return !std::isfinite(double(v)); });
      fail("cannot sample: logit ", bad - logits.begin(), " is ", double(*bad),
           "; the model's logits are not finite numbers (are its weights?)");
    }
    // Greedy at temperature 0, and at one so small that its inverse
    // overflows float32 (below 3e-39: every other weight would be 0).
    if (!std::isfinite(float(1.0 / opts_.temperature))) return best;

    // The candidates: every id, or the top_k most likely (ties by id).
    const auto likelier = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    const double top = double(logits[best]);
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0);
    int k = n;
    if (opts_.top_k > 0 && opts_.top_k < n) {
      k = opts_.top_k;
      std::nth_element(order_.begin(), order_.begin() + (k - 1), order_.end(), likelier);
    }
    // Every id's weight exp((logit - largest) / temperature), in float32
    // and vectorised (Eigen's exp): a draw over GPT-2's 50,257 ids took 0.3
    // ms a row in scalar double.
    weights_.resize(std::size_t(n));
    Eigen::Map<Eigen::ArrayXf>(weights_.data(), n) =
        ((Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>(logits.data(), n).template cast<float>() - float(top)) *
         float(1.0 / opts_.temperature))
            .exp();
    probs_.resize(k);
    double sum = 0.0;
    for (int i = 0; i < k; ++i) sum += probs_[i] = weights_[std::size_t(order_[i])];
    if (opts_.top_p < 1.0) k = nucleus(k, sum, likelier);
    double total = 0.0;
    for (int i = 0; i < k; ++i) total += probs_[i];
    double u = rng.uniform() * total;
    for (int i = 0; i < k; ++i) {
      u -= probs_[i];
      if (u < 0.0) return order_[i];
    }
    return order_[k - 1];
  }

 private:
  // Top-p: moves the smallest set of candidates, most likely first, whose
  // probabilities reach top_p of `sum` to the front of order_ and probs_,
  // and returns its size. Only candidates of at least `floor` times the
  // likeliest's weight are sorted; if those fall short of top_p, the floor
  // drops and the sort takes more (the last floor, 0, all of them).
  template <class Likelier>
  int nucleus(int k, double sum, const Likelier& likelier) {
    for (double floor = 1e-3;; floor = floor > 1e-12 ? floor * 1e-3 : 0.0) {
      int front = 0;
      for (int i = 0; i < k; ++i)
        if (probs_[i] >= floor) std::swap(order_[front], order_[i]), std::swap(probs_[front], probs_[i]), ++front;
      std::sort(order_.begin(), order_.begin() + front, likelier);
      double cum = 0.0;
      for (int i = 0; i < front; ++i) {
        cum += (probs_[i] = weights_[std::size_t(order_[i])]) / sum;
        if (cum >= opts_.top_p) return i + 1;
      }
      if (floor == 0.0) return front;  // rounding kept the sum short of top_p: all of them
    }
  }

  SamplingOptions opts_;
  std::vector<int> order_;     // candidate ids
  std::vector<double> probs_;  // their weights
  std::vector<float> weights_;  // every id's
};

// A drawn token's log-probability, and the likeliest ids' (OpenAI's
// `logprobs`): under softmax(logits / temperature), the distribution a
// Sampler draws from before top-k and top-p (temperature 1 when greedy).
struct TokenLogprob {
  std::int32_t id = 0;
  float logprob = 0;
};
struct TokenLogprobs {
  TokenLogprob token;
  std::vector<TokenLogprob> top;  // the `top` likeliest, most likely first (ties by id)
};

template <class S>
TokenLogprobs token_logprobs(std::span<const S> logits, std::int32_t id, int top, double temperature) {
  require(!logits.empty() && id >= 0 && std::size_t(id) < logits.size(), "logprobs of id ", id, " among ",
          logits.size());
  const double inv = temperature > 0 && std::isfinite(1.0 / temperature) ? 1.0 / temperature : 1.0;
  const double largest = double(*std::max_element(logits.begin(), logits.end()));
  double sum = 0.0;
  for (const S l : logits) sum += std::exp((double(l) - largest) * inv);
  const double log_z = std::log(sum);
  const auto logprob = [&](std::size_t i) { return float((double(logits[i]) - largest) * inv - log_z); };
  TokenLogprobs out{{id, logprob(std::size_t(id))}, {}};
  const std::size_t k = std::min<std::size_t>(std::size_t(std::max(top, 0)), logits.size());
  if (k == 0) return out;
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[std::size_t(a)] > logits[std::size_t(b)] || (logits[std::size_t(a)] == logits[std::size_t(b)] && a < b);
  });
  for (std::size_t i = 0; i < k; ++i) out.top.push_back({order[i], logprob(std::size_t(order[i]))});
  return out;
}

}  // namespace xfmr
