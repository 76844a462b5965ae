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
// translate_sentences does the same from and to text (below), in one
// process or across the ranks of a ProcessGroup; write_attention_map
// draws a sentence's cross-attention.
#pragma once

#include <algorithm>
#include <sstream>
#include <string>
#include <cstdint>
#include <span>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/infer/beam_search.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/models/translation_model.hpp"
#include "xfmr/text/translation.hpp"
#include "xfmr/text/text.hpp"
#include "xfmr/core/distributed.hpp"

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

// Sentences of text translated through a TranslationVocabs
// (text/translation.hpp): encoded (a sentence over max_len tokens an error
// naming `file`'s line, or cut with `truncate`), translated in batches,
// decoded, the weights read from their decoding copies (WeightCopies: in
// float32 the panels of a step of a few beams).
template <class Model, class Backend>
std::vector<std::string> translate_sentences(Model& model, Backend& be, const TranslationVocabs& v,
                                             const std::vector<std::string>& lines, const BeamOptions& beam, int batch,
                                             int max_len, bool truncate, const std::string& file) {
  const auto srcs = encode_sentences(v.src, lines, max_len, truncate, file);
  const WeightCopies weight_copies(be, model);  // the steps' products read the weights' copies
  std::vector<std::string> out;
  for (const Hypothesis& h : translate(model, be, std::span(srcs), v.pad(), beam, batch))
    out.push_back(v.tgt.decode(h.tokens));
  return out;
}

// translate_sentences across processes (`group`): rank r translates its
// run of whole batches (so every batch holds the sentences it holds in one
// process) and every rank gets all the translations, in order.
template <class Model, class Backend>
std::vector<std::string> translate_sentences(ProcessGroup& group, Model& model, Backend& be,
                                             const TranslationVocabs& v, const std::vector<std::string>& lines,
                                             const BeamOptions& beam, int batch, int max_len, bool truncate,
                                             const std::string& file) {
  if (group.size() == 1) return translate_sentences(model, be, v, lines, beam, batch, max_len, truncate, file);
  const std::size_t batches = (lines.size() + std::size_t(batch) - 1) / std::size_t(batch);
  auto first_line = [&](int r) {
    return std::min(lines.size(), batches * std::size_t(r) / std::size_t(group.size()) * std::size_t(batch));
  };
  const std::vector<std::string> mine(lines.begin() + std::ptrdiff_t(first_line(group.rank())),
                                      lines.begin() + std::ptrdiff_t(first_line(group.rank() + 1)));
  std::string joined;  // one translation a line (a translation holds no newline)
  for (const auto& t : translate_sentences(model, be, v, mine, beam, batch, max_len, truncate, file))
    joined += t + "\n";
  std::vector<std::string> out;
  for (const std::string& part : group.all_gather(joined))
    for (std::size_t at = 0, nl; (nl = part.find('\n', at)) != std::string::npos; at = nl + 1)
      out.push_back(part.substr(at, nl - at));
  require(out.size() == lines.size(), "translations gathered from the ranks: ", out.size(), " for ", lines.size(),
          " sentences");
  return out;
}

// The cross-attention of the last decoder layer for one sentence (averaged
// over heads, or one head: `head` >= 0), as an SVG heatmap written to
// `path`: rows target, columns source.
template <class Backend>
void write_attention_map(TranslationModel<Backend>& model, Backend& be, const TranslationVocabs& v, const std::string& src_line,
                         const std::string& translation, const std::string& path, int head, int max_len) {
  // What the translation read and wrote: at most max_len tokens each (a
  // longer input was cut by --truncate; a translation stops at max_len).
  auto src = v.src.encode(src_line), tgt = v.tgt.encode(translation);
  if (src.size() > std::size_t(max_len)) src.resize(std::size_t(max_len));
  if (tgt.size() > std::size_t(max_len)) tgt.resize(std::size_t(max_len));
  std::vector<std::int32_t> tgt_in = {v.bos()};
  tgt_in.insert(tgt_in.end(), tgt.begin(), tgt.end());
  const int S = static_cast<int>(src.size()), T = static_cast<int>(tgt_in.size());
  const int last = model.preset().n_layers - 1;
  model.keep_cross_attention(last, true);  // not tiled: the map reads them
  model.forward(be, src, Shape{1, S}, nullptr, tgt_in, Shape{1, T});
  model.keep_cross_attention(last, false);
  std::vector<float> staging;
  const auto probs = be.host_view(model.cross_attention(last), staging);  // (1, heads, T, S)
  const int heads = static_cast<int>(probs.size() / (std::size_t(T) * S));
  require(head < heads, "--head ", head, " out of range [0, ", heads, ")");
  std::vector<double> m(std::size_t(T) * S, 0.0);
  for (int h = 0; h < heads; ++h) {
    if (head >= 0 && h != head) continue;
    for (std::size_t i = 0; i < m.size(); ++i) m[i] += probs[std::size_t(h) * T * S + i] / (head >= 0 ? 1 : heads);
  }
  // Row t is the step that produced output token t (the last one <eos>).
  std::vector<std::string> rows, cols;
  for (auto id : tgt) rows.push_back(v.tgt.piece(id));
  rows.push_back("<eos>");
  for (auto id : src) cols.push_back(v.src.piece(id));
  const int cell = 28, left = 110, top = 100;
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << left + S * cell + 20 << "' height='" << top + T * cell + 20
      << "' font-family='sans-serif' font-size='12'><rect width='100%' height='100%' fill='white'/>";
  for (int j = 0; j < S; ++j)
    svg << "<text transform='translate(" << left + j * cell + cell / 2 << "," << top - 6 << ") rotate(-60)'>"
        << html_escape(cols[j]) << "</text>";
  for (int i = 0; i < T; ++i) {
    svg << "<text x='" << left - 6 << "' y='" << top + i * cell + cell / 2 + 4 << "' text-anchor='end'>"
        << html_escape(i < int(rows.size()) ? rows[i] : "") << "</text>";
    for (int j = 0; j < S; ++j) {
      const int shade = 255 - int(255 * std::clamp(m[std::size_t(i) * S + j], 0.0, 1.0));
      svg << "<rect x='" << left + j * cell << "' y='" << top + i * cell << "' width='" << cell << "' height='" << cell
          << "' fill='rgb(" << shade << "," << shade << ",255)'><title>" << m[std::size_t(i) * S + j]
          << "</title></rect>";
    }
  }
  svg << "</svg>\n";
  write_text_atomic(path, svg.str());
}

}  // namespace xfmr
