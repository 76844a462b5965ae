// hf_llama.hpp: Hugging Face LlamaForCausalLM checkpoints, and those of the
// same block, Qwen2ForCausalLM (biases on q, k and v) and
// MistralForCausalLM without a sliding window (a directory of
// model.safetensors and config.json; F32, F16 or BF16 tensors, read as
// float when read), into a Llama-shaped Decoder of any size: its matrices
// deferred to the mapped file on the CPU (io/weight_sources.hpp), read
// when the model first needs them.
//
// Tensors, for each layer i under "model.layers.<i>.": input_layernorm,
// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj
// (".weight" each; Qwen2's q, k and v ".bias" too); then "model.embed_tokens.weight",
// "model.norm.weight" and "lm_head.weight" (absent or equal to the
// embedding when tie_word_embeddings). Rotary buffers ("...rotary_emb.
// inv_freq") are skipped.
//
// Hugging Face turns rotary pairs (i, i + head/2) of each head (its
// rotate_half); xfmr, like Meta's and llama2.c's, turns pairs (2i, 2i+1).
// Loading reorders each q_proj and k_proj head's rows so: row 2i takes
// row i, row 2i+1 takes row head/2 + i. The logits are the same function.
//
// HfLlamaConfig: config.json's fields that fix the shape and the knobs
//   (rms_norm_eps, rope_theta, rope_scaling "linear" or "llama3", Qwen2's
//   q/k/v biases); hidden_act must be "silu"; what xfmr does not build
//   (a sliding window that is used, attention or MLP biases on Llama,
//   heads of another width than hidden_size / num_attention_heads, other
//   rope scalings) is an error naming the field.
// open_hf_llama(path): the directory (or its .safetensors file) and its
//   config, the tensors' shapes checked against it before anything else.
// load_hf_llama(model, checkpoint): fills a Decoder of Llama's
//   configuration (pre-norm RmsNorm, SwiGlu, Rope, BIAS = false; its head
//   tied as the config says, without bias) whose sizes are the config's,
//   or a LanguageModel of such a preset (io/pretrained.hpp picks it).
// save_hf_llama(model, dir): the inverse: dir/model.safetensors (F32, q and
//   k rows back in rotate-half order, gate and up split, no lm_head when
//   tied), dir/config.json and any attached files (the tokenizer), as one
//   new directory swapped in (write_hf_directory); an existing one is
//   replaced only with overwrite. Loading the result gives the model back
//   bit for bit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/io/llama.hpp"
#include "xfmr/io/safetensors.hpp"
#include "xfmr/io/weight_sources.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/presets.hpp"

