// llama2c_tokenizer.hpp: llama2.c's tokenizer.bin, a SentencePiece-style
// BPE vocabulary with scores (Llama 2's and the TinyStories models'):
//
//   int32 max_token_length, then for every id in order: float32 score,
//   int32 length, the piece's bytes (little-endian, no terminator).
//
// The file does not say its vocabulary size: load() reads pieces to the
// end, and a model's vocabulary is checked against vocab_size().
//
// encode(text, bos, eos), as llama2.c's run.c does it: BOS (id 1) when
// asked; the piece " " when the text is not empty (SentencePiece's dummy
// prefix); each UTF-8 code point as its piece, or where there is none each
// of its bytes as the byte piece <0xHH>, id byte + 3; then, while any
// adjacent pair's concatenation is a piece, the pair whose piece scores
// highest (the leftmost among equals) becomes it; EOS (id 2) when asked.
// The merging compares every pair again after each merge: fine for
// prompts, quadratic for long texts.
// decode(prev, id): the piece's bytes; after BOS a leading space is
// dropped, and a byte piece <0xHH> is its byte. decode(ids) joins them,
// each after the one before it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace xfmr {

class Llama2cTokenizer {
 public:
  static constexpr std::int32_t kBos = 1, kEos = 2, kFirstByte = 3;  // <0x00> is id 3

  // Errors name the path and the entry that is wrong.
  static Llama2cTokenizer load(const std::filesystem::path& file);
  // The same from a tokenizer.bin's bytes; `source` names them in errors.
  static Llama2cTokenizer parse(std::string_view bytes, const std::string& source);

  int vocab_size() const { return int(pieces_.size()); }
  const std::string& piece(std::int32_t id) const;
  float score(std::int32_t id) const { return scores_.at(std::size_t(id)); }

  std::vector<std::int32_t> encode(std::string_view text, bool bos = true, bool eos = false) const;
  std::string decode(std::int32_t prev, std::int32_t id) const;
  std::string decode(std::span<const std::int32_t> ids) const;

 private:
  std::int32_t lookup(std::string_view piece) const;  // -1 when no piece is that

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, std::int32_t> ids_;  // the first id of each piece
  std::int32_t space_ = -1;                            // the dummy prefix " "
};

}  // namespace xfmr
