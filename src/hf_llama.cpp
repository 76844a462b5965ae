// hf_llama.cpp: Hugging Face Llama checkpoints (io/hf_llama.hpp).
#include "xfmr/io/hf_llama.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "json_bounds.hpp"
#include "xfmr/text/text.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace xfmr {

HfLlamaConfig HfLlamaConfig::from_json(std::string_view text, const std::string& source) {
  json j = detail::parse_json_object(text, source, "a Llama config");
  if (j.contains("model_type"))
    require(j["model_type"] == "llama", source, ": model_type ", j["model_type"].dump(), " (\"llama\" expected)");
  HfLlamaConfig c;
  auto integer = [&](const char* key, int& field, std::int64_t hi) {
    require(j.contains(key), source, ": no ", key);
    field = int(detail::json_integer(j[key], 1, hi, source + ": " + key));
  };
  integer("vocab_size", c.vocab_size, 1 << 24);
  integer("hidden_size", c.hidden_size, 1 << 16);
  integer("intermediate_size", c.intermediate_size, 1 << 20);
  integer("num_hidden_layers", c.num_hidden_layers, 1 << 10);
  integer("num_attention_heads", c.num_attention_heads, 1 << 10);
  c.num_key_value_heads = c.num_attention_heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null())
    integer("num_key_value_heads", c.num_key_value_heads, 1 << 10);
  integer("max_position_embeddings", c.max_position_embeddings, 1 << 24);
  if (j.contains("tie_word_embeddings")) {
    require(j["tie_word_embeddings"].is_boolean(), source, ": tie_word_embeddings ", j["tie_word_embeddings"].dump(),
            " is not true or false");
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  // What xfmr's Llama block computes; anything else would load and compute another function.
  auto number_is = [&](const char* key, double want) {
    if (!j.contains(key)) return;
    require(j[key].is_number() && std::abs(j[key].get<double>() - want) <= 1e-9 * want, source, ": ", key, " ",
            j[key].dump(), " (xfmr's Llama computes with ", want, ")");
  };
  number_is("rms_norm_eps", 1e-5);
  number_is("rope_theta", 10000.0);
  if (j.contains("hidden_act"))
    require(j["hidden_act"] == "silu", source, ": hidden_act ", j["hidden_act"].dump(), " (\"silu\" expected)");
  if (j.contains("rope_scaling"))
    require(j["rope_scaling"].is_null(), source, ": rope_scaling ", j["rope_scaling"].dump(), " is not supported");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (j.contains(bias)) require(j[bias] == false, source, ": ", bias, " ", j[bias].dump(), " is not supported");
  require(c.hidden_size % c.num_attention_heads == 0 && (c.hidden_size / c.num_attention_heads) % 2 == 0, source,
          ": hidden_size ", c.hidden_size, " is not num_attention_heads ", c.num_attention_heads, " heads of an even width");
  require(c.num_attention_heads % c.num_key_value_heads == 0, source, ": num_attention_heads ", c.num_attention_heads,
          " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  return c;
}

HfLlamaCheckpoint open_hf_llama(const fs::path& path) {
  const fs::path file = fs::is_directory(path) ? path / "model.safetensors" : path;
  require(fs::exists(file), file.string(), ": no such file (a directory with model.safetensors and config.json, or the .safetensors file)");
  const fs::path config = file.parent_path() / "config.json";
  require(fs::exists(config), file.string(), ": no config.json beside it to give the model's shape");
  HfLlamaCheckpoint ck{file, SafeTensors::load(file), HfLlamaConfig::from_json(read_text_file(config), config.string())};
  const HfLlamaConfig& c = ck.config;
  const std::int64_t D = c.hidden_size, F = c.intermediate_size, kv = D / c.num_attention_heads * c.num_key_value_heads;
  auto expect = [&](const std::string& name, std::vector<std::int64_t> shape) {
    require(ck.tensors.contains(name), file.string(), ": no tensor '", name, "', which its config calls for");
    require(ck.tensors.info(name).shape == shape, file.string(), ": tensor '", name, "' has shape ",
            shape_string(ck.tensors.info(name).shape), " but its config gives ", shape_string(shape));
  };
  expect("model.embed_tokens.weight", {c.vocab_size, D});
  expect("model.norm.weight", {D});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    expect(l + "input_layernorm.weight", {D});
    expect(l + "self_attn.q_proj.weight", {D, D});
    expect(l + "self_attn.k_proj.weight", {kv, D});
    expect(l + "self_attn.v_proj.weight", {kv, D});
    expect(l + "self_attn.o_proj.weight", {D, D});
    expect(l + "post_attention_layernorm.weight", {D});
    expect(l + "mlp.gate_proj.weight", {F, D});
    expect(l + "mlp.up_proj.weight", {F, D});
    expect(l + "mlp.down_proj.weight", {D, F});
  }
  if (!c.tie_word_embeddings) expect("lm_head.weight", {c.vocab_size, D});
  for (const auto& n : ck.tensors.names()) {
    const bool known = n == "model.embed_tokens.weight" || n == "model.norm.weight" || n == "lm_head.weight" ||
                       (n.starts_with("model.layers.") &&
                        (n.ends_with("_layernorm.weight") || n.ends_with("_proj.weight") || n.ends_with("rotary_emb.inv_freq")));
    require(known, file.string(), ": tensor '", n, "' is not part of a LlamaForCausalLM");
    if (n.starts_with("model.layers.")) {
      const int layer = std::atoi(n.c_str() + std::string_view("model.layers.").size());
      require(layer < c.num_hidden_layers, file.string(), ": tensor '", n, "' is past the config's ",
              c.num_hidden_layers, " layers");
    }
  }
  if (c.tie_word_embeddings && ck.tensors.contains("lm_head.weight"))
    require(ck.tensors.values<float>("lm_head.weight") == ck.tensors.values<float>("model.embed_tokens.weight"),
            file.string(), ": tie_word_embeddings, but 'lm_head.weight' differs from 'model.embed_tokens.weight'");
  return ck;
}

