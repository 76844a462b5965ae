// The compiled part of text/classification.hpp.
#include "xfmr/text/classification.hpp"

#include <nlohmann/json.hpp>

#include "xfmr/core/error.hpp"

namespace xfmr {

using json = nlohmann::json;

std::string normalize_words(std::string_view text, const std::string& mode) {
  if (mode == "none") return std::string(text);
  std::string plain;
  for (std::size_t i = 0; i < text.size();) {
    std::size_t len = 0;
    for (std::string_view br : {"<br />", "<br/>", "<br>"})
      if (text.substr(i, br.size()) == br) len = br.size();
    plain += len ? ' ' : text[i];
    i += len ? len : 1;
  }
  std::string out;
  for (const auto& w : pretokenize(plain, mode == "lower")) out += (out.empty() ? "" : " ") + w;
  return out;
}

void check_normalize(const std::string& mode, const char* where) {
  require(mode == "none" || mode == "words" || mode == "lower", "unknown ", where, " '", mode,
          "' (expected none, words or lower)");
}

void check_truncate(const std::string& t) {
  require(t == "head" || t == "tail", "unknown --truncate '", t, "' (expected head or tail)");
}

ClassificationTokens ClassificationTokens::build(const std::string& kind, const std::string& normalize,
                                               const std::vector<LabeledText>& train, int min_freq, int max_vocab,
                                               bool cls, const std::string& source, int d_model, int max_t,
                                               const std::string& truncate) {
  ClassificationTokens t;
  t.kind = kind;
  std::vector<std::string> texts;
  if (kind == "word") {
    check_normalize(normalize, "--normalize");
    t.normalize = normalize;
    // The vocabulary of what the model reads: the words --truncate keeps.
    for (const auto& r : train) {
      std::string text = normalize_words(r.text, normalize);
      const std::vector<std::string_view> words = split_words(text);
      if (const std::size_t keep = std::size_t(max_t - (cls ? 1 : 0)); words.size() > keep) {
        const std::string_view first = truncate == "tail" ? words[words.size() - keep] : words.front();
        const std::string_view last = truncate == "tail" ? words.back() : words[keep - 1];
        text = std::string(first.data(), std::size_t(last.data() + last.size() - first.data()));
      }
      texts.push_back(std::move(text));
    }
    t.words = WordVocab::build(texts, min_freq, {"<pad>", "<unk>", "<cls>"}, std::size_t(max_vocab));
    check_vocabulary(std::size_t(t.words->size()), 3, d_model, "the word vocabulary of --train " + source,
                     "--min-freq or --max-vocab");
    t.pad = *t.words->special("<pad>");
    if (cls) t.cls = *t.words->special("<cls>");
  } else {
    require(kind == "char", "unknown --tokens '", kind, "' (expected word or char)");
    require(normalize == "none", "--normalize ", normalize, " applies to word tokens only");
    require(max_vocab == 0, "--max-vocab applies to word tokens only");
    std::string all;
    for (const auto& r : train) all += r.text;
    // Characters: id 0 pads, the last id is CLS, unknown characters map to <unk>.
    t.chars = CharTokenizer::from_corpus(all, /*with_unknown=*/true);
    t.pad = t.chars->size();
    t.cls = cls ? t.chars->size() + 1 : -1;
  }
  return t;
}

std::vector<std::int32_t> ClassificationTokens::encode(const std::string& text) const {
  return words ? words->encode(normalize_words(text, normalize)) : chars->encode(text);
}

std::string ClassificationTokens::to_json() const {
  return json{{"kind", kind}, {"normalize", normalize}, {"vocab", words ? words->to_json() : chars->to_json()}, {"cls", cls}}
      .dump();
}

ClassificationTokens ClassificationTokens::from_json(std::string_view text) {
  const json j = json::parse(text);
  ClassificationTokens t;
  t.kind = j.at("kind");
  if (t.kind == "word") {
    t.normalize = j.value("normalize", "none");
    check_normalize(t.normalize, "normalize value in the checkpoint's tokens");
    t.words = WordVocab::from_json(j.at("vocab").get<std::string>());
    t.pad = *t.words->special("<pad>");
  } else {
    t.chars = CharTokenizer::from_json(j.at("vocab").get<std::string>());
    t.pad = t.chars->size();
  }
  t.cls = json_integer<std::int32_t>(j, "cls", -1, t.size() - 1);
  return t;
}

EncodedExamples encode_examples(const ClassificationTokens& tok, const std::vector<LabeledText>& rows, int classes,
                                int max_t, const std::string& truncate, const std::string& source) {
  EncodedExamples e;
  const std::size_t room = std::size_t(max_t - (tok.cls >= 0 ? 1 : 0));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    require(rows[i].label < classes, source, ": example ", i + 1, " has label ", rows[i].label,
            " but the model has ", classes, " classes");
    auto ids = tok.encode(rows[i].text);
    if (ids.size() > room) {
      ++e.cut;
      if (truncate == "tail") ids.erase(ids.begin(), ids.end() - std::ptrdiff_t(room));
      else ids.resize(room);
    }
    e.seqs.push_back(std::move(ids));
    e.labels.push_back(rows[i].label);
  }
  return e;
}

std::string labeled_rows_hash(const std::vector<LabeledText>& rows) {
  std::uint64_t h = fnv1a("");
  for (const auto& r : rows) h = fnv1a(r.text, fnv1a(std::to_string(r.label) + "\t", h));
  return hex(h);
}

}  // namespace xfmr
