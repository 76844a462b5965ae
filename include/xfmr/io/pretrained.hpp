// pretrained.hpp: a published model's checkpoint, in any format xfmr reads,
// into a LanguageModel of the preset (presets.hpp) its config names by
// shape; and out again in the Hugging Face layout of its family.
//
//   auto p = xfmr::load_pretrained<Be>("SmolLM-135M");  // or gpt2/, stories15M.bin, Qwen2.5-0.5B/
//   p.model->forward(be, ids, {B, T});                 // p.model->preset().name: "smollm-135m"
//   xfmr::save_pretrained(*p.model, "out");            // LlamaForCausalLM or GPT2LMHeadModel
//
// checkpoint_format(path): a directory (or its .safetensors file) whose
//   config.json says model_type "gpt2" or "llama" (a GPT-2 file's own
//   "config" metadata counts), or a llama2.c .bin file (its version 1
//   magic, or the legacy header). Anything else is an error naming what
//   was looked for.
// gpt2_architecture, hf_llama_architecture, llama2c_architecture (in
//   io/gpt2.hpp, io/hf_llama.hpp, io/llama2c.hpp): the config's
//   architecture, of any size: its family's parts (GPT-2: pre-norm
//   LayerNorm, GELU, learned positions, biases; Llama: pre-norm RMSNorm,
//   SwiGLU, rotary positions, no biases but Qwen2's on q/k/v) with the
//   config's sizes (context included: a GPT-2's position table, a Llama's
//   max_position_embeddings or seq_len) and knobs (epsilon, rotary theta
//   and scaling). The model is the Decoder of every part Dynamic
//   (make_language_model): no shape or part needs a preset compiled in.
// load_pretrained(path, opts): the model, its format and architecture;
//   the head's tying and bias are the checkpoint's, opts' dropout,
//   attention dropout and recompute apply (fine-tuning).
// save_pretrained(model, dir, overwrite, attached): save_gpt2 or
//   save_hf_llama, by the preset's family (gpt2_shaped, llama_shaped), with
//   the `attached` files (the tokenizer: ModelTokenizer::attached_files())
//   in the same new directory, swapped in whole (write_hf_directory).
// load_model_tokenizer(p, given): the tokenizer of a model load_model
//   read: `given` (a tokenizer file or directory, ModelTokenizer::load)
//   when not empty; else an xfmr checkpoint's own (Trainer::save's
//   attached files; one written before checkpoints carried them names its
//   tokenizer's path in its metadata), else the files beside a published
//   model's weights. It must fit the model's vocabulary
//   (ModelTokenizer::check_fits, whose padding it returns; a vocabulary
//   of 0: a model still to be made for it).
// published_head(preset, opts): opts with the head the family publishes
//   (tied to the embedding, no bias: what save_pretrained needs) for a
//   GPT-2 or Llama preset; as given for the others. A model trained from
//   scratch to be exported is built so.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <vector>
#include <optional>
#include <string>
#include <string_view>

#include "xfmr/io/architecture.hpp"
#include "xfmr/io/gguf_model.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/gpt2.hpp"
#include "xfmr/io/hf_llama.hpp"
#include "xfmr/io/llama2c.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/io/model_tokenizer.hpp"
#include "xfmr/text/chat_template.hpp"
#include "xfmr/core/hash.hpp"

