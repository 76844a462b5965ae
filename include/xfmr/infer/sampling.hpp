// sampling.hpp: choosing the next token from a row of logits.
//
// temperature 0 is greedy (arg-max). Otherwise the logits are divided by the
// temperature, softmaxed, restricted to the top_k most likely tokens (0 = no
// limit) and then to the smallest set whose probability reaches top_p (1 = no
// limit), renormalised, and sampled with the given generator. A logit that
// is not a finite number is an error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

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

class Sampler {
 public:
  explicit Sampler(SamplingOptions opts) : opts_(opts) { opts_.validate(); }

  template <class S>
  std::int32_t operator()(std::span<const S> logits, Rng& rng) {
    require(!logits.empty(), "cannot sample from an empty row of logits");
    // Logits that overflowed (a checkpoint's weights) would draw any id.
    const auto bad = std::find_if(logits.begin(), logits.end(), [](S v) { return !std::isfinite(double(v)); });
    if (bad != logits.end())
      fail("cannot sample: logit ", bad - logits.begin(), " is ", double(*bad),
           "; the model's logits are not finite numbers (are its weights?)");
    const int n = static_cast<int>(logits.size());
    if (opts_.temperature == 0.0)
      return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0);
    const int k = opts_.top_k > 0 ? std::min(opts_.top_k, n) : n;
    // Most likely first; ties by id, so the choice is deterministic.
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    probs_.resize(k);
    const double top = double(logits[order_[0]]);
    double sum = 0.0;
    for (int i = 0; i < k; ++i) sum += probs_[i] = std::exp((double(logits[order_[i]]) - top) / opts_.temperature);
    int keep = k;
    if (opts_.top_p < 1.0) {
      double cum = 0.0;
      for (int i = 0; i < k; ++i) {
        cum += probs_[i] / sum;
        if (cum >= opts_.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    double total = 0.0;
    for (int i = 0; i < keep; ++i) total += probs_[i];
    double u = rng.uniform() * total;
    for (int i = 0; i < keep; ++i) {
      u -= probs_[i];
      if (u < 0.0) return order_[i];
    }
    return order_[keep - 1];
  }

 private:
  SamplingOptions opts_;
  std::vector<int> order_;
  std::vector<double> probs_;
};

}  // namespace xfmr
