// model_tokenizer.cpp: ModelTokenizer (io/model_tokenizer.hpp).
#include "xfmr/io/model_tokenizer.hpp"

#include "file_writes.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/hash.hpp"
#include "xfmr/io/gguf.hpp"

#include <algorithm>
#include <cstring>

namespace fs = std::filesystem;

namespace xfmr {

namespace {
template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;  // (Clang 14 deduces no aggregate's arguments)
}  // namespace

ModelTokenizer ModelTokenizer::load(const fs::path& path) {
  require(fs::exists(path), path.string(), ": no such tokenizer file or directory");
  if (fs::is_directory(path)) {
    if (fs::exists(path / "tokenizer.json")) return load(path / "tokenizer.json");
    if (fs::exists(path / "tokenizer.bin")) return load(path / "tokenizer.bin");
    for (const auto& [vocab, merges] : {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}})
      if (fs::exists(path / vocab) && fs::exists(path / merges))
        return {Gpt2Tokenizer::load(path / vocab, path / merges), {path / vocab, path / merges}};
    detail::fail(path.string(), ": no tokenizer here (looked for tokenizer.json, tokenizer.bin, vocab.json + "
                 "merges.txt, encoder.json + vocab.bpe)");
  }
  if (path.extension() == ".json") return {Gpt2Tokenizer::load_json(path), {path}};
  if (path.extension() == ".bin") return {Llama2cTokenizer::load(path), {path}};
  if (path.extension() == ".gguf") return from_gguf(path);
  detail::fail(path.string(), ": not a tokenizer file this library reads (tokenizer.json, tokenizer.bin, or a "
               "directory of GPT-2's vocab.json and merges.txt)");
}

ModelTokenizer ModelTokenizer::from_gguf(const fs::path& file) {
  const GgufFile g = GgufFile::open(file);
  ModelTokenizer t = gguf_tokenizer(g, file);
  const auto tokens = std::int64_t(g.value("tokenizer.ggml.tokens").strings.size());
  auto id = [&](const char* key) {  // unset: missing, 0xFFFFFFFF, or no token of the vocabulary
    const std::int64_t v = g.has(key) ? g.integer(key) : -1;
    return v >= 0 && v < tokens ? std::int32_t(v) : -1;
  };
  t.bos_ = id("tokenizer.ggml.bos_token_id"), t.eos_ = id("tokenizer.ggml.eos_token_id");
  const bool sentencepiece = t.sentencepiece() != nullptr;
  t.add_bos_ = g.has("tokenizer.ggml.add_bos_token") ? g.boolean("tokenizer.ggml.add_bos_token") : sentencepiece;
  return t;
}

ModelTokenizer ModelTokenizer::gguf_tokenizer(const GgufFile& g, const fs::path& file) {
  const std::string model = g.has("tokenizer.ggml.model") ? g.string("tokenizer.ggml.model") : "";
  require(model == "llama" || model == "gpt2", file.string(), ": tokenizer.ggml.model '", model,
          "' is not one xfmr reads ('llama': SentencePiece pieces with scores; 'gpt2': byte-level BPE)");
  if (model == "gpt2") {  // as the tokenizer.json it is written out as
    const std::vector<std::string>& tokens = g.value("tokenizer.ggml.tokens").strings;
    const std::vector<std::string>& merges = g.value("tokenizer.ggml.merges").strings;
    std::vector<std::int32_t> specials;  // llama.cpp's token types 3 (control) and 4 (user-defined)
    if (g.has("tokenizer.ggml.token_type")) {
      const std::vector<std::int64_t>& types = g.value("tokenizer.ggml.token_type").integers;
      require(types.size() == tokens.size(), file.string(), ": ", types.size(), " token types for ", tokens.size(),
              " tokens");
      for (std::size_t id = 0; id < types.size(); ++id)
        if (types[id] == 3 || types[id] == 4) specials.push_back(std::int32_t(id));
    }
    const std::string pre = g.has("tokenizer.ggml.pre") ? g.string("tokenizer.ggml.pre") : "gpt-2";
    const std::string source = file.string() + "'s tokenizer";
    const std::string text = Gpt2Tokenizer::json_of(tokens, merges, specials, pre, source);
    ModelTokenizer t(Gpt2Tokenizer::parse_json(text, source), {});
    t.files_ = {file};
    t.bytes_.emplace_back(reinterpret_cast<const std::byte*>(text.data()),
                          reinterpret_cast<const std::byte*>(text.data()) + text.size());
    t.hash_ = fnv1a("\xff", fnv1a(text, fnv1a("")));
    return t;
  }
  const std::vector<std::string>& pieces = g.value("tokenizer.ggml.tokens").strings;
  const std::vector<double>& scores = g.value("tokenizer.ggml.scores").numbers;
  require(!pieces.empty() && scores.size() == pieces.size(), file.string(), ": ", pieces.size(), " tokens and ",
          scores.size(), " scores");
  for (const auto& [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", Llama2cTokenizer::kBos},
                                std::pair{"tokenizer.ggml.eos_token_id", Llama2cTokenizer::kEos}})
    if (g.has(key))
      require(g.integer(key) == id, file.string(), ": ", key, " ", g.integer(key),
              " (xfmr's SentencePiece tokenizer has BOS 1 and EOS 2)");
  // As llama2.c's tokenizer.bin: the longest piece's length, then each
  // piece's score, length and bytes, SentencePiece's U+2581 as a space.
  std::string bin(4, '\0'), spaced;
  std::int32_t longest = 1;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    spaced.clear();
    for (std::size_t at = 0; at < pieces[i].size();) {
      if (pieces[i].compare(at, 3, "\xe2\x96\x81") == 0) spaced += ' ', at += 3;
      else spaced += pieces[i][at++];
    }
    const float score = float(scores[i]);
    const auto length = std::int32_t(spaced.size());
    longest = std::max(longest, length);
    bin.append(reinterpret_cast<const char*>(&score), 4).append(reinterpret_cast<const char*>(&length), 4) += spaced;
  }
  std::memcpy(bin.data(), &longest, 4);
  ModelTokenizer t(Llama2cTokenizer::parse(bin, file.string() + "'s tokenizer"), {});
  t.files_ = {file};
  t.bytes_.emplace_back(reinterpret_cast<const std::byte*>(bin.data()), reinterpret_cast<const std::byte*>(bin.data()) + bin.size());
  t.hash_ = fnv1a("\xff", fnv1a(bin, fnv1a("")));
  return t;
}

