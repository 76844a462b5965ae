// pretrained.hpp: a published model's checkpoint, in any format xfmr reads,
// into a LanguageModel of the preset (presets.hpp) its config names by
// shape; and out again in the Hugging Face layout of its family.
//
//   auto p = xfmr::load_pretrained<Be>("SmolLM-135M");  // or gpt2/, stories15M.bin
//   p.model->forward(be, ids, {B, T});                 // p.preset: "smollm-135m"
//   xfmr::save_pretrained(*p.model, "out");            // LlamaForCausalLM or GPT2LMHeadModel
//
// checkpoint_format(path): a directory (or its .safetensors file) whose
//   config.json says model_type "gpt2" or "llama" (a GPT-2 file's own
//   "config" metadata counts), or a llama2.c .bin file (its version 1
//   magic, or the legacy header). Anything else is an error naming what
//   was looked for.
// gpt2_preset, hf_llama_preset, llama2c_preset: the LanguageModelPresets
//   preset of the family (GPT-2: pre-norm LayerNorm, GELU, learned
//   positions, biases; Llama: pre-norm RMSNorm, SwiGLU, rotary positions,
//   no biases) whose sizes are the config's (context included: a GPT-2's
//   position table, a Llama's max_position_embeddings or seq_len). None is
//   an xfmr::Error naming the config's shape and listing the family's
//   presets with theirs; a new shape is a preset of one's own (presets.hpp)
//   loaded with load_gpt2 / load_hf_llama / load_llama2c.
// load_pretrained(path, opts): the model, its format and preset; the head's
//   tying and bias are the checkpoint's, opts' dropout, attention dropout
//   and recompute apply (fine-tuning).
// save_pretrained(model, dir, overwrite): save_gpt2 or save_hf_llama, by
//   the preset's family (gpt2_shaped, llama_shaped).
// published_head(preset, opts): opts with the head the family publishes
//   (tied to the embedding, no bias: what save_pretrained needs) for a
//   GPT-2 or Llama preset; as given for the others. A model trained from
//   scratch to be exported is built so.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "xfmr/io/gpt2.hpp"
#include "xfmr/io/hf_llama.hpp"
#include "xfmr/io/llama2c.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {

enum class CheckpointFormat { gpt2, hf_llama, llama2c };
std::string_view format_name(CheckpointFormat f);  // "gpt2", "llama", "llama2.c"

CheckpointFormat checkpoint_format(const std::filesystem::path& path);

std::string_view gpt2_preset(const Gpt2Config& c, const std::string& source);
std::string_view hf_llama_preset(const HfLlamaConfig& c, const std::string& source);
std::string_view llama2c_preset(const Llama2cConfig& c, const std::string& source);

template <class Backend>
struct Pretrained {
  std::unique_ptr<LanguageModel<Backend>> model;
  CheckpointFormat format;
  std::filesystem::path file;  // the weights read
};

template <class Backend>
Pretrained<Backend> load_pretrained(const std::filesystem::path& path, DecoderOptions opts = {}) {
  opts.head_bias = false;
  switch (const CheckpointFormat f = checkpoint_format(path)) {
    case CheckpointFormat::gpt2: {
      const Gpt2Checkpoint ck = open_gpt2(path);
      opts.tie_weights = true;
      auto m = make_language_model<Backend>(gpt2_preset(ck.config, ck.file.string()), ck.config.vocab_size, 0, opts);
      load_gpt2(*m, ck.tensors, ck.config);
      return {std::move(m), f, ck.file};
    }
    case CheckpointFormat::hf_llama: {
      const HfLlamaCheckpoint ck = open_hf_llama(path);
      opts.tie_weights = ck.config.tie_word_embeddings;
      auto m = make_language_model<Backend>(hf_llama_preset(ck.config, ck.file.string()), ck.config.vocab_size, 0, opts);
      load_hf_llama(*m, ck);
      return {std::move(m), f, ck.file};
    }
    case CheckpointFormat::llama2c: {
      const Llama2cCheckpoint ck = read_llama2c(path);
      opts.tie_weights = ck.config.shared_classifier;
      auto m = make_language_model<Backend>(llama2c_preset(ck.config, ck.file.string()), ck.config.vocab_size, 0, opts);
      load_llama2c(*m, ck);
      return {std::move(m), f, ck.file};
    }
  }
  detail::fail("unknown checkpoint format");
}

inline DecoderOptions published_head(const PresetInfo& p, DecoderOptions opts = {}) {
  if (gpt2_shaped(p) || llama_shaped(p)) opts.tie_weights = true, opts.head_bias = false;
  return opts;
}

template <class Backend>
void save_pretrained(LanguageModel<Backend>& model, const std::filesystem::path& dir, bool overwrite = false) {
  if (gpt2_shaped(model.preset())) save_gpt2(model, dir, overwrite);
  else save_hf_llama(model, dir, overwrite);  // or an error naming the preset
}

}  // namespace xfmr
