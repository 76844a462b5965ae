// losses.hpp: objectives and metrics over logits (rows, classes), for
// training and for evaluation (infer/window_loss.hpp, infer/classify.hpp).
//
// CrossEntropyLoss: softmax cross-entropy, mean over rows whose target is not
// ignore_index, optional label smoothing (torch's definition). forward()
// saves the probabilities; backward(dlogits, scale) assigns
// scale * d(mean loss)/d(logits), so gradient accumulation over k
// micro-batches passes scale = 1/k. forward_backward(.., dlogits, scale)
// is the two in one pass over the logits with no probabilities kept (the
// backend's fused cross_entropy_forward_backward; what Trainer uses): the
// same loss and gradient, and dlogits may be the logits' own memory.
// accuracy(): fraction of counted rows whose arg-max is the target.
//
// HeadRows and HeadLoss: a language model's head and loss run together a
// block of rows at a time, so that no logits of the whole batch are held
// (Decoder::forward_to_head and head_loss; what Trainer uses when a forward
// returns HeadRows).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "xfmr/core/error.hpp"

namespace xfmr {

inline constexpr int kIgnoreIndex = -100;

// Targets that count towards a loss (not kIgnoreIndex, the padding).
inline long counted_targets(std::span<const std::int32_t> targets) {
  long n = 0;
  for (std::int32_t t : targets) n += t != kIgnoreIndex;
  return n;
}

// What a forward returns when its head and loss are left to head_loss: the
// number of rows (targets) waiting for them, and no logits.
struct HeadRows {
  int rows = 0;
};

// The rows of one block of head_loss (unless the model is told otherwise):
// 256, or more where 16 MiB of logits of `logit_bytes` each hold more.
inline int head_block_rows(int vocab, std::size_t logit_bytes) {
  return std::max(256, int((std::size_t(16) << 20) / (logit_bytes * std::size_t(std::max(vocab, 1)))));
}

// head_loss's result: the mean loss over the counted targets, and, when it
// is not finite, whether the logits were not (else the loss overflowed).
struct HeadLoss {
  double loss = 0.0;
  bool logits_overflowed = false;
};

// A loss summed over batches without gradients: the sum of each target's
// loss and the number of targets counted.
struct LossSum {
  double total = 0.0;
  long counted = 0;
  double mean() const { return counted ? total / double(counted) : 0.0; }
  // An evaluation's result: the mean, which must be a number (`what` names
  // the evaluation): logits that overflow (a checkpoint's weights) are an
  // error, not a loss of "nan" reported as a success.
  double checked_mean(const std::string& what) const {
    require(std::isfinite(total), what, ": the loss over ", counted, " targets is ", total,
            ": the model's logits are not finite numbers (are its weights?)");
    return mean();
  }
  LossSum& operator+=(const LossSum& o) {
    total += o.total;
    counted += o.counted;
    return *this;
  }
};

template <class Backend>
class CrossEntropyLoss {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;

  explicit CrossEntropyLoss(double label_smoothing = 0.0, int ignore_index = kIgnoreIndex)
      : smoothing_(label_smoothing), ignore_(ignore_index) {
    require(label_smoothing >= 0.0 && label_smoothing < 1.0, "label smoothing ", label_smoothing, " outside [0, 1)");
  }

  double forward(Backend& be, std::span<const A> logits, std::span<const std::int32_t> targets, int classes) {
    require(classes > 0 && logits.size() == targets.size() * std::size_t(classes), "logits hold ", logits.size(),
            " values, expected ", targets.size(), " rows x ", classes, " classes");
    rows_ = static_cast<int>(targets.size());
    classes_ = classes;
    targets_ = targets;
    S* probs = probs_.reserve(logits.size());
    return be.cross_entropy_forward(rows_, classes, logits.data(), targets.data(), ignore_, probs, S(smoothing_));
  }

  void backward(Backend& be, std::span<A> dlogits, double scale = 1.0) {
    require(dlogits.size() == std::size_t(rows_) * classes_, "logit gradient holds ", dlogits.size(),
            " values, expected ", std::size_t(rows_) * classes_);
    be.cross_entropy_backward(rows_, classes_, probs_.data(), targets_.data(), ignore_, S(scale), dlogits.data(),
                              S(smoothing_));
  }

  double forward_backward(Backend& be, std::span<const A> logits, std::span<const std::int32_t> targets, int classes,
                          std::span<A> dlogits, double scale = 1.0) {
    require(classes > 0 && logits.size() == targets.size() * std::size_t(classes), "logits hold ", logits.size(),
            " values, expected ", targets.size(), " rows x ", classes, " classes");
    require(dlogits.size() == logits.size(), "logit gradient holds ", dlogits.size(), " values, expected ",
            logits.size());
    return be.cross_entropy_forward_backward(static_cast<int>(targets.size()), classes, logits.data(), targets.data(),
                                             ignore_, S(scale), dlogits.data(), S(smoothing_));
  }

  int ignore_index() const { return ignore_; }

 private:
  double smoothing_;
  int ignore_;
  int rows_ = 0, classes_ = 0;
  std::span<const std::int32_t> targets_;
  typename Backend::template Buffer<S> probs_;
};

// Correct predictions and counted rows (targets != ignore_index).
struct Accuracy {
  long correct = 0, counted = 0;
  double value() const { return counted ? double(correct) / double(counted) : 0.0; }
  Accuracy& operator+=(const Accuracy& o) {
    correct += o.correct;
    counted += o.counted;
    return *this;
  }
};

template <class S>
Accuracy accuracy(std::span<const S> logits, std::span<const std::int32_t> targets, int classes,
                  int ignore_index = kIgnoreIndex) {
  require(logits.size() == targets.size() * std::size_t(classes), "logits hold ", logits.size(), " values, expected ",
          targets.size(), " rows x ", classes, " classes");
  Accuracy a;
  for (std::size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == ignore_index) continue;
    const S* row = logits.data() + r * classes;
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (row[c] > row[best]) best = c;
    a.correct += best == targets[r];
    ++a.counted;
  }
  return a;
}

}  // namespace xfmr
