// gpt2_bpe.cpp: GPT-2's byte-level BPE tokenizer (see gpt2_bpe.hpp).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "xfmr/text/gpt2_bpe.hpp"

#include <pcre2.h>

#include <algorithm>
#include <array>
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

// The pre-tokenizers' patterns (Gpt2Tokenizer::Pattern's order): GPT-2's,
// and the Split regexes of Qwen2's and Llama 3's tokenizer.json.
constexpr const char* kPatterns[] = {
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
};

// A pre-tokenizer's pattern, compiled once.
const pcre2_code* pretokenizer(int pattern) {
  using Code = std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)>;
  static const std::array<Code, 3> codes = [] {
    auto compile = [](const char* text) {
      int err = 0;
      PCRE2_SIZE at = 0;
      pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text), PCRE2_ZERO_TERMINATED,
                                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
      require(c != nullptr, "BPE pre-tokenizer: PCRE2 error ", err, " at ", at);
      return Code(c, &pcre2_code_free);
    };
    return std::array<Code, 3>{compile(kPatterns[0]), compile(kPatterns[1]), compile(kPatterns[2])};
  }();
  return codes[std::size_t(pattern)].get();
}

// The entries of a JSON object of symbol -> id, ids checked to lie in [0, size).
std::vector<std::pair<std::string, std::int64_t>> vocabulary_entries(const json& vocab, const std::string& source) {
  require(vocab.is_object() && !vocab.empty(), source, ": expected an object of symbol -> id");
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    out.emplace_back(it.key(), detail::json_integer(it.value(), 0, std::int64_t(vocab.size()) - 1,
                                                    source + ": id of '" + it.key() + "'"));
  return out;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer() {
  // Bytes to printable characters: the printable Latin-1 bytes stand for
  // themselves, the others for code points 256 and up, in byte order.
  std::uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    append_utf8(byte_symbol_[b], printable ? std::uint32_t(b) : next++);
  }
}

void Gpt2Tokenizer::set_vocabulary(const std::vector<std::pair<std::string, std::int64_t>>& vocab,
                                   const std::vector<std::string>& specials, const std::string& source) {
  std::unordered_map<std::string, unsigned char> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[byte_symbol_[b]] = static_cast<unsigned char>(b);
  bytes_.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [symbol, id] : vocab) {
    require(!seen[std::size_t(id)], source, ": id ", id, " is given twice");
    seen[std::size_t(id)] = true;
    ids_.emplace(symbol, std::int32_t(id));
    if (std::find(specials.begin(), specials.end(), symbol) != specials.end()) {
      bytes_[std::size_t(id)] = symbol;
      continue;
    }
    // The symbol's characters back to bytes.
    std::string& out = bytes_[std::size_t(id)];
    const std::string& sym = symbol;
    for (std::size_t i = 0; i < sym.size();) {
      const unsigned char c = static_cast<unsigned char>(sym[i]);
      const std::size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : 3;
      const auto b = byte_of.find(sym.substr(i, len));
      require(b != byte_of.end(), source, ": symbol '", sym, "' holds a character that stands for no byte");
      out += char(b->second);
      i += len;
    }
  }
  for (const std::string& sp : specials) {
    const auto id = ids_.find(sp);
    require(id != ids_.end(), source, ": the special token '", sp, "' is not in the vocabulary");
    specials_.emplace_back(sp, id->second);
    if (sp == kEndOfText) end_of_text_ = id->second;
  }
  // The longest first, where two start at the same place.
  std::sort(specials_.begin(), specials_.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

void Gpt2Tokenizer::add_merge(std::string_view a, std::string_view b, const std::string& where) {
  require(!a.empty() && !b.empty() && a.find(' ') == std::string_view::npos && b.find(' ') == std::string_view::npos,
          where, ": expected two symbols separated by one space");
  ranks_.emplace(std::string(a) + " " + std::string(b), int(ranks_.size()));
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe) {
  Gpt2Tokenizer t;
  const std::string text = read_text_file(encoder_json);
  detail::check_json_depth(text, encoder_json.string());
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    detail::fail(encoder_json.string(), ": not valid JSON: ", e.what());
  }
  t.set_vocabulary(vocabulary_entries(j, encoder_json.string()), {std::string(kEndOfText)}, encoder_json.string());
  t.byte_tokens_required_ = true;
  for (int b = 0; b < 256; ++b)
    require(t.ids_.count(t.byte_symbol_[b]), encoder_json.string(), ": byte ", b, " has no token");

  std::istringstream merges(read_text_file(vocab_bpe));
  std::string line;
  long number = 0;
  while (std::getline(merges, line)) {
    ++number;
    if (line.empty() || line.starts_with("#version")) continue;
    const auto space = line.find(' ');
    require(space != std::string::npos, vocab_bpe.string(), ":", number, ": expected two symbols separated by one space");
    t.add_merge(std::string_view(line).substr(0, space), std::string_view(line).substr(space + 1),
                vocab_bpe.string() + ":" + std::to_string(number));
  }
  require(!t.ranks_.empty(), vocab_bpe.string(), ": no merges");
  return t;
}

