// The compiled part of text/char_corpus.hpp.
#include "xfmr/text/char_corpus.hpp"

#include <algorithm>

#include "xfmr/core/error.hpp"
#include "xfmr/core/hash.hpp"
#include "xfmr/layers/losses.hpp"

namespace xfmr {

namespace {
constexpr std::uint64_t kEvalSeed = 0x5eed;  // the fixed windows of a text's evaluation batches
}  // namespace

std::string CharCorpus::all_text() const {
  std::string s = train + val;
  for (const auto* v : {&train_names, &val_names})
    for (const auto& n : *v) s += n + "\n";
  return s;
}

CharCorpus load_char_corpus(const std::string& path, const std::string& mode, double val_fraction,
                            std::uint64_t seed, int length) {
  require(!path.empty(), "--data FILE is required");
  CharCorpus c;
  std::string text = read_text_file(path);
  c.hash = fnv1a(text);
  check_utf8(text, "--data " + path + " (the character model reads UTF-8 text)");
  const auto characters = [](std::string_view s) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < s.size(); i += utf8_character_size(s, i)) ++n;
    return n;
  };
  if (mode == "names") {
    std::vector<std::string> lines;
    std::size_t start = 0;
    while (start < text.size()) {
      auto end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const std::size_t n = characters(line);
      require(n + 1 <= std::size_t(length), "--data ", path, ": the name on line ", lines.size() + 1, " has ", n,
              " characters; with its separator that exceeds the model's context of ", length);
      lines.push_back(std::move(line));
      start = end + 1;
    }
    auto split = split_names(lines, 1.0 - val_fraction, seed);
    c.train_names = std::move(split.train);
    c.val_names = std::move(split.val);
  } else {
    require(mode == "text", "unknown --mode '", mode, "' (expected text or names)");
    // The first (1 - val_fraction) of the characters train, the rest validate.
    const std::size_t n_train = std::size_t(double(characters(text)) * (1.0 - val_fraction));
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < n_train; ++i) bytes += utf8_character_size(text, bytes);
    c.val = text.substr(bytes);
    text.resize(bytes);
    c.train = std::move(text);
  }
  return c;
}

CharBatches::CharBatches(const CharCorpus& c, const CharTokenizer& tok, const std::string& mode, int batch,
                         int length, bool train, const std::string& data) {
  if (mode == "names") {
    const auto sep = tok.find("\n").value();
    std::vector<std::vector<std::int32_t>> seqs;
    for (const auto& n : train ? c.train_names : c.val_names) seqs.push_back(tok.encode(n));
    seq_.emplace(std::move(seqs), batch, length, sep, sep, kIgnoreIndex);
  } else {
    ids_ = tok.encode(train ? c.train : c.val);
    require(ids_.size() > std::size_t(length), "--data ", data, ": its ", train ? "training" : "validation",
            " part has ", ids_.size(), " characters, too few for windows of the model's context ", length,
            " + 1 (", train ? "a longer text, or a smaller --val-fraction" : "a longer text, or a larger --val-fraction",
            ")");
    lm_.emplace(ids_, batch, length);
  }
}

void CharBatches::sample(Rng& rng, std::int32_t* ids, std::int32_t* targets) const {
  lm_ ? lm_->sample(rng, ids, targets) : seq_->sample(rng, ids, targets);
}
int CharBatches::eval_count(int cap) const { return lm_ ? cap : std::min(cap, seq_->batches()); }
void CharBatches::eval_batch(int i, std::int32_t* ids, std::int32_t* targets) const {
  lm_ ? lm_->fixed(kEvalSeed, i, ids, targets) : seq_->in_order(i, ids, targets);
}
std::size_t CharBatches::size() const { return lm_ ? ids_.size() : seq_->size(); }

}  // namespace xfmr
