// window_loss.hpp: a language model's loss on a token stream, in fixed
// windows (perplexity: exp of the mean).
//
//   const xfmr::LossSum sum = xfmr::window_loss(model, be, tokens, 256, 8, 0);
//   std::cout << "perplexity " << std::exp(sum.checked_mean("the model on the text")) << "\n";
//
// Window i predicts tokens [iT + 1, iT + T] from [iT, iT + T); `batch`
// windows go through a forward at a time, at most `windows` of them (0:
// every window that fits). In evaluation mode (no dropout; the model is
// left so). A language model's head and loss run a block of rows at a time
// (head_loss): no batch-sized logits are held. stop(), asked before each
// batch (TrainingLoop::interrupted: a signal), ends it there, the sum
// partial. Deterministic, so that any other implementation computes the
// same number (test/reference/lm_loss.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/function_ref.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/losses.hpp"

namespace xfmr {

template <class Model, class Backend>
LossSum window_loss(Model& model, Backend& be, std::span<const std::int32_t> tokens, int T, int batch, long windows,
                    FunctionRef<bool()> stop = [] { return false; }) {
  require(T > 0 && batch > 0, "window_loss: a window of ", T, " tokens, ", batch, " a batch (both must be positive)");
  const long fit = tokens.empty() ? 0 : long(tokens.size() - 1) / T;
  const long n = windows > 0 ? std::min(windows, fit) : fit;
  require(n > 0, "the text has ", tokens.size(), " tokens, too few for one window of ", T, " + 1");
  model.set_training(false);
  CrossEntropyLoss<Backend> ce;
  LossSum sum;
  std::vector<std::int32_t> ids, targets;
  for (long w = 0; w < n && !stop(); w += batch) {
    const int rows = int(std::min<long>(batch, n - w));
    ids.assign(tokens.begin() + w * T, tokens.begin() + (w + rows) * T);
    targets.assign(tokens.begin() + w * T + 1, tokens.begin() + (w + rows) * T + 1);
    double mean = 0;
    if constexpr (requires { model.head_loss(be, ce, std::span<const std::int32_t>(targets), 0.0); }) {
      model.forward_to_head(be, ids, Shape{rows, T});  // the head and the loss a block of rows at a time
      mean = model.head_loss(be, ce, targets, 0.0).loss;
    } else {
      mean = ce.forward(be, model.forward(be, ids, Shape{rows, T}), targets, model.vocab());
    }
    sum += LossSum{mean * double(targets.size()), long(targets.size())};
  }
  return sum;
}

}  // namespace xfmr