namespace xfmr {

struct HfLlamaConfig {
  std::string model_type = "llama";  // "llama", "qwen2" or "mistral"
  int vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
      num_key_value_heads = 0, max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  double rms_norm_eps = 1e-5, rope_theta = 10000.0;
  RopeScaling rope_scaling{};
  bool qkv_bias = false;  // Qwen2's q, k and v projections' biases
  // config.json's text; `source` names it in errors.
  static HfLlamaConfig from_json(std::string_view text, const std::string& source);
  // config.json as Hugging Face reads it (LlamaForCausalLM, float32).
  std::string to_json() const;
};

struct HfLlamaCheckpoint {
  std::filesystem::path file;  // the model.safetensors read
  SafeTensors tensors;
  HfLlamaConfig config;
};
HfLlamaCheckpoint open_hf_llama(const std::filesystem::path& path);

// The architecture of a checkpoint of config c: the Llama family
// (pre-norm RMSNorm, SwiGLU, rotary positions) at the config's sizes and knobs, named after the preset
// of its shape if one has it, else after its model_type.
PresetInfo hf_llama_architecture(const HfLlamaConfig& c);

namespace detail {
// The values of the Decoder parameter `xfmr_name` (shape `shape`) from the
// checkpoint's tensors: fused and reordered as they are read (checked then).
std::shared_ptr<const WeightSource> hf_llama_source(const HfLlamaCheckpoint& ck, std::string_view xfmr_name,
                                                    const std::vector<std::int64_t>& shape);
void hf_llama_check_model(const HfLlamaCheckpoint& ck, int vocab, const PresetInfo& p, bool tied, bool head_bias);
// The config of a model of preset `p`.
HfLlamaConfig hf_llama_config_of(const PresetInfo& p, int vocab, bool tied);
// The Decoder parameter `xfmr_name`'s values (its layout) as the Hugging
// Face tensors it stands for, added to `w`.
void hf_llama_add(SafeTensorsWriter& w, std::string_view xfmr_name, const std::vector<float>& values,
                  const HfLlamaConfig& c);
void hf_llama_write(const std::filesystem::path& dir, const SafeTensorsWriter& w, const HfLlamaConfig& c,
                    bool overwrite, std::span<const AttachedFile> attached);

template <class Model>
void hf_llama_fill(Model& model, const HfLlamaCheckpoint& ck) {
  model.visit([&](std::string_view name, auto& value, auto&) {
    assign_weights(value, hf_llama_source(ck, name, value.shape()));
  });
}

template <class Model>
void hf_llama_save(Model& model, const PresetInfo& p, const std::filesystem::path& dir, bool overwrite,
                   std::span<const AttachedFile> attached) {
  using S = typename std::remove_cvref_t<decltype(model)>::S;
  llama_check_preset(p);
  require(!model.options().head_bias, "a Llama checkpoint's head has no bias; this model's has one");
  const HfLlamaConfig c = hf_llama_config_of(p, model.vocab(), model.options().tie_weights);
  SafeTensorsWriter w;
  model.visit([&](std::string_view name, auto& value, auto&) {
    std::vector<S> host(value.size());
    value.copy_to_host(host.data());
    hf_llama_add(w, name, std::vector<float>(host.begin(), host.end()), c);
  });
  hf_llama_write(dir, w, c, overwrite, attached);
}
}  // namespace detail

template <class Cfg, class Backend>
void load_hf_llama(Decoder<Cfg, Backend>& model, const HfLlamaCheckpoint& ck) {
  static_assert(detail::kLlamaShaped<Cfg, Backend>,
                "Llama checkpoints need a Llama-shaped Decoder: pre-norm RmsNorm, SwiGlu, Rope, BIAS = false, "
                "heads D_MODEL / N_HEADS wide");
  const PresetInfo p = preset_info<Cfg>(model.dims());
  detail::llama_check_preset(p);
  detail::hf_llama_check_model(ck, model.vocab(), p, model.options().tie_weights, model.options().head_bias);
  detail::hf_llama_fill(model, ck);
}

template <class Backend>
void load_hf_llama(LanguageModel<Backend>& model, const HfLlamaCheckpoint& ck) {
  const PresetInfo& p = model.preset();
  detail::llama_check_preset(p);
  detail::hf_llama_check_model(ck, model.vocab(), p, model.options().tie_weights, model.options().head_bias);
  detail::hf_llama_fill(model, ck);
}

template <class Cfg, class Backend>
void save_hf_llama(Decoder<Cfg, Backend>& model, const std::filesystem::path& dir, bool overwrite = false,
                   std::span<const AttachedFile> attached = {}) {
  static_assert(detail::kLlamaShaped<Cfg, Backend>,
                "Llama checkpoints need a Llama-shaped Decoder: pre-norm RmsNorm, SwiGlu, Rope, BIAS = false, "
                "heads D_MODEL / N_HEADS wide");
  detail::hf_llama_save(model, preset_info<Cfg>(model.dims()), dir, overwrite, attached);
}

template <class Backend>
void save_hf_llama(LanguageModel<Backend>& model, const std::filesystem::path& dir, bool overwrite = false,
                   std::span<const AttachedFile> attached = {}) {
  detail::hf_llama_save(model, model.preset(), dir, overwrite, attached);
}

}  // namespace xfmr
