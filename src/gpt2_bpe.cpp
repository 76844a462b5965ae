// gpt2_bpe.cpp: GPT-2's byte-level BPE tokenizer (see gpt2_bpe.hpp).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "xfmr/text/gpt2_bpe.hpp"

#include <pcre2.h>

#include <climits>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "json_bounds.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

using nlohmann::json;

namespace {

void append_utf8(std::string& s, std::uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xc0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3f));
  } else {
    s += char(0xe0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3f));
    s += char(0x80 | (cp & 0x3f));
  }
}

// GPT-2's pre-tokenizer, compiled once.
const pcre2_code* pretokenizer() {
  static const std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code = [] {
    const char* pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
    require(c != nullptr, "GPT-2 pre-tokenizer: PCRE2 error ", err, " at ", at);
    return std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)>(c, &pcre2_code_free);
  }();
  return code.get();
}

}  // namespace

Gpt2Tokenizer Gpt2Tokenizer::load(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe) {
  Gpt2Tokenizer t;
  // Bytes to printable characters: the printable Latin-1 bytes stand for
  // themselves, the others for code points 256 and up, in byte order.
  std::uint32_t next = 256;
  std::unordered_map<std::string, unsigned char> byte_of;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    append_utf8(t.byte_symbol_[b], printable ? std::uint32_t(b) : next++);
    byte_of[t.byte_symbol_[b]] = static_cast<unsigned char>(b);
  }

  const std::string text = read_text_file(encoder_json);
  detail::check_json_depth(text, encoder_json.string());
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    detail::fail(encoder_json.string(), ": not valid JSON: ", e.what());
  }
  require(j.is_object() && !j.empty(), encoder_json.string(), ": expected an object of symbol -> id");
  t.bytes_.assign(j.size(), std::string());
  std::vector<bool> seen(j.size(), false);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto id = detail::json_integer(it.value(), 0, std::int64_t(j.size()) - 1, encoder_json.string() + ": id of '" + it.key() + "'");
    require(!seen[std::size_t(id)], encoder_json.string(), ": id ", id, " is given twice");
    seen[std::size_t(id)] = true;
    t.ids_.emplace(it.key(), std::int32_t(id));
    if (it.key() == kEndOfText) {
      t.end_of_text_ = std::int32_t(id);
      t.bytes_[std::size_t(id)] = std::string(kEndOfText);
      continue;
    }
    // The symbol's characters back to bytes.
    std::string& out = t.bytes_[std::size_t(id)];
    const std::string& s = it.key();
    for (std::size_t i = 0; i < s.size();) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      const std::size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : 3;
      const auto b = byte_of.find(s.substr(i, len));
      require(b != byte_of.end(), encoder_json.string(), ": symbol '", s, "' holds a character that stands for no byte");
      out += char(b->second);
      i += len;
    }
  }
  require(t.end_of_text_ >= 0, encoder_json.string(), ": no ", kEndOfText, " token");
  for (int b = 0; b < 256; ++b)
    require(t.ids_.count(t.byte_symbol_[b]), encoder_json.string(), ": byte ", b, " has no token");

  std::istringstream merges(read_text_file(vocab_bpe));
  std::string line;
  int rank = 0;
  long number = 0;
  while (std::getline(merges, line)) {
    ++number;
    if (line.empty() || line.starts_with("#version")) continue;
    const auto space = line.find(' ');
    require(space != std::string::npos && line.find(' ', space + 1) == std::string::npos, vocab_bpe.string(), ":",
            number, ": expected two symbols separated by one space");
    t.ranks_.emplace(line, rank++);
  }
  require(rank > 0, vocab_bpe.string(), ": no merges");
  return t;
}

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
  std::vector<std::string> word;
  for (unsigned char c : piece) word.push_back(byte_symbol_[c]);
  while (word.size() > 1) {
    int best = std::numeric_limits<int>::max();
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto r = ranks_.find(word[i] + " " + word[i + 1]);
      if (r != ranks_.end() && r->second < best) best = r->second, at = i;
    }
    if (best == std::numeric_limits<int>::max()) break;
    // Merge every occurrence of the best pair, left to right.
    const std::string a = word[at], b = word[at + 1];
    std::vector<std::string> merged;
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == a && word[i + 1] == b) {
        merged.push_back(a + b);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  for (const auto& s : word) {
    const auto id = ids_.find(s);
    require(id != ids_.end(), "GPT-2 BPE: merged symbol '", s, "' is not in the vocabulary");
    out.push_back(id->second);
  }
}

void Gpt2Tokenizer::encode_text(std::string_view text, std::vector<std::int32_t>& out) const {
  const pcre2_code* re = pretokenizer();
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(re, nullptr), &pcre2_match_data_free);
  std::size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    require(rc > 0, "GPT-2 pre-tokenizer: PCRE2 match error ", rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[0] > pos) encode_piece(text.substr(pos, ov[0] - pos), out);  // bytes no pattern matches (invalid UTF-8)
    encode_piece(text.substr(ov[0], ov[1] - ov[0]), out);
    pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
  }
  if (pos < text.size()) encode_piece(text.substr(pos), out);
}

std::vector<std::int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  for (;;) {
    const auto at = text.find(kEndOfText);
    encode_text(text.substr(0, at), out);
    if (at == std::string_view::npos) break;
    out.push_back(end_of_text_);
    text.remove_prefix(at + kEndOfText.size());
  }
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (const std::int32_t id : ids) {
    require(id >= 0 && id < size(), "GPT-2 token id ", id, " outside [0, ", size(), ")");
    out += bytes_[std::size_t(id)];
  }
  return out;
}

}  // namespace xfmr
