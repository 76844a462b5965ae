// translation.hpp: a translator's data, from sentence files to what a
// Seq2Seq model reads: each language's tokens (words of pretokenize() in a
// WordVocab, rare ones <unk>, or byte-level BPE pieces), sentences as ids
// (a sentence over the model's length an error naming its line, or cut),
// and batches of sentence pairs of similar source length in a seeded
// order, padded with their key masks, decoder input (<bos> first) and
// targets (<eos> last). xfmr-translate is a front end to it;
// infer/translate.hpp translates. Compiled once (src/translation.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/text/bpe.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

// One language's tokens, with the specials <pad>, <unk>, <bos>, <eos>.
class TranslationCodec {
 public:
  static constexpr std::size_t kSpecials = 4;  // the ids below it
  // Words: the vocabulary of what the model reads, each line's first
  // max_words words, those seen at least min_freq times.
  static TranslationCodec words(const std::vector<std::string>& lines, int min_freq, bool lowercase,
                                std::size_t max_words);
  static TranslationCodec bpe(const std::vector<std::string>& lines, int vocab_size, bool lowercase);
  // kind "word" (the default, as in checkpoints before BPE) or "bpe".
  static TranslationCodec from_json(const std::string& kind, const std::string& text, bool lowercase);
  std::string kind() const;
  std::string to_json() const;

  std::vector<std::int32_t> encode(const std::string& line) const;
  std::string decode(std::span<const std::int32_t> ids) const;
  std::string piece(std::int32_t id) const;  // a token's text, for labels ("</w>" ends a BPE word)
  int size() const;
  std::int32_t special(const char* name) const;
  bool lowercase() const { return lowercase_; }

 private:
  template <class T>
  TranslationCodec(T t, bool lowercase) : v_(std::move(t)), lowercase_(lowercase) {}
  std::variant<WordVocab, BpeTokenizer> v_;
  bool lowercase_;
};

// Both languages' tokens (one joint vocabulary when shared), serialised
// into a checkpoint as a JSON text.
struct TranslationVocabs {
  TranslationCodec src, tgt;
  bool shared = false;  // one joint vocabulary and token table
  std::int32_t pad() const { return tgt.special("<pad>"); }
  std::int32_t bos() const { return tgt.special("<bos>"); }
  std::int32_t eos() const { return tgt.special("<eos>"); }
  std::string to_json() const;
  static TranslationVocabs from_json(std::string_view json);
};

// A file's sentences, one a line (plain or .gz), without a trailing empty line.
std::vector<std::string> read_sentences(const std::string& path);
// Sentences as token ids; an empty one, or one longer than max_len unless
// `truncate` (then cut), is an error naming `file` and the line.
std::vector<std::vector<std::int32_t>> encode_sentences(const TranslationCodec& codec,
                                                        const std::vector<std::string>& lines, int max_len,
                                                        bool truncate, const std::string& file);

struct SentencePair {
  std::vector<std::int32_t> src, tgt;
};

// An epoch's batches of `batch` pairs of similar source length (less
// padding), in an order drawn from `rng`: indices into `pairs`.
std::vector<std::vector<int>> bucket_batches(const std::vector<SentencePair>& pairs, int batch, Rng& rng);

// A batch of pairs as the model reads them: sources padded to the longest
// (src_pad 1 on padding), decoder input <bos> + target, targets target +
// <eos> (kIgnoreIndex on padding); tokens: the targets counted.
struct PairBatch {
  Shape src, tgt;
  std::vector<std::int32_t> src_ids, tgt_in, tgt_out;
  std::vector<std::uint8_t> src_pad, tgt_pad;
  long tokens = 0;
};
PairBatch make_pair_batch(const std::vector<SentencePair>& pairs, const std::vector<int>& which,
                          const TranslationVocabs& v);

}  // namespace xfmr