namespace detail {

namespace {
std::vector<float> finite(const HfLlamaCheckpoint& ck, const std::string& name) {
  auto v = ck.tensors.values<float>(name);
  const auto bad = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
  require(bad == v.end(), ck.file.string(), ": tensor '", name, "' holds ", bad == v.end() ? 0.0f : *bad,
          " at element ", bad - v.begin(), "; a checkpoint's values must be finite");
  return v;
}
// Each head's rows from Hugging Face's rotate-half order to pairs (2i, 2i+1).
std::vector<float> interleave_heads(const std::vector<float>& w, int heads, int head, int cols) {
  std::vector<float> out(w.size());
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < head / 2; ++i)
      for (int half = 0; half < 2; ++half)
        std::copy_n(w.begin() + (std::ptrdiff_t(h) * head + half * head / 2 + i) * cols, cols,
                    out.begin() + (std::ptrdiff_t(h) * head + 2 * i + half) * cols);
  return out;
}
}  // namespace

std::vector<float> hf_llama_values(const HfLlamaCheckpoint& ck, std::string_view xfmr_name,
                                   const std::vector<std::int64_t>& shape) {
  const HfLlamaConfig& c = ck.config;
  const int D = c.hidden_size, head = D / c.num_attention_heads;
  const std::string name(xfmr_name);
  std::vector<float> v;
  if (name == "tok_emb.weight") {
    v = finite(ck, "model.embed_tokens.weight");
  } else if (name == "ln_f.weight") {
    v = finite(ck, "model.norm.weight");
  } else if (name == "lm_head.weight") {
    v = finite(ck, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  } else {
    require(name.starts_with("blocks."), "Llama checkpoint: no counterpart for the model's '", name, "'");
    const std::size_t dot = name.find('.', 7);
    const std::string l = "model.layers." + name.substr(7, dot - 7) + ".", part = name.substr(dot + 1);
    auto append = [&](const std::vector<float>& w) { v.insert(v.end(), w.begin(), w.end()); };
    if (part == "ln1.weight") v = finite(ck, l + "input_layernorm.weight");
    else if (part == "ln2.weight") v = finite(ck, l + "post_attention_layernorm.weight");
    else if (part == "attn.proj.weight") v = finite(ck, l + "self_attn.o_proj.weight");
    else if (part == "ff.fc2.weight") v = finite(ck, l + "mlp.down_proj.weight");
    else if (part == "attn.qkv.weight") {
      append(interleave_heads(finite(ck, l + "self_attn.q_proj.weight"), c.num_attention_heads, head, D));
      append(interleave_heads(finite(ck, l + "self_attn.k_proj.weight"), c.num_key_value_heads, head, D));
      append(finite(ck, l + "self_attn.v_proj.weight"));
    } else if (part == "ff.fc1.weight") {
      append(finite(ck, l + "mlp.gate_proj.weight"));
      append(finite(ck, l + "mlp.up_proj.weight"));
    } else {
      detail::fail("Llama checkpoint: no counterpart for the model's '", name, "'");
    }
  }
  std::size_t n = 1;
  for (auto s : shape) n *= std::size_t(s);
  require(v.size() == n, ck.file.string(), ": '", name, "' has ", v.size(), " values, the model's ", shape_string(shape));
  return v;
}

void hf_llama_check_model(const HfLlamaCheckpoint& ck, int vocab, int d, int layers, int heads, int kv_heads, int d_ff,
                          bool tied, bool head_bias) {
  const HfLlamaConfig& c = ck.config;
  const std::string source = ck.file.string();
  auto same = [&](const char* field, int file, const char* ours, int model) {
    require(file == model, source, ": ", field, " is ", file, " but the model's ", ours, " is ", model);
  };
  same("vocab_size", c.vocab_size, "vocabulary", vocab);
  same("hidden_size", c.hidden_size, "D_MODEL", d);
  same("num_hidden_layers", c.num_hidden_layers, "N_LAYERS", layers);
  same("num_attention_heads", c.num_attention_heads, "N_HEADS", heads);
  same("num_key_value_heads", c.num_key_value_heads, "N_KV_HEADS", kv_heads);
  same("intermediate_size", c.intermediate_size, "D_FF", d_ff);
  require(tied == c.tie_word_embeddings, source, ": tie_word_embeddings is ", c.tie_word_embeddings ? "true" : "false",
          "; build the model with tie_weights = ", c.tie_word_embeddings ? "true" : "false");
  require(!head_bias, source, ": Llama's head has no bias; build the model with head_bias = false");
}

}  // namespace detail
}  // namespace xfmr