Gpt2Tokenizer Gpt2Tokenizer::load_json(const std::filesystem::path& tokenizer_json) {
  return parse_json(read_text_file(tokenizer_json), tokenizer_json.string());
}

Gpt2Tokenizer Gpt2Tokenizer::parse_json(std::string_view text, const std::string& source) {
  try {
    return read_tokenizer_json(text, source);
  } catch (const json::exception& e) {  // a field of another type than the format's
    detail::fail(source, ": not a tokenizer.json this library reads: ", e.what());
  }
}

Gpt2Tokenizer Gpt2Tokenizer::read_tokenizer_json(std::string_view text, const std::string& source) {
  const json j = detail::parse_json_object(std::string(text), source, "a tokenizer.json");
  auto field = [&](const json& obj, const char* key, const std::string& where) -> const json& {
    require(obj.is_object() && obj.contains(key), source, ": no ", where, key);
    return obj[key];
  };
  // What this tokenizer computes: byte-level BPE, GPT-2's pre-tokenizer,
  // perhaps after splitting digits apart; anything else is refused by name.
  if (j.contains("normalizer"))
    require(j["normalizer"].is_null(), source, ": normalizer ", j["normalizer"].dump(), " is not supported (null expected)");
  Gpt2Tokenizer t;
  const json& pre = field(j, "pre_tokenizer", "");
  bool split = false;  // a Split step gave the pattern: ByteLevel then uses none of its own
  auto byte_level = [&](const json& p) {
    require(p.is_object() && p.value("type", "") == "ByteLevel", source, ": pre_tokenizer ", p.dump(),
            " is not supported (ByteLevel, after Digits or a Split of Qwen2's or Llama 3's pattern)");
    require(!p.value("add_prefix_space", false), source, ": pre_tokenizer ByteLevel with add_prefix_space is not supported");
    require(p.value("use_regex", true) != split, source, ": pre_tokenizer ByteLevel ",
            split ? "with use_regex after a Split" : "without use_regex", " is not supported");
  };
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    const json& steps = field(pre, "pretokenizers", "pre_tokenizer.");
    require(steps.is_array() && !steps.empty() && steps.size() <= 2, source,
            ": pre_tokenizer.pretokenizers is not a list of one or two steps");
    if (steps.size() == 2) {
      const json& s = steps[0];
      const std::string type = s.is_object() ? s.value("type", "") : "";
      if (type == "Digits" && s.value("individual_digits", false)) {
        t.split_digits_ = true;
      } else {
        const std::string regex = type == "Split" && s.contains("pattern") && s["pattern"].is_object()
                                      ? s["pattern"].value("Regex", "") : "";
        for (int k = 1; k < 3; ++k)
          if (regex == kPatterns[k]) t.pattern_ = Pattern(k), split = true;
        require(split && s.value("behavior", "") == "Isolated" && !s.value("invert", true), source,
                ": pre_tokenizer step ", s.dump(), " is not supported (Digits with individual_digits, or an "
                "isolating Split of Qwen2's or Llama 3's pattern)");
      }
    }
    byte_level(steps.back());
  } else {
    byte_level(pre);
  }
  const json& model = field(j, "model", "");
  require(model.is_object() && model.value("type", json("BPE")) == "BPE", source, ": model ",
          model.is_object() ? "type " + model.value("type", json("BPE")).dump() : model.dump(), " is not BPE");
  for (const char* none : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(none))
      require(model[none].is_null() || model[none] == "", source, ": model.", none, " ", model[none].dump(), " is not supported");
  if (model.contains("byte_fallback"))
    require(model["byte_fallback"] == false, source, ": model.byte_fallback is not supported by byte-level BPE");
  std::vector<std::string> specials;
  if (j.contains("added_tokens")) {
    require(j["added_tokens"].is_array(), source, ": added_tokens is not a list");
    for (const json& a : j["added_tokens"]) {
      require(a.is_object() && a.contains("content") && a["content"].is_string() && !a["content"].get<std::string>().empty(),
              source, ": added token ", a.dump(), " has no content");
      specials.push_back(a["content"]);
    }
  }
  t.set_vocabulary(vocabulary_entries(field(model, "vocab", "model."), source + ": model.vocab"), specials,
                   source + ": model.vocab");
  if (j.contains("added_tokens"))
    for (const json& a : j["added_tokens"])
      require(a.contains("id") && a["id"] == t.ids_.at(a["content"]), source, ": added token '",
              a["content"].get<std::string>(), "' has id ", a.value("id", json()).dump(), " but the vocabulary gives ",
              t.ids_.at(a["content"]));
  const json& merges = field(model, "merges", "model.");
  require(merges.is_array(), source, ": model.merges is not a list");
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    const std::string where = source + ": model.merges[" + std::to_string(i) + "]";
    if (m.is_string()) {  // "a b"
      const std::string line = m;
      const auto space = line.find(' ');
      require(space != std::string::npos, where, ": expected two symbols separated by one space");
      t.add_merge(std::string_view(line).substr(0, space), std::string_view(line).substr(space + 1), where);
    } else {  // ["a", "b"] (newer files)
      require(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), where, ": ", m.dump(),
              " is not a pair of symbols");
      t.add_merge(m[0].get<std::string>(), m[1].get<std::string>(), where);
    }
  }
  return t;
}

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<std::int32_t>& out, std::size_t* dropped) const {
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
    const bool one_byte = s.size() == 1 || (s.size() == 2 && (static_cast<unsigned char>(s[0]) & 0xe0) == 0xc0);
    if (id == ids_.end() && one_byte && !byte_tokens_required_) {  // a byte without a token: dropped, as Hugging Face does
      if (dropped) ++*dropped;
      continue;
    }
    require(id != ids_.end(), "GPT-2 BPE: merged symbol '", s, "' is not in the vocabulary");
    out.push_back(id->second);
  }
}

