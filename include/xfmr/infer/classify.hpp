// classify.hpp: a Classifier's loss and accuracy over encoded examples
// (text/classification.hpp), in batches padded to their longest sequence.
//
//   const ClassifierScore s = xfmr::evaluate_classifier(model, be, dev, pad, cls, max_t, 256);
//
// In evaluation mode (no dropout; the model is left in training mode);
// bf16 or int8 precision reads the weights' copies (WeightCopies). Across
// processes each rank takes its rows of every batch (core/distributed.hpp's
// rank_rows) and the sums are added over the ranks of `group`. stop(),
// asked before each batch (TrainingLoop::interrupted: a signal), ends the
// evaluation there, its numbers partial.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "xfmr/core/function_ref.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/text/classification.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/core/distributed.hpp"

namespace xfmr {

struct ClassifierScore {
  double loss = 0, accuracy = 0;
};

template <class Model, class Backend>
ClassifierScore evaluate_classifier(Model& model, Backend& be, const EncodedExamples& data, std::int32_t pad,
                                    std::int32_t cls, int max_t, int batch,
                                    ProcessGroup& group = ProcessGroup::world(),
                                    FunctionRef<bool()> stop = [] { return false; }) {
  model.set_training(false);
  const WeightCopies weight_copies(be, model, {.panels = false});  // one forward a batch: no decoding panels
  CrossEntropyLoss<Backend> ce;
  Accuracy acc;
  double loss = 0;
  std::vector<float> staging;
  for (std::size_t i = 0; i < data.seqs.size() && !stop(); i += std::size_t(batch)) {
    const auto [first, last] = rank_rows(group, int(std::min<std::size_t>(std::size_t(batch), data.seqs.size() - i)));
    if (first == last) continue;
    const std::size_t at = i + std::size_t(first), n = std::size_t(last - first);
    const auto b = make_class_batch(std::span(data.seqs).subspan(at, n), std::span(data.labels).subspan(at, n), max_t,
                                    pad, cls);
    const auto logits = model.forward(be, b.ids, Shape{b.B, b.T}, b.padding.data());
    loss += ce.forward(be, logits, b.labels, model.classes()) * double(n);
    acc += accuracy<float>(be.host_view(logits, staging), b.labels, model.classes());
  }
  model.set_training(true);
  loss = group.sum(loss);
  acc.correct = long(group.sum(std::int64_t(acc.correct)));
  acc.counted = long(group.sum(std::int64_t(acc.counted)));
  return {loss / double(data.seqs.size()), acc.value()};
}

}  // namespace xfmr
