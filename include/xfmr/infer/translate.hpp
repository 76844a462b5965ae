// translate.hpp: a Seq2Seq model's translations of many source sentences,
// in batches: each batch padded to its longest source (key padding masks
// the rest), encoded once, and decoded by beam search through the
// decoder's caches (beam_search.hpp; beam 1 is greedy).
//
//   const auto hyps = xfmr::translate(model, be, sources, pad_id, {.beam = 4, .max_len = 63}, 32);
//
// sources: token ids, none longer than the model's context (an empty one
// is a batch row of padding); returns each source's best hypothesis, in
// order, the model in evaluation mode. The batch size changes which
// sentences share a batch, not the translations (test_translate).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/infer/beam_search.hpp"

namespace xfmr {

template <class Model, class Backend>
std::vector<Hypothesis> translate(Model& model, Backend& be, std::span<const std::vector<std::int32_t>> sources,
                                  std::int32_t pad, const BeamOptions& beam, int batch) {
  require(batch > 0, "translate: batch ", batch, " must be positive");
  model.set_training(false);
  std::vector<Hypothesis> out;
  out.reserve(sources.size());
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> padding;  // (B, S), 1 = pad
  std::vector<typename Backend::Scalar> staging;  // the logits on the host
  for (std::size_t i = 0; i < sources.size(); i += std::size_t(batch)) {
    const int B = static_cast<int>(std::min<std::size_t>(std::size_t(batch), sources.size() - i));
    int S = 1;
    for (int r = 0; r < B; ++r) S = std::max<int>(S, static_cast<int>(sources[i + r].size()));
    ids.assign(std::size_t(B) * S, pad);
    padding.assign(std::size_t(B) * S, 1);
    for (int r = 0; r < B; ++r)
      for (std::size_t t = 0; t < sources[i + r].size(); ++t)
        ids[std::size_t(r) * S + t] = sources[i + r][t], padding[std::size_t(r) * S + t] = 0;
    model.encode(be, ids, Shape{B, S}, padding.data());
    typename Model::DecodeState st;
    model.start_decoding(be, st, beam.beam);
    auto hyps = beam_search(
        B, model.vocab(), beam,
        [&](std::span<const std::int32_t> step) { return be.host_view(model.decode(be, step, st), staging); },
        [&](std::span<const int> order) { st.self.reorder(be, order); });
    for (auto& h : hyps) out.push_back(std::move(h));
  }
  return out;
}

}  // namespace xfmr