void Gpt2Tokenizer::encode_text(std::string_view text, std::vector<std::int32_t>& out, std::size_t* dropped) const {
  if (split_digits_) {  // each ASCII digit a piece of its own, the pre-tokenizer on the runs between
    std::size_t run = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9') continue;
      encode_run(text.substr(run, i - run), out, dropped);
      encode_piece(text.substr(i, 1), out, dropped);
      run = i + 1;
    }
    text.remove_prefix(run);
  }
  encode_run(text, out, dropped);
}

void Gpt2Tokenizer::encode_run(std::string_view text, std::vector<std::int32_t>& out, std::size_t* dropped) const {
  const pcre2_code* re = pretokenizer(int(pattern_));
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(re, nullptr), &pcre2_match_data_free);
  // PCRE2 looks at the subject from the start offset to its end on every
  // call, so each match sees a window of the text: a piece ending within
  // kMargin bytes of the window's end (the pattern reads at most "'ll" and
  // one character past a piece, 16 bytes of UTF-8 at most) may be cut short
  // by it, and is matched again in a window twice as long.
  constexpr std::size_t kWindow = 4096, kMargin = 16;
  std::size_t pos = 0, window = kWindow;
  while (pos < text.size()) {
    const std::size_t end = std::min(text.size(), pos + window);
    const int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(text.data()), end, pos, 0, md.get(), nullptr);
    require(rc > 0 || rc == PCRE2_ERROR_NOMATCH, "GPT-2 pre-tokenizer: PCRE2 match error ", rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (end < text.size() && (rc == PCRE2_ERROR_NOMATCH || ov[1] + kMargin > end)) {
      window *= 2;
      continue;
    }
    window = kWindow;
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (ov[0] > pos) encode_piece(text.substr(pos, ov[0] - pos), out, dropped);  // bytes no pattern matches (invalid UTF-8)
    encode_piece(text.substr(ov[0], ov[1] - ov[0]), out, dropped);
    pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
  }
  if (pos < text.size()) encode_piece(text.substr(pos), out, dropped);
}

