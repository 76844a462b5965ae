// gpt2_bpe.hpp: GPT-2's byte-level BPE tokenizer, read from its own files,
// encoder.json (symbol -> id) and vocab.bpe (merges, highest priority first),
// or from a Hugging Face tokenizer.json of the same kind (GPT-2's,
// SmolLM's): load_json reads model.vocab, model.merges ("a b" or ["a",
// "b"]) and added_tokens (special tokens); its pre_tokenizer must be
// ByteLevel (use_regex, no add_prefix_space), or a Sequence of Digits
// (individual_digits) and ByteLevel, which first makes every ASCII digit a
// piece of its own, or a Sequence of an isolating Split on Qwen2's or
// Llama 3's pattern (contractions in any case, letters with one leading
// non-letter, single digits or runs of up to three, newlines apart) and
// ByteLevel without use_regex; a normalizer, byte fallback, word affixes
// or another pattern are refused by name. A GGUF file's byte-level
// tokenizer (io/model_tokenizer.hpp) reads as the tokenizer.json json_of
// writes of its lists. A byte a tokenizer.json has no token for is dropped from
// the encoding, as Hugging Face's tokenizers do (GPT-2's files must have
// all 256): missing_bytes() counts those bytes, and encode() counts what
// it dropped, for the caller to report.
//
// encode(): the text is split at the special tokens ("<|endoftext|>", id
// 50256 in GPT-2's files), each part by GPT-2's pre-tokenizer (contractions,
// runs of letters, of digits, of other characters, each with one leading
// space, and whitespace) through PCRE2 with Unicode properties; each piece's
// bytes, mapped to printable characters as GPT-2 maps them, are merged by
// rank. Bytes that are not valid UTF-8 become pieces of their own, so that
// decode(encode(x)) == x for any bytes. decode() concatenates the tokens'
// bytes. Ids outside the vocabulary, and malformed files, are xfmr::Error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <utility>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace xfmr {

class Gpt2Tokenizer {
 public:
  static constexpr std::string_view kEndOfText = "<|endoftext|>";

  static Gpt2Tokenizer load(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe);
  static Gpt2Tokenizer load_json(const std::filesystem::path& tokenizer_json);
  // A tokenizer.json's text; `source` names it in errors.
  static Gpt2Tokenizer parse_json(std::string_view text, const std::string& source);

  // `dropped`, when given, counts the bytes of `text` left out (above).
  std::vector<std::int32_t> encode(std::string_view text, std::size_t* dropped = nullptr) const;
  std::string decode(std::span<const std::int32_t> ids) const;

  int size() const { return static_cast<int>(bytes_.size()); }
  // How many of the 256 bytes have no token of their own (0 for GPT-2's files).
  int missing_bytes() const;
  // The tokenizer as a GGUF file holds one (io/gguf_model.hpp): the
  // symbols by id, the merges by rank ("a b"), the special tokens' ids,
  // and its pre-tokenizer by llama.cpp's name: "gpt-2", "smollm" (digits
  // apart first), "qwen2" or "llama-bpe" (Llama 3's).
  std::vector<std::string> symbols() const;
  std::vector<std::string> merges() const;
  std::vector<std::int32_t> special_ids() const;
  std::string_view pre_tokenizer() const;
  // The tokenizer.json of such lists (parse_json reads it); a
  // pre-tokenizer of another name is an Error naming `source`.
  static std::string json_of(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
                             const std::vector<std::int32_t>& specials, std::string_view pre,
                             const std::string& source);

  // "<|endoftext|>"'s id, or -1 when the vocabulary has none.
  std::int32_t end_of_text() const { return end_of_text_; }

 private:
  Gpt2Tokenizer();
  static Gpt2Tokenizer read_tokenizer_json(std::string_view text, const std::string& source);
  // The vocabulary (symbol, id) and the special tokens among its symbols.
  void set_vocabulary(const std::vector<std::pair<std::string, std::int64_t>>& vocab,
                      const std::vector<std::string>& specials, const std::string& source);
  void add_merge(std::string_view a, std::string_view b, const std::string& where);
  void encode_piece(std::string_view piece, std::vector<std::int32_t>& out, std::size_t* dropped) const;
  void encode_text(std::string_view text, std::vector<std::int32_t>& out, std::size_t* dropped) const;  // between special tokens
  void encode_run(std::string_view text, std::vector<std::int32_t>& out, std::size_t* dropped) const;   // the pre-tokenizer's pieces

  std::unordered_map<std::string, std::int32_t> ids_;   // mapped symbol -> id
  std::vector<std::string> bytes_;                      // id -> the bytes it stands for
  std::unordered_map<std::string, int> ranks_;          // "a b" (mapped symbols) -> merge rank
  std::string byte_symbol_[256];                        // a byte's printable stand-in (UTF-8)
  std::int32_t end_of_text_ = -1;
  std::vector<std::pair<std::string, std::int32_t>> specials_;  // longest first
  enum class Pattern { gpt2, qwen2, llama3 } pattern_ = Pattern::gpt2;  // the pre-tokenizer's
  bool split_digits_ = false;
  bool byte_tokens_required_ = false;
};

}  // namespace xfmr
