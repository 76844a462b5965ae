// hf_llama.hpp: Hugging Face LlamaForCausalLM checkpoints (a directory of
// model.safetensors and config.json; F32, F16 or BF16 tensors, read as
// float), into a Llama-shaped Decoder.
//
// Tensors, for each layer i under "model.layers.<i>.": input_layernorm,
// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj
// (".weight" each, no biases); then "model.embed_tokens.weight",
// "model.norm.weight" and "lm_head.weight" (absent or equal to the
// embedding when tie_word_embeddings). Rotary buffers ("...rotary_emb.
// inv_freq") are skipped.
//
// Hugging Face turns rotary pairs (i, i + head/2) of each head (its
// rotate_half); xfmr, like Meta's and llama2.c's, turns pairs (2i, 2i+1).
// Loading reorders each q_proj and k_proj head's rows so: row 2i takes
// row i, row 2i+1 takes row head/2 + i. The logits are the same function.
//
// HfLlamaConfig: config.json's fields that fix the shape; hidden_act must
//   be "silu", rms_norm_eps 1e-5 and rope_theta 10000 (xfmr's RmsNorm and
//   Rope), and no rope_scaling; anything else is an error naming the field.
// open_hf_llama(path): the directory (or its .safetensors file) and its
//   config, the tensors' shapes checked against it before anything else.
// load_hf_llama(model, checkpoint): fills a Decoder of Llama's
//   configuration (pre-norm RmsNorm, SwiGlu, Rope, BIAS = false; its head
//   tied as the config says, without bias) whose sizes are the config's.
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
#include "xfmr/models/decoder.hpp"

namespace xfmr {

struct HfLlamaConfig {
  int vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
      num_key_value_heads = 0, max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // config.json's text; `source` names it in errors.
  static HfLlamaConfig from_json(std::string_view text, const std::string& source);
};

struct HfLlamaCheckpoint {
  std::filesystem::path file;  // the model.safetensors read
  SafeTensors tensors;
  HfLlamaConfig config;
};
HfLlamaCheckpoint open_hf_llama(const std::filesystem::path& path);

namespace detail {
// The values of the Decoder parameter `xfmr_name` (shape `shape`) from the
// checkpoint's tensors: fused, reordered and checked.
std::vector<float> hf_llama_values(const HfLlamaCheckpoint& ck, std::string_view xfmr_name,
                                   const std::vector<std::int64_t>& shape);
void hf_llama_check_model(const HfLlamaCheckpoint& ck, int vocab, int d, int layers, int heads, int kv_heads, int d_ff,
                          bool tied, bool head_bias);
}  // namespace detail

template <class Cfg, class Backend>
void load_hf_llama(Decoder<Cfg, Backend>& model, const HfLlamaCheckpoint& ck) {
  static_assert(detail::kLlamaShaped<Cfg, Backend>,
                "Llama checkpoints need a Llama-shaped Decoder: pre-norm RmsNorm, SwiGlu, Rope, BIAS = false, "
                "heads D_MODEL / N_HEADS wide");
  detail::hf_llama_check_model(ck, model.vocab(), Cfg::D_MODEL, Cfg::N_LAYERS, Cfg::N_HEADS, kv_heads<Cfg>(), Cfg::D_FF,
                               model.options().tie_weights, model.options().head_bias);
  using S = typename Backend::Scalar;
  model.visit([&](std::string_view name, auto& value, auto&) {
    const auto v = detail::hf_llama_values(ck, name, value.shape());
    const std::vector<S> host(v.begin(), v.end());
    value.copy_from_host(host.data());
  });
}

}  // namespace xfmr