std::string Gpt2Tokenizer::json_of(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
                                   const std::vector<std::int32_t>& specials, std::string_view pre,
                                   const std::string& source) {
  json vocab = json::object(), added = json::array();
  for (std::size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = id;
  for (const std::int32_t id : specials) {
    require(id >= 0 && std::size_t(id) < tokens.size(), source, ": special token id ", id, " outside the ",
            tokens.size(), " tokens");
    added.push_back({{"id", id}, {"content", tokens[std::size_t(id)]}, {"special", true}});
  }
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json pre_tokenizer;
  if (pre == "gpt-2") {
    pre_tokenizer = byte_level;
  } else if (pre == "smollm") {
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  } else if (pre == "qwen2" || pre == "llama-bpe") {
    json split = {{"type", "Split"}, {"pattern", {{"Regex", kPatterns[pre == "qwen2" ? 1 : 2]}}},
                  {"behavior", "Isolated"}, {"invert", false}};
    json bytes = byte_level;
    bytes["use_regex"] = false;
    pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", {split, bytes}}};
  } else {
    detail::fail(source, ": pre-tokenizer '", pre, "' is not built (gpt-2, smollm, qwen2, llama-bpe)");
  }
  const json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                  {"added_tokens", added},
                  {"pre_tokenizer", pre_tokenizer}};
  return j.dump();
}

std::vector<std::string> Gpt2Tokenizer::symbols() const {
  std::vector<std::string> out(bytes_.size());
  for (const auto& [symbol, id] : ids_) out[std::size_t(id)] = symbol;
  return out;
}

std::vector<std::string> Gpt2Tokenizer::merges() const {
  std::vector<std::string> out(ranks_.size());
  for (const auto& [pair, rank] : ranks_) out[std::size_t(rank)] = pair;
  return out;
}

std::vector<std::int32_t> Gpt2Tokenizer::special_ids() const {
  std::vector<std::int32_t> out;
  for (const auto& [text, id] : specials_) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

std::string_view Gpt2Tokenizer::pre_tokenizer() const {
  switch (pattern_) {
    case Pattern::qwen2: return "qwen2";
    case Pattern::llama3: return "llama-bpe";
    case Pattern::gpt2: break;
  }
  return split_digits_ ? "smollm" : "gpt-2";
}

int Gpt2Tokenizer::missing_bytes() const {
  int n = 0;
  for (const std::string& symbol : byte_symbol_) n += ids_.count(symbol) == 0;
  return n;
}

std::vector<std::int32_t> Gpt2Tokenizer::encode(std::string_view text, std::size_t* dropped) const {
  std::vector<std::int32_t> out;
  while (!text.empty()) {
    // The first special token's place (the longest of those starting there).
    std::size_t at = std::string_view::npos;
    const std::pair<std::string, std::int32_t>* special = nullptr;
    for (const auto& sp : specials_) {
      const auto i = text.find(sp.first);
      if (i < at) at = i, special = &sp;
    }
    encode_text(text.substr(0, at), out, dropped);
    if (!special) break;
    out.push_back(special->second);
    text.remove_prefix(at + special->first.size());
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
