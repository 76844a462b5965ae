// model_tokenizer.hpp: a published model's tokenizer, whichever files it
// comes in: a Hugging Face tokenizer.json (byte-level BPE: GPT-2's,
// SmolLM's), GPT-2's own vocab.json + merges.txt (or encoder.json +
// vocab.bpe), or llama2.c's tokenizer.bin (text/gpt2_bpe.hpp,
// text/llama2c_tokenizer.hpp).
//
//   const auto tok = xfmr::ModelTokenizer::load("SmolLM-135M");   // a file, or a directory holding one
//   std::vector<std::int32_t> ids = tok.encode("Once upon a time");
//
// encode(text): a prompt's ids (llama2.c's with BOS first, as run.c does).
// encode_corpus(text): a training or evaluation text's: BPE over the whole
//   text; llama2.c's line by line, each non-empty line with BOS first (its
//   encoder is quadratic in the length of what it is given) and the
//   newlines dropped, as its TinyStories data holds one story a sequence.
// decode(ids), and piece(prev, id) for streaming one token at a time.
// start(): the id a text begins after when there is no prompt
//   (<|endoftext|> or BOS), or -1 when the vocabulary has neither.
// files(): what it was read from, for an export to copy beside the model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "xfmr/text/gpt2_bpe.hpp"
#include "xfmr/text/llama2c_tokenizer.hpp"

namespace xfmr {

class ModelTokenizer {
 public:
  // Errors name the path and what was looked for.
  static ModelTokenizer load(const std::filesystem::path& path);

  std::vector<std::int32_t> encode(std::string_view text) const;
  std::vector<std::int32_t> encode_corpus(std::string_view text) const;
  std::string decode(std::span<const std::int32_t> ids) const;
  std::string piece(std::int32_t prev, std::int32_t id) const;
  int size() const;
  std::int32_t start() const;
  const std::vector<std::filesystem::path>& files() const { return files_; }

 private:
  ModelTokenizer(std::variant<Gpt2Tokenizer, Llama2cTokenizer> t, std::vector<std::filesystem::path> files)
      : tok_(std::move(t)), files_(std::move(files)) {}

  std::variant<Gpt2Tokenizer, Llama2cTokenizer> tok_;
  std::vector<std::filesystem::path> files_;
};

}  // namespace xfmr
