// text.hpp: reading corpora and turning text into token ids.
//
// read_text_file / read_lines: plain or gzip-compressed files (one or more
//   gzip members), detected by content; a pipe reads like a file (a FIFO
//   nobody writes to within kFifoWaitSeconds is an error). A missing,
//   unreadable, corrupt, empty or over-large (kMaxTextBytes) file, a
//   directory or device, and bytes after the gzip data are each an
//   xfmr::Error naming the file.
// CharTokenizer: one token per Unicode character (UTF-8 code point) seen in a
//   corpus, ids in code-point order; or byte-level (256 tokens, any input).
//   Unknown characters are an error naming the character and its position,
//   or map to an explicit "<unk>" token when built with one. Serialises to
//   JSON for checkpoint metadata.
// WordVocab: whitespace-separated words with a minimum frequency (and, when
//   asked, only the most frequent), special tokens first (e.g. <pad>, <unk>,
//   <cls>); unknown words map to <unk>.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xfmr {

// The most tokens a vocabulary built from training data may hold (an
// embedding row each), and the check of one: more than its `specials` (a
// vocabulary of specials alone reads every word as <unk>), at most
// kMaxVocabulary, and an embedding that trains (its weights, gradients and
// AdamW's two moments: 16 bytes a parameter) in half the machine's memory.
// `what` names the vocabulary and its file, `options` what makes it smaller.
inline constexpr std::size_t kMaxVocabulary = std::size_t(1) << 20;
void check_vocabulary(std::size_t size, std::size_t specials, int d_model, const std::string& what,
                      const std::string& options);

// The most bytes a text file may hold, before and after decompression.
inline constexpr std::size_t kMaxTextBytes = std::size_t(1) << 30;
// How long reading a FIFO waits for its writer's first bytes, and writing
// one (write_file_atomic) for a reader.
inline constexpr int kFifoWaitSeconds = 5;
std::string read_text_file(const std::filesystem::path& path);
// Lines without their '\n' (and a trailing '\r'); the last line may lack
// '\n'. The text must be UTF-8 (check_utf8 names the file and line).
std::vector<std::string> read_lines(const std::filesystem::path& path);

// UTF-8 as Unicode defines it (no overlong forms, no surrogates, nothing
// past U+10FFFF): utf8_character_size is the byte length of the character
// at byte i, or 0 where the bytes there are not one; check_utf8 throws an
// xfmr::Error naming `source` and the line, column and byte of the first
// ill-formed character; utf8_characters splits text into its characters.
std::size_t utf8_character_size(std::string_view text, std::size_t i);
void check_utf8(std::string_view text, const std::string& source);
std::vector<std::string_view> utf8_characters(std::string_view text);
// Streamed text (a decoder's pieces, which may split a character):
// utf8_complete_prefix is the length of text without a last character
// whose remaining bytes have not come yet; utf8_repaired replaces each
// maximal ill-formed subpart by U+FFFD, as Unicode recommends (and
// Python's errors="replace" and browsers do).
std::size_t utf8_complete_prefix(std::string_view text);
std::string utf8_repaired(std::string_view text);

// Word pre-tokenization for translation: optional ASCII lower-casing, then
// the punctuation . , ! ? ; : " ( ) [ ] split off as tokens (apostrophes and
// hyphens stay inside words, as BLEU's 13a tokenization keeps them), then
// whitespace-separated words. detokenize() joins tokens back, without spaces
// before . , ! ? ; : ) ] or after ( [.
std::vector<std::string> pretokenize(std::string_view text, bool lowercase = false);
// The whitespace-separated words of text, as WordVocab reads them.
std::vector<std::string_view> split_words(std::string_view text);
std::string detokenize(std::span<const std::string> words);
// s with HTML's special characters as entities (reports, attention maps).
std::string html_escape(const std::string& s);

class CharTokenizer {
 public:
  static CharTokenizer from_corpus(std::string_view corpus, bool with_unknown = false);
  static CharTokenizer byte_level();
  static CharTokenizer from_json(std::string_view json);

  std::vector<std::int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const std::int32_t> ids) const;
  std::string to_json() const;

  int size() const { return static_cast<int>(tokens_.size()); }
  bool is_byte_level() const { return byte_level_; }
  std::optional<std::int32_t> unknown_id() const { return unknown_; }
  const std::string& token(std::int32_t id) const;
  std::optional<std::int32_t> find(std::string_view token) const;

 private:
  std::vector<std::string> tokens_;
  std::map<std::string, std::int32_t, std::less<>> ids_;
  bool byte_level_ = false;
  std::optional<std::int32_t> unknown_;
};

class WordVocab {
 public:
  // Specials take ids 0.. in order; they must include "<unk>". max_words > 0
  // keeps that many of the most frequent words (specials not counted).
  static WordVocab build(std::span<const std::string> texts, int min_freq,
                         std::vector<std::string> specials = {"<pad>", "<unk>", "<cls>"}, std::size_t max_words = 0);
  static WordVocab from_json(std::string_view json);

  std::vector<std::int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const std::int32_t> ids) const;
  std::string to_json() const;

  int size() const { return static_cast<int>(words_.size()); }
  std::int32_t id(std::string_view word) const;  // <unk> when absent
  std::optional<std::int32_t> special(std::string_view name) const;
  const std::string& word(std::int32_t id) const;

 private:
  std::vector<std::string> words_;
  std::map<std::string, std::int32_t, std::less<>> ids_;
  std::int32_t unknown_ = 0;
  int min_freq_ = 1;
  int specials_ = 0;
};

}  // namespace xfmr
