// bpe.cpp: byte-level BPE (see bpe.hpp).
#include "xfmr/text/bpe.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "json_bounds.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

using nlohmann::json;

void BpeTokenizer::init_base(std::vector<std::string> specials) {
  symbols_ = std::move(specials);
  specials_ = static_cast<int>(symbols_.size());
  for (int b = 0; b < 256; ++b) symbols_.push_back(std::string(1, static_cast<char>(b)));
  end_of_word_ = static_cast<std::int32_t>(symbols_.size());
  symbols_.push_back("</w>");
}

BpeTokenizer BpeTokenizer::train(std::span<const std::string> texts, int vocab_size, std::vector<std::string> specials,
                                 bool lowercase) {
  BpeTokenizer t;
  t.lowercase_ = lowercase;
  t.init_base(std::move(specials));
  require(vocab_size >= t.size(), "BPE vocabulary size ", vocab_size, " is below the ", t.size(),
          " base symbols (bytes, </w> and specials)");
  // Unique words with their counts, as symbol sequences.
  std::unordered_map<std::string, long> counts;
  for (const auto& text : texts)
    for (auto& w : pretokenize(text, lowercase)) ++counts[w];
  std::vector<std::string> keys;
  for (const auto& [w, c] : counts) keys.push_back(w);
  std::sort(keys.begin(), keys.end());  // a fixed order, whatever the hash map's
  std::vector<std::vector<std::int32_t>> words;
  std::vector<long> freq;
  for (const auto& w : keys) {
    std::vector<std::int32_t> s;
    for (unsigned char c : w) s.push_back(t.specials_ + c);
    s.push_back(t.end_of_word_);
    words.push_back(std::move(s));
    freq.push_back(counts[w]);
  }
  while (t.size() < vocab_size) {
    std::map<std::pair<std::int32_t, std::int32_t>, long> pairs;
    for (std::size_t i = 0; i < words.size(); ++i)
      for (std::size_t k = 0; k + 1 < words[i].size(); ++k) pairs[{words[i][k], words[i][k + 1]}] += freq[i];
    auto best = pairs.end();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (best == pairs.end() || it->second > best->second) best = it;  // map order breaks ties
    if (best == pairs.end() || best->second < 2) break;
    const auto [a, b] = best->first;
    const auto merged = static_cast<std::int32_t>(t.symbols_.size());
    t.symbols_.push_back(t.symbols_[a] + t.symbols_[b]);
    t.rank_[{a, b}] = static_cast<std::int32_t>(t.merges_.size());
    t.merges_.emplace_back(a, b);
    for (auto& w : words) {
      std::vector<std::int32_t> out;
      for (std::size_t k = 0; k < w.size(); ++k) {
        if (k + 1 < w.size() && w[k] == a && w[k + 1] == b) out.push_back(merged), ++k;
        else out.push_back(w[k]);
      }
      w = std::move(out);
    }
  }
  return t;
}

std::vector<std::int32_t> BpeTokenizer::encode_word(std::string_view word) const {
  std::vector<std::int32_t> s;
  for (unsigned char c : word) s.push_back(specials_ + c);
  s.push_back(end_of_word_);
  // Merge the lowest-ranked pair present, until none applies.
  for (;;) {
    std::int32_t best_rank = -1;
    std::size_t at = 0;
    for (std::size_t k = 0; k + 1 < s.size(); ++k) {
      const auto it = rank_.find({s[k], s[k + 1]});
      if (it != rank_.end() && (best_rank < 0 || it->second < best_rank)) best_rank = it->second, at = k;
    }
    if (best_rank < 0) return s;
    const auto merged = static_cast<std::int32_t>(specials_ + 256 + 1 + best_rank);
    const auto [a, b] = merges_[best_rank];
    std::vector<std::int32_t> out;
    for (std::size_t k = 0; k < s.size(); ++k) {
      if (k >= at && k + 1 < s.size() && s[k] == a && s[k + 1] == b) out.push_back(merged), ++k;
      else out.push_back(s[k]);
    }
    s = std::move(out);
  }
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  for (const auto& w : pretokenize(text, lowercase_)) {
    const auto s = encode_word(w);
    ids.insert(ids.end(), s.begin(), s.end());
  }
  return ids;
}

std::string BpeTokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string joined;
  std::vector<std::string> words;
  for (auto id : ids) {
    if (id < specials_) continue;  // specials are not text
    const std::string& sym = symbol(id);
    if (sym.size() >= 4 && sym.compare(sym.size() - 4, 4, "</w>") == 0) {
      joined += sym.substr(0, sym.size() - 4);
      words.push_back(std::move(joined));
      joined.clear();
    } else {
      joined += sym;
    }
  }
  if (!joined.empty()) words.push_back(joined);
  return detokenize(words);
}

std::optional<std::int32_t> BpeTokenizer::special(std::string_view name) const {
  for (int i = 0; i < specials_; ++i)
    if (symbols_[i] == name) return i;
  return std::nullopt;
}

const std::string& BpeTokenizer::symbol(std::int32_t id) const {
  require(id >= 0 && id < size(), "BPE id ", id, " out of range [0, ", size(), ")");
  return symbols_[id];
}

std::string BpeTokenizer::to_json() const {
  json merges = json::array();
  for (auto [a, b] : merges_) merges.push_back({a, b});
  return json{{"type", "bpe"},
              {"specials", std::vector<std::string>(symbols_.begin(), symbols_.begin() + specials_)},
              {"lowercase", lowercase_},
              {"merges", merges}}
      .dump();
}

BpeTokenizer BpeTokenizer::from_json(std::string_view text) try {
  detail::check_json_depth(text, "BPE description");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    detail::fail("BPE description is not valid JSON: ", e.what());
  }
  require(j.is_object() && j.value("type", "") == "bpe" && j.contains("merges") && j.contains("specials"),
          "not a BPE tokenizer description");
  BpeTokenizer t;
  t.lowercase_ = j.value("lowercase", false);
  t.init_base(j.at("specials").get<std::vector<std::string>>());
  for (const auto& m : j.at("merges")) {
    require(m.is_array() && m.size() == 2, "malformed BPE merge ", m.dump());
    const auto a = std::int32_t(detail::json_integer(m[0], 0, t.size() - 1, "BPE merge symbol"));
    const auto b = std::int32_t(detail::json_integer(m[1], 0, t.size() - 1, "BPE merge symbol"));
    // Merges that keep doubling a symbol would grow it to 2^k bytes.
    require(t.symbols_[a].size() + t.symbols_[b].size() <= kMaxSymbolBytes, "BPE merge (", a, ", ", b,
            ") makes a symbol of ", t.symbols_[a].size() + t.symbols_[b].size(), " bytes, over the limit of ",
            kMaxSymbolBytes);
    t.rank_[{a, b}] = static_cast<std::int32_t>(t.merges_.size());
    t.merges_.emplace_back(a, b);
    t.symbols_.push_back(t.symbols_[a] + t.symbols_[b]);
  }
  return t;
} catch (const json::exception& e) {  // a value of the wrong type (found by fuzzing)
  detail::fail("BPE description is malformed: ", e.what());
}

}  // namespace xfmr
