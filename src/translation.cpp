// The compiled part of text/translation.hpp.
#include "xfmr/text/translation.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "xfmr/core/error.hpp"
#include "xfmr/text/datasets.hpp"
#include "xfmr/layers/losses.hpp"

namespace xfmr {

using json = nlohmann::json;

namespace {

const std::vector<std::string> kSpecialTokens = {"<pad>", "<unk>", "<bos>", "<eos>"};

std::string join_words(const std::vector<std::string>& w) {
  std::string s;
  for (const auto& x : w) (s.empty() ? s : s += ' ') += x;
  return s;
}

}  // namespace

TranslationCodec TranslationCodec::words(const std::vector<std::string>& lines, int min_freq, bool lowercase,
                                         std::size_t max_words) {
  std::vector<std::string> texts;
  for (const auto& l : lines) {
    std::vector<std::string> w = pretokenize(l, lowercase);
    if (w.size() > max_words) w.resize(max_words);
    texts.push_back(join_words(w));
  }
  return TranslationCodec(WordVocab::build(texts, min_freq, kSpecialTokens), lowercase);
}

TranslationCodec TranslationCodec::bpe(const std::vector<std::string>& lines, int vocab_size, bool lowercase) {
  return TranslationCodec(BpeTokenizer::train(lines, vocab_size, kSpecialTokens, lowercase), lowercase);
}

TranslationCodec TranslationCodec::from_json(const std::string& kind, const std::string& text, bool lowercase) {
  if (kind == "bpe") return TranslationCodec(BpeTokenizer::from_json(text), lowercase);
  require(kind == "word", "unknown token kind '", kind, "' in the checkpoint");
  return TranslationCodec(WordVocab::from_json(text), lowercase);
}

std::string TranslationCodec::kind() const { return std::holds_alternative<WordVocab>(v_) ? "word" : "bpe"; }

std::string TranslationCodec::to_json() const {
  return std::visit([](const auto& t) { return t.to_json(); }, v_);
}

std::vector<std::int32_t> TranslationCodec::encode(const std::string& line) const {
  if (const auto* w = std::get_if<WordVocab>(&v_)) return w->encode(join_words(pretokenize(line, lowercase_)));
  return std::get<BpeTokenizer>(v_).encode(line);
}

std::string TranslationCodec::decode(std::span<const std::int32_t> ids) const {
  if (const auto* w = std::get_if<WordVocab>(&v_)) {
    std::vector<std::string> words;
    for (auto id : ids) words.push_back(w->word(id));
    return detokenize(words);
  }
  return std::get<BpeTokenizer>(v_).decode(ids);
}

std::string TranslationCodec::piece(std::int32_t id) const {
  return std::visit(
      [&](const auto& t) -> std::string {
        if constexpr (std::is_same_v<std::decay_t<decltype(t)>, WordVocab>) return t.word(id);
        else return t.symbol(id);
      },
      v_);
}

int TranslationCodec::size() const {
  return std::visit([](const auto& t) { return t.size(); }, v_);
}

std::int32_t TranslationCodec::special(const char* name) const {
  return std::visit([&](const auto& t) { return *t.special(name); }, v_);
}

std::string TranslationVocabs::to_json() const {
  return json{{"tokens", src.kind()}, {"src_vocab", src.to_json()}, {"tgt_vocab", tgt.to_json()},
              {"lowercase", src.lowercase()}, {"share_embeddings", shared}}
      .dump();
}

TranslationVocabs TranslationVocabs::from_json(std::string_view text) {
  const json state = json::parse(text);
  const std::string kind = state.value("tokens", "word");
  const bool lower = state.at("lowercase");
  return {TranslationCodec::from_json(kind, state.at("src_vocab"), lower),
          TranslationCodec::from_json(kind, state.at("tgt_vocab"), lower), state.value("share_embeddings", false)};
}

std::vector<std::string> read_sentences(const std::string& path) {
  auto lines = read_lines(path);
  while (!lines.empty() && lines.back().empty()) lines.pop_back();  // a trailing newline
  return lines;
}

std::vector<std::vector<std::int32_t>> encode_sentences(const TranslationCodec& v, const std::vector<std::string>& lines,
                                                        int max_len, bool truncate, const std::string& file) {
  std::vector<std::vector<std::int32_t>> out;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    auto ids = v.encode(lines[i]);
    require(!ids.empty(), file, ":", i + 1, ": empty sentence");
    if (int(ids.size()) > max_len) {
      require(truncate, file, ":", i + 1, ": sentence of ", ids.size(), " tokens exceeds the model's limit of ", max_len,
              " (MAX_T minus <bos>/<eos>; pass --truncate to cut it)");
      ids.resize(max_len);
    }
    out.push_back(std::move(ids));
  }
  return out;
}

std::vector<std::vector<int>> bucket_batches(const std::vector<SentencePair>& data, int batch, Rng& rng) {
  std::vector<int> idx(data.size());
  std::iota(idx.begin(), idx.end(), 0);
  for (std::size_t i = idx.size() - 1; i > 0; --i) std::swap(idx[i], idx[rng.below(i + 1)]);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return data[a].src.size() < data[b].src.size(); });
  std::vector<std::vector<int>> batches;
  for (std::size_t i = 0; i < idx.size(); i += batch)
    batches.emplace_back(idx.begin() + i, idx.begin() + std::min(idx.size(), i + batch));
  for (std::size_t i = batches.size() - 1; i > 0; --i) std::swap(batches[i], batches[rng.below(i + 1)]);
  return batches;
}

PairBatch make_pair_batch(const std::vector<SentencePair>& data, const std::vector<int>& which,
                          const TranslationVocabs& v) {
  PairBatch b;
  const int B = static_cast<int>(which.size());
  int S = 1, T = 1;
  for (int i : which) S = std::max<int>(S, data[i].src.size()), T = std::max<int>(T, data[i].tgt.size() + 1);
  b.src = {B, S};
  b.tgt = {B, T};
  b.src_ids.assign(std::size_t(B) * S, v.pad());
  b.src_pad.assign(std::size_t(B) * S, 1);
  b.tgt_in.assign(std::size_t(B) * T, v.pad());
  b.tgt_out.assign(std::size_t(B) * T, kIgnoreIndex);
  b.tgt_pad.assign(std::size_t(B) * T, 1);
  for (int r = 0; r < B; ++r) {
    const SentencePair& p = data[which[r]];
    for (std::size_t t = 0; t < p.src.size(); ++t) b.src_ids[r * S + t] = p.src[t], b.src_pad[r * S + t] = 0;
    b.tgt_in[r * T] = v.bos();
    for (std::size_t t = 0; t < p.tgt.size(); ++t) b.tgt_in[r * T + t + 1] = p.tgt[t];
    for (std::size_t t = 0; t <= p.tgt.size(); ++t)
      b.tgt_out[r * T + t] = t < p.tgt.size() ? p.tgt[t] : v.eos(), b.tgt_pad[r * T + t] = 0;
    b.tokens += long(p.tgt.size()) + 1;
  }
  return b;
}

}  // namespace xfmr
