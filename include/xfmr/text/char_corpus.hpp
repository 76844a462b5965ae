// char_corpus.hpp: a character-level language model's corpus (as
// xfmr-charlm trains on): a UTF-8 text file split into training and
// validation parts, either as one stream of characters ("text": the first
// 1 - val_fraction of the characters train) or as names, one a line
// ("names": a seeded split of the lines), and its batches: random windows
// of the stream, or names padded to the context, each with its targets.
// Compiled once (src/char_corpus.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xfmr/core/rng.hpp"
#include "xfmr/text/datasets.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

struct CharCorpus {
  std::string train, val;                           // text mode
  std::vector<std::string> train_names, val_names;  // names mode
  std::uint64_t hash = 0;                           // FNV-1a of the file (core/hash.hpp)
  std::string all_text() const;                     // every character, for a tokenizer
};

// The corpus of `path` in `mode` ("text" or "names"), checked as UTF-8 when
// it is read (the error names the line); in names mode every name must fit
// a context of `length` positions with its separator (the error names the
// file's line), and the split is drawn from `seed`.
CharCorpus load_char_corpus(const std::string& path, const std::string& mode, double val_fraction,
                            std::uint64_t seed, int length);

// Training and evaluation batches of one part of a corpus, in either mode.
class CharBatches {
 public:
  // `train`: the training part, else the validation part; `data` names the
  // file in errors (a part with too few characters for one window).
  CharBatches(const CharCorpus& c, const CharTokenizer& tok, const std::string& mode, int batch, int length,
              bool train, const std::string& data);
  // A training batch drawn from rng: ids and targets, batch x length each.
  void sample(Rng& rng, std::int32_t* ids, std::int32_t* targets) const;
  // Evaluation batches: fixed random windows (text), or the names in order,
  // all of them when `cap` allows (names).
  int eval_count(int cap) const;
  void eval_batch(int i, std::int32_t* ids, std::int32_t* targets) const;
  std::size_t size() const;  // characters, or names

 private:
  std::vector<std::int32_t> ids_;
  std::optional<LmBatcher> lm_;
  std::optional<SequenceBatcher> seq_;
};

}  // namespace xfmr