namespace xfmr {

enum class CheckpointFormat { gpt2, hf_llama, llama2c, xfmr, gguf };
std::string_view format_name(CheckpointFormat f);  // "gpt2", "llama", "llama2.c", "xfmr", "gguf"

CheckpointFormat checkpoint_format(const std::filesystem::path& path);

// The chat format of a model (text/chat_template.hpp): a directory's
// tokenizer_config.json's template, a GGUF file's tokenizer.chat_template;
// plain for the others and where there is none.
ChatTemplate model_chat_template(const std::filesystem::path& path);


template <class Backend>
struct Pretrained {
  std::unique_ptr<LanguageModel<Backend>> model;
  CheckpointFormat format;
  std::filesystem::path file;  // the weights read
  Metadata metadata;           // an xfmr checkpoint's (load_model)
};

template <class Backend>
Pretrained<Backend> load_pretrained(const std::filesystem::path& path, DecoderOptions opts = {}) {
  opts.head_bias = false;
  opts.initialise = false;  // every loader below writes every parameter
  switch (const CheckpointFormat f = checkpoint_format(path)) {
    case CheckpointFormat::gpt2: {
      const Gpt2Checkpoint ck = open_gpt2(path);
      opts.tie_weights = true;
      auto m = make_language_model<Backend>(gpt2_architecture(ck.config), ck.config.vocab_size, 0, opts);
      load_gpt2(*m, ck.tensors, ck.config);
      return {std::move(m), f, ck.file, {}};
    }
    case CheckpointFormat::hf_llama: {
      const HfLlamaCheckpoint ck = open_hf_llama(path);
      opts.tie_weights = ck.config.tie_word_embeddings;
      auto m = make_language_model<Backend>(hf_llama_architecture(ck.config), ck.config.vocab_size, 0, opts);
      load_hf_llama(*m, ck);
      return {std::move(m), f, ck.file, {}};
    }
    case CheckpointFormat::llama2c: {
      const Llama2cCheckpoint ck = read_llama2c(path);
      opts.tie_weights = ck.config.shared_classifier;
      auto m = make_language_model<Backend>(llama2c_architecture(ck.config), ck.config.vocab_size, 0, opts);
      load_llama2c(*m, ck);
      return {std::move(m), f, ck.file, {}};
    }
    case CheckpointFormat::gguf: {
      const GgufModel g = open_gguf_model(path);
      opts.tie_weights = g.tied;
      auto m = make_language_model<Backend>(g.architecture, g.vocab, 0, opts);
      m->visit([&](std::string_view name, auto& value, auto&) {
        assign_weights(value, detail::gguf_source(g, name, value.shape()));
      });
      return {std::move(m), f, path, {{kWeightsKey, gguf_precision(g)}}};
    }
    case CheckpointFormat::xfmr: break;  // checkpoint_format names published formats only (load_model reads xfmr's)
  }
  detail::fail("unknown checkpoint format");
}

// load_model(path, opts): any language model xfmr reads: an xfmr checkpoint
// directory (Trainer::save; its recorded architecture, io/architecture.hpp,
// or for one written before it recorded one, its preset; the vocabulary,
// the head's tying and bias from its tensors), or a published checkpoint
// (load_pretrained). opts' dropout, attention dropout and recompute apply.
template <class Backend>
Pretrained<Backend> load_model(const std::filesystem::path& path, DecoderOptions opts = {}) {
  if (!is_checkpoint(path)) return load_pretrained<Backend>(path, opts);
  Pretrained<Backend> p;
  p.format = CheckpointFormat::xfmr;
  p.metadata = read_checkpoint_metadata(path);
  p.file = path / kModelFile;
  const SafeTensors saved = SafeTensors::load(p.file);
  const PresetInfo arch = architecture_of(p.metadata, path);
  require(saved.contains("tok_emb.weight") && saved.info("tok_emb.weight").shape.size() == 2, p.file.string(),
          ": no token embedding 'tok_emb.weight' (vocab, width): not a language model's checkpoint");
  const int vocab = int(saved.info("tok_emb.weight").shape[0]);
  opts.tie_weights = !saved.contains("lm_head.weight");
  opts.head_bias = saved.contains("lm_head.bias");
  opts.initialise = false;  // defer_parameters gives every parameter its values
  p.model = make_language_model<Backend>(arch, vocab, 0, opts);
  defer_parameters(*p.model, saved);
  return p;
}

struct FoundTokenizer {
  ModelTokenizer tokenizer;
  std::filesystem::path source;  // the file or directory it was read from, absolute
  int padding = 0;               // the model's vocabulary rows past its tokens (ModelTokenizer::check_fits)
};
// `weights`: Pretrained::file; `metadata`: Pretrained::metadata.
FoundTokenizer load_model_tokenizer(CheckpointFormat format, const std::filesystem::path& weights,
                                    const Metadata& metadata, int vocab, const std::filesystem::path& given = {});
template <class Backend>
FoundTokenizer load_model_tokenizer(const Pretrained<Backend>& p, const std::filesystem::path& given = {}) {
  return load_model_tokenizer(p.format, p.file, p.metadata, p.model->vocab(), given);
}

// quantise_language_model<Backend>(path, to, precision, tokenizer): a
// checkpoint for decoding in `precision` ("int8" or "q4": quantise_model)
// of any language model load_model reads (a float checkpoint or a
// published model, its matrices read from the file one at a time), with
// xfmr-lm's metadata (architecture, vocabulary, head, tokenizer) and its
// tokenizer's files (`tokenizer`, or the model's own): xfmr-lm, xfmr-serve
// and xfmr.load read it, and decode it in that precision.
template <class Backend>
QuantisedCheckpoint quantise_language_model(const std::filesystem::path& path, const std::filesystem::path& to,
                                            std::string_view precision, const std::filesystem::path& tokenizer = {}) {
  if (is_checkpoint(path)) {
    const std::string already = quantised_weights(read_checkpoint_metadata(path, "xfmr-lm"));
    require(already.empty(), path.string(), " holds ", already, " weights already");
  }
  Pretrained<Backend> p = load_model<Backend>(path);
  const FoundTokenizer tok = load_model_tokenizer(p, tokenizer);
  const LanguageModel<Backend>& m = *p.model;
  Metadata metadata = language_model_metadata(m);
  metadata["format"] = "xfmr-lm";
  metadata["vocab"] = std::to_string(m.vocab());
  metadata["tie_weights"] = m.options().tie_weights ? "1" : "0";
  metadata["head_bias"] = m.options().head_bias ? "1" : "0";
  metadata["tokenizer"] = tok.source.string();
  metadata["tokenizer_hash"] = hex(tok.tokenizer.content_hash());
  metadata["quantised_from"] = std::filesystem::absolute(path).string();
  return quantise_model(*p.model, to, precision, std::move(metadata), tok.tokenizer.attached_files());
}

inline DecoderOptions published_head(const PresetInfo& p, DecoderOptions opts = {}) {
  if (gpt2_shaped(p) || llama_shaped(p)) opts.tie_weights = true, opts.head_bias = false;
  return opts;
}

// save_gguf(model, path, type, tokenizer): write_gguf_model
// (io/gguf_model.hpp) of the model's tensors.
template <class Backend>
void save_gguf(LanguageModel<Backend>& model, const std::filesystem::path& path, GgmlType type,
               const ModelTokenizer* tok = nullptr) {
  std::map<std::string, std::vector<float>> tensors;
  model.visit([&](std::string_view name, auto& value, auto&) {
    std::vector<typename Backend::Scalar> host(value.size());
    value.copy_to_host(host.data());
    tensors[std::string(name)].assign(host.begin(), host.end());
  });
  write_gguf_model(model.preset(), model.vocab(), model.options().tie_weights, type, tensors, tok, path);
}

template <class Backend>
void save_pretrained(LanguageModel<Backend>& model, const std::filesystem::path& dir, bool overwrite = false,
                     std::span<const AttachedFile> attached = {}) {
  if (gpt2_shaped(model.preset())) save_gpt2(model, dir, overwrite, attached);
  else save_hf_llama(model, dir, overwrite, attached);  // or an error naming the preset
}

}  // namespace xfmr
