// classification.hpp: text classification's data, from "label<TAB>text"
// rows (datasets.hpp's read_labeled_tsv) to what a Classifier reads: the
// tokens (words, normalised or not, or characters; with a CLS token when
// the model pools on one), sequences cut to the model's context from the
// head or the tail, and a fingerprint of the rows a checkpoint trained on.
// xfmr-classify is a front end to it; infer/classify.hpp evaluates.
// Compiled once (src/classification.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/text/datasets.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

// How word text is cut before the vocabulary sees it: "none" splits on
// whitespace alone; "words" also turns HTML line breaks (<br />, as IMDb
// reviews hold them) into spaces and splits off punctuation (pretokenize);
// "lower" does the same and lower-cases ASCII letters.
std::string normalize_words(std::string_view text, const std::string& mode);
void check_normalize(const std::string& mode, const char* where);
// "head" (a long sequence keeps its first tokens) or "tail" (its last).
void check_truncate(const std::string& truncate);

// Words or characters, behind one interface; serialised into a checkpoint
// (to_json / from_json: a JSON text).
struct ClassificationTokens {
  std::string kind;                // "word" or "char"
  std::string normalize = "none";  // words only: none, words or lower (normalize_words)
  std::optional<WordVocab> words;
  std::optional<CharTokenizer> chars;
  std::int32_t pad = 0, cls = -1;  // cls < 0: no CLS token

  // From the training rows: words seen at least `min_freq` times (at most
  // `max_vocab`, 0: all), of the part of each text a model of context
  // `max_t` reads (`truncate`); or every character. The vocabulary is
  // checked (text/text.hpp's check_vocabulary) for a model of width
  // `d_model`; `source` names the file in errors.
  static ClassificationTokens build(const std::string& kind, const std::string& normalize,
                                    const std::vector<LabeledText>& train, int min_freq, int max_vocab, bool cls,
                                    const std::string& source, int d_model, int max_t, const std::string& truncate);
  int size() const { return words ? words->size() : chars->size() + 2; }
  std::vector<std::int32_t> encode(const std::string& text) const;
  std::string to_json() const;
  static ClassificationTokens from_json(std::string_view json);
};

// Sequences and their labels, as a Classifier of context max_t reads them.
struct EncodedExamples {
  std::vector<std::vector<std::int32_t>> seqs;
  std::vector<int> labels;
  long cut = 0;  // sequences longer than the model reads, cut to fit
};

// Token ids and labels of `rows` (each label below `classes`, else an
// Error naming the example of `source`). A sequence past `max_t` tokens
// (with the CLS token when there is one) keeps its first tokens (truncate
// "head") or its last ("tail"); EncodedExamples::cut counts them.
EncodedExamples encode_examples(const ClassificationTokens& tok, const std::vector<LabeledText>& rows, int classes,
                                int max_t, const std::string& truncate, const std::string& source);

// FNV-1a over the rows, as 16 hex digits: the data a checkpoint trained on.
std::string labeled_rows_hash(const std::vector<LabeledText>& rows);

}  // namespace xfmr
