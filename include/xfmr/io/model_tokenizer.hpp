// model_tokenizer.hpp: a published model's tokenizer, whichever files it
// comes in: a Hugging Face tokenizer.json (byte-level BPE: GPT-2's,
// SmolLM's), GPT-2's own vocab.json + merges.txt (or encoder.json +
// vocab.bpe), or llama2.c's tokenizer.bin (text/gpt2_bpe.hpp,
// text/llama2c_tokenizer.hpp).
//
//   const auto tok = xfmr::ModelTokenizer::load("SmolLM-135M");   // a file, or a directory holding one
//   std::vector<std::int32_t> ids = tok.encode("Once upon a time");
//
// A GGUF model file (.gguf) carries its tokenizer: a "llama" one
// (SentencePiece pieces with scores, U+2581 for the space) reads as the
// llama2.c tokenizer.bin it is written out as (its attached file); a
// "gpt2" one (byte-level BPE: tokens, merges, token types 3 and 4 special,
// tokenizer.ggml.pre gpt-2, smollm, qwen2 or llama-bpe) as the
// tokenizer.json Gpt2Tokenizer::json_of writes of it. Its special ids
// (0xFFFFFFFF or missing: unset) give start() (bos_token_id) and end()
// (eos_token_id), and add_bos_token whether encode() puts BOS first.
//
// encode(text): a prompt's ids (llama2.c's with BOS first, as run.c does).
// encode_corpus(text): a training or evaluation text's: BPE over the whole
//   text; llama2.c's line by line, each non-empty line with BOS first (its
//   encoder is quadratic in the length of what it is given) and the
//   newlines dropped, as its TinyStories data holds one story a sequence.
// decode(ids), and piece(prev, id) for streaming one token at a time.
// start(): the id a text begins after when there is no prompt
//   (<|endoftext|> or BOS), or -1 when the vocabulary has neither.
// files(): what it was read from; attached_files(): their bytes as load()
//   read them, under their canonical names (tokenizer.json, vocab.json +
//   merges.txt, tokenizer.bin), for a checkpoint or an export to carry
//   (io/checkpoint.hpp, io/pretrained.hpp's save_pretrained), where this
//   load() and Hugging Face's find them.
// content_hash(): FNV-1a of the files' bytes as load() read them: a run
//   resumed with another tokenizer is refused even when its path is the same.
// check_fits(vocab, model): the tokenizer against a model's vocabulary
//   (below).
// missing_bytes(), and encode's `dropped`: a byte-level BPE without a
//   token for every byte drops those bytes, as Hugging Face does
//   (gpt2_bpe.hpp); a caller reports them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "xfmr/io/safetensors.hpp"
#include "xfmr/text/gpt2_bpe.hpp"
#include "xfmr/text/llama2c_tokenizer.hpp"

namespace xfmr {

class GgufFile;

class ModelTokenizer {
 public:
  // Errors name the path and what was looked for.
  static ModelTokenizer load(const std::filesystem::path& path);

  std::vector<std::int32_t> encode(std::string_view text, std::size_t* dropped = nullptr) const;
  std::vector<std::int32_t> encode_corpus(std::string_view text, std::size_t* dropped = nullptr) const;
  std::string decode(std::span<const std::int32_t> ids) const;
  std::string piece(std::int32_t prev, std::int32_t id) const;
  int size() const;
  std::int32_t start() const;
  // The id that ends a text: a GGUF file's eos_token_id, else start().
  std::int32_t end() const;
  const std::vector<std::filesystem::path>& files() const { return files_; }
  std::vector<AttachedFile> attached_files() const;
  std::uint64_t content_hash() const { return hash_; }
  int missing_bytes() const;
  // The SentencePiece-style (llama2.c) tokenizer inside, or nullptr.
  const Llama2cTokenizer* sentencepiece() const { return std::get_if<Llama2cTokenizer>(&tok_); }
  // The byte-level BPE inside, or nullptr.
  const Gpt2Tokenizer* byte_level() const { return std::get_if<Gpt2Tokenizer>(&tok_); }

  // Checks that the tokenizer fits a model whose embedding has `vocab` rows
  // (`model` names the model in the error). More tokens than rows is an
  // error. Fewer is one too unless the rows past the tokenizer are padding:
  // a vocabulary rounded up for alignment (`vocab` a multiple of 64, at
  // most kMaxVocabularyPadding rows more, as llm.c's GPT-2 and Qwen2's
  // are), whose ids no tokenizer decodes and a generation never draws
  // (GenerateOptions::vocabulary). Returns the rows of padding.
  static constexpr int kMaxVocabularyPadding = 1024;
  int check_fits(int vocab, const std::string& model) const;

 private:
  ModelTokenizer(std::variant<Gpt2Tokenizer, Llama2cTokenizer> t, std::vector<std::filesystem::path> files);
  static ModelTokenizer from_gguf(const std::filesystem::path& file);
  static ModelTokenizer gguf_tokenizer(const GgufFile& g, const std::filesystem::path& file);

  std::variant<Gpt2Tokenizer, Llama2cTokenizer> tok_;
  std::vector<std::filesystem::path> files_;
  std::vector<std::vector<std::byte>> bytes_;  // the files' contents, as read
  std::uint64_t hash_ = 0;
  // A GGUF file's special ids (-1: unset) and whether encode() puts BOS first.
  std::int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = true;  // a SentencePiece tokenizer's; a byte-level BPE's only where a GGUF says so
};

}  // namespace xfmr