std::vector<AttachedFile> ModelTokenizer::attached_files() const {
  if (files_.size() == 2) return {{"vocab.json", bytes_[0]}, {"merges.txt", bytes_[1]}};  // or encoder.json + vocab.bpe
  return {{std::holds_alternative<Gpt2Tokenizer>(tok_) ? "tokenizer.json" : "tokenizer.bin", bytes_[0]}};
}

ModelTokenizer::ModelTokenizer(std::variant<Gpt2Tokenizer, Llama2cTokenizer> t, std::vector<fs::path> files)
    : tok_(std::move(t)), files_(std::move(files)) {
  std::uint64_t h = fnv1a("");  // over the files in order, each followed by a 0xff byte
  for (const fs::path& f : files_) {
    const std::vector<std::byte>& bytes = bytes_.emplace_back(detail::read_whole_file(f));
    h = fnv1a("\xff", fnv1a(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), h));
  }
  hash_ = h;
}

int ModelTokenizer::missing_bytes() const {
  const auto* bpe = std::get_if<Gpt2Tokenizer>(&tok_);
  return bpe ? bpe->missing_bytes() : 0;
}

int ModelTokenizer::check_fits(int vocab, const std::string& model) const {
  const int n = size();
  const std::string name = files_.front().string();
  require(n <= vocab, "the tokenizer in ", name, " has ", n, " tokens, more than the ", vocab, " of ", model,
          "'s vocabulary: is it the model's tokenizer?");
  const int padding = vocab - n;
  require(padding == 0 || (vocab % 64 == 0 && padding <= kMaxVocabularyPadding), "the tokenizer in ", name, " has ",
          n, " tokens, ", padding, " fewer than the ", vocab, " of ", model, "'s vocabulary, whose ids ", n, " to ",
          vocab - 1, " it could not decode (padding, a vocabulary rounded up to a multiple of 64, is at most ",
          kMaxVocabularyPadding, " ids): is it the model's tokenizer?");
  return padding;
}

std::vector<std::int32_t> ModelTokenizer::encode(std::string_view text, std::size_t* dropped) const {
  return std::visit(Overload{[&](const Gpt2Tokenizer& t) {
                               std::vector<std::int32_t> ids = t.encode(text, dropped);
                               if (add_bos_ && bos_ >= 0) ids.insert(ids.begin(), bos_);
                               return ids;
                             },
                             [&](const Llama2cTokenizer& t) { return t.encode(text, add_bos_, false); }},
                    tok_);
}

std::vector<std::int32_t> ModelTokenizer::encode_corpus(std::string_view text, std::size_t* dropped) const {
  if (const auto* bpe = std::get_if<Gpt2Tokenizer>(&tok_)) return bpe->encode(text, dropped);
  const auto& t = std::get<Llama2cTokenizer>(tok_);
  std::vector<std::int32_t> ids;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    if (end > at) {
      const auto line = t.encode(text.substr(at, end - at), true, false);
      ids.insert(ids.end(), line.begin(), line.end());
    }
    at = end + 1;
  }
  return ids;
}

std::string ModelTokenizer::decode(std::span<const std::int32_t> ids) const {
  return std::visit([&](const auto& t) { return t.decode(ids); }, tok_);
}

std::string ModelTokenizer::piece(std::int32_t prev, std::int32_t id) const {
  return std::visit(Overload{[&](const Gpt2Tokenizer& t) { return t.decode(std::span(&id, 1)); },
                             [&](const Llama2cTokenizer& t) { return t.decode(prev, id); }},
                    tok_);
}

int ModelTokenizer::size() const {
  return std::visit(Overload{[](const Gpt2Tokenizer& t) { return t.size(); },
                             [](const Llama2cTokenizer& t) { return t.vocab_size(); }},
                    tok_);
}

std::int32_t ModelTokenizer::end() const { return eos_ >= 0 ? eos_ : start(); }

std::int32_t ModelTokenizer::start() const {
  if (bos_ >= 0) return bos_;
  return std::visit(Overload{[](const Gpt2Tokenizer& t) { return t.end_of_text(); },
                             [](const Llama2cTokenizer& t) { return t.vocab_size() > Llama2cTokenizer::kBos ? Llama2cTokenizer::kBos : -1; }},
                    tok_);
}

}  // namespace xfmr
