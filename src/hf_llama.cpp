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
  HfLlamaConfig c;
  if (j.contains("model_type")) {
    const json& t = j["model_type"];
    require(t == "llama" || t == "qwen2" || t == "mistral", source, ": model_type ", t.dump(),
            " (\"llama\", \"qwen2\" or \"mistral\" expected)");
    c.model_type = t.get<std::string>();
  }
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
  auto boolean = [&](const char* key, bool& field) {
    if (!j.contains(key) || j[key].is_null()) return;
    require(j[key].is_boolean(), source, ": ", key, " ", j[key].dump(), " is not true or false");
    field = j[key].get<bool>();
  };
  boolean("tie_word_embeddings", c.tie_word_embeddings);
  auto number = [&](const json& v, const std::string& key, double lo, double hi) {
    require(v.is_number() && v.get<double>() > lo && v.get<double>() < hi, source, ": ", key, " ", v.dump(),
            " is not a number in (", lo, ", ", hi, ")");
    return v.get<double>();
  };
  if (j.contains("rms_norm_eps")) c.rms_norm_eps = number(j["rms_norm_eps"], "rms_norm_eps", 0, 1);
  if (j.contains("rope_theta")) c.rope_theta = number(j["rope_theta"], "rope_theta", 1, 1e12);
  if (j.contains("hidden_act"))
    require(j["hidden_act"] == "silu", source, ": hidden_act ", j["hidden_act"].dump(), " (\"silu\" expected)");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& r = j["rope_scaling"];
    require(r.is_object(), source, ": rope_scaling ", r.dump(), " is not an object");
    const std::string kind = r.contains("rope_type") ? r["rope_type"].dump() : r.contains("type") ? r["type"].dump() : "";
    RopeScaling& rs = c.rope_scaling;
    if (kind == "\"linear\"") rs.kind = RopeScaling::linear;
    else if (kind == "\"llama3\"") rs.kind = RopeScaling::llama3;
    else if (kind == "\"default\"") rs.kind = RopeScaling::none;
    else detail::fail(source, ": rope_scaling ", r.dump(), " is not built (\"linear\" and \"llama3\" are)");
    if (rs.kind != RopeScaling::none) {
      require(r.contains("factor"), source, ": rope_scaling has no factor");
      rs.factor = number(r["factor"], "rope_scaling.factor", 0.999, 1e6);
    }
    if (rs.kind == RopeScaling::llama3) {
      for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        require(r.contains(key), source, ": llama3 rope_scaling has no ", key);
      rs.low_freq_factor = number(r["low_freq_factor"], "rope_scaling.low_freq_factor", 0, 1e6);
      rs.high_freq_factor = number(r["high_freq_factor"], "rope_scaling.high_freq_factor", rs.low_freq_factor, 1e6);
      rs.original_max_t =
          int(detail::json_integer(r["original_max_position_embeddings"], 1, 1 << 24,
                                   source + ": rope_scaling.original_max_position_embeddings"));
    }
  }
  // What the block computes: Qwen2's q/k/v biases; no other bias, no used window.
  c.qkv_bias = c.model_type == "qwen2";
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (j.contains(bias))
      require(j[bias] == false, source, ": ", bias, " ", j[bias].dump(), " is not built (biases on q, k and v only, "
              "as Qwen2's)");
  bool window = c.model_type == "mistral";
  boolean("use_sliding_window", window);
  if (window && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    const auto w = detail::json_integer(j["sliding_window"], 1, std::int64_t(1) << 40, source + ": sliding_window");
    require(w >= c.max_position_embeddings, source, ": sliding_window ", w, " is shorter than the context ",
            c.max_position_embeddings, ": sliding-window attention is not built");
  }
  require(c.hidden_size % c.num_attention_heads == 0 && (c.hidden_size / c.num_attention_heads) % 2 == 0, source,
          ": hidden_size ", c.hidden_size, " is not num_attention_heads ", c.num_attention_heads, " heads of an even width");
  if (j.contains("head_dim") && !j["head_dim"].is_null())
    require(j["head_dim"] == c.hidden_size / c.num_attention_heads, source, ": head_dim ", j["head_dim"].dump(),
            " is not hidden_size / num_attention_heads = ", c.hidden_size / c.num_attention_heads,
            " (heads of another width are not built)");
  if (j.contains("partial_rotary_factor"))
    require(j["partial_rotary_factor"] == 1 || j["partial_rotary_factor"] == 1.0, source, ": partial_rotary_factor ",
            j["partial_rotary_factor"].dump(), " (partial rotary positions are not built)");
  require(c.num_attention_heads % c.num_key_value_heads == 0, source, ": num_attention_heads ", c.num_attention_heads,
          " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  return c;
}

std::string HfLlamaConfig::to_json() const {
  json scaling = nullptr;
  if (rope_scaling.kind == RopeScaling::linear) scaling = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
  if (rope_scaling.kind == RopeScaling::llama3)
    scaling = {{"rope_type", "llama3"},
               {"factor", rope_scaling.factor},
               {"low_freq_factor", rope_scaling.low_freq_factor},
               {"high_freq_factor", rope_scaling.high_freq_factor},
               {"original_max_position_embeddings", rope_scaling.original_max_t}};
  const bool qwen = model_type == "qwen2";
  json j = {{"model_type", model_type},
            {"architectures", {qwen ? "Qwen2ForCausalLM" : model_type == "mistral" ? "MistralForCausalLM"
                                                                                    : "LlamaForCausalLM"}},
            {"vocab_size", vocab_size},
            {"hidden_size", hidden_size},
            {"intermediate_size", intermediate_size},
            {"num_hidden_layers", num_hidden_layers},
            {"num_attention_heads", num_attention_heads},
            {"num_key_value_heads", num_key_value_heads},
            {"max_position_embeddings", max_position_embeddings},
            {"hidden_act", "silu"},
            {"rms_norm_eps", rms_norm_eps},
            {"rope_theta", rope_theta},
            {"rope_scaling", scaling},
            {"tie_word_embeddings", tie_word_embeddings},
            {"torch_dtype", "float32"}};
  if (qwen) j["use_sliding_window"] = false;
  else j["attention_bias"] = false, j["mlp_bias"] = false;
  if (model_type == "mistral") j["sliding_window"] = nullptr;
  return j.dump(2) + "\n";
}

bool llama_shaped(const PresetInfo& p) {
  return p.parts.pre_norm && p.parts.rms_norm && p.parts.activation == ModelParts::Activation::swiglu &&
         p.parts.positions == ModelParts::Positions::rope && !p.bias && p.qk_head() * p.n_heads == p.d_model &&
         p.v_head() * p.n_heads == p.d_model;
}

PresetInfo hf_llama_architecture(const HfLlamaConfig& c) {
  PresetInfo p;
  p.parts = {.pre_norm = true, .rms_norm = true, .activation = ModelParts::Activation::swiglu,
             .positions = ModelParts::Positions::rope};
  p.name = c.model_type;  // unless a preset has this architecture (below)
  p.max_t = c.max_position_embeddings, p.d_model = c.hidden_size, p.n_heads = c.num_attention_heads;
  p.n_kv_heads = c.num_key_value_heads, p.n_layers = c.num_hidden_layers, p.d_ff = c.intermediate_size;
  p.bias = false, p.qkv_bias = c.qkv_bias;
  p.norm_eps = c.rms_norm_eps, p.rope_theta = c.rope_theta, p.rope_scaling = c.rope_scaling;
  p.name = preset_name_of(p, p.name);
  return p;
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
    if (c.qkv_bias) {
      expect(l + "self_attn.q_proj.bias", {D});
      expect(l + "self_attn.k_proj.bias", {kv});
      expect(l + "self_attn.v_proj.bias", {kv});
    }
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
                        (n.ends_with("_layernorm.weight") || n.ends_with("_proj.weight") ||
                         n.ends_with("rotary_emb.inv_freq") ||
                         (c.qkv_bias && (n.ends_with("q_proj.bias") || n.ends_with("k_proj.bias") ||
                                         n.ends_with("v_proj.bias")))));
    require(known, file.string(), ": tensor '", n, "' is not part of a ", c.model_type, " model of this config");
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
// Each head's rows from xfmr's pairs (2i, 2i+1) back to Hugging Face's
// rotate-half order (reading turns them the other way: WeightPiece's
// rotary_pairs).
std::vector<float> rotate_half_heads(const std::vector<float>& w, int heads, int head, int cols) {
  std::vector<float> out(w.size());
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < head / 2; ++i)
      for (int half = 0; half < 2; ++half) {
        const std::ptrdiff_t hf = std::ptrdiff_t(h) * head + half * head / 2 + i, ours = std::ptrdiff_t(h) * head + 2 * i + half;
        std::copy_n(w.begin() + ours * cols, cols, out.begin() + hf * cols);
      }
  return out;
}
}  // namespace

std::shared_ptr<const WeightSource> hf_llama_source(const HfLlamaCheckpoint& ck, std::string_view xfmr_name,
                                                    const std::vector<std::int64_t>& shape) {
  const HfLlamaConfig& c = ck.config;
  const int head = c.hidden_size / c.num_attention_heads;
  const std::string name(xfmr_name);
  std::vector<WeightPiece> pieces;
  if (name == "tok_emb.weight") {
    pieces = {{"model.embed_tokens.weight"}};
  } else if (name == "ln_f.weight") {
    pieces = {{"model.norm.weight"}};
  } else if (name == "lm_head.weight") {
    pieces = {{c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"}};
  } else {
    require(name.starts_with("blocks."), "Llama checkpoint: no counterpart for the model's '", name, "'");
    const std::size_t dot = name.find('.', 7);
    const std::string l = "model.layers." + name.substr(7, dot - 7) + ".", part = name.substr(dot + 1);
    const auto pairs = WeightPiece::rotary_pairs;
    if (part == "ln1.weight") pieces = {{l + "input_layernorm.weight"}};
    else if (part == "ln2.weight") pieces = {{l + "post_attention_layernorm.weight"}};
    else if (part == "attn.proj.weight") pieces = {{l + "self_attn.o_proj.weight"}};
    else if (part == "ff.fc2.weight") pieces = {{l + "mlp.down_proj.weight"}};
    else if (part == "attn.qkv.weight")
      pieces = {{l + "self_attn.q_proj.weight", pairs, head}, {l + "self_attn.k_proj.weight", pairs, head},
                {l + "self_attn.v_proj.weight"}};
    else if (part == "attn.qkv.bias" && c.qkv_bias)  // a bias is a column: its rows reorder as the weight's
      pieces = {{l + "self_attn.q_proj.bias", pairs, head}, {l + "self_attn.k_proj.bias", pairs, head},
                {l + "self_attn.v_proj.bias"}};
    else if (part == "ff.fc1.weight") pieces = {{l + "mlp.gate_proj.weight"}, {l + "mlp.up_proj.weight"}};
    else detail::fail("Llama checkpoint: no counterpart for the model's '", name, "'");
  }
  const std::int64_t rows = shape.empty() ? 0 : shape[0], cols = shape.size() == 2 ? shape[1] : 1;
  return safetensors_weights(ck.tensors, std::move(pieces), rows, cols);
}

void hf_llama_check_model(const HfLlamaCheckpoint& ck, int vocab, const PresetInfo& p, bool tied, bool head_bias) {
  const HfLlamaConfig& c = ck.config;
  const std::string source = ck.file.string();
  auto same = [&](const char* field, int file, const char* ours, int model) {
    require(file == model, source, ": ", field, " is ", file, " but the model's ", ours, " is ", model);
  };
  same("vocab_size", c.vocab_size, "vocabulary", vocab);
  same("hidden_size", c.hidden_size, "D_MODEL", p.d_model);
  same("num_hidden_layers", c.num_hidden_layers, "N_LAYERS", p.n_layers);
  same("num_attention_heads", c.num_attention_heads, "N_HEADS", p.n_heads);
  same("num_key_value_heads", c.num_key_value_heads, "N_KV_HEADS", p.kv_heads());
  same("intermediate_size", c.intermediate_size, "D_FF", p.d_ff);
  auto knob = [&](const char* field, double file, const char* ours, double model) {
    require(std::abs(file - model) <= 1e-12 * std::abs(model), source, ": ", field, " is ", file, " but the model's ",
            ours, " is ", model);
  };
  knob("rms_norm_eps", c.rms_norm_eps, "norm epsilon", p.norm_eps);
  knob("rope_theta", c.rope_theta, "rotary theta", p.rope_theta);
  require(c.rope_scaling == p.rope_scaling, source, ": rope_scaling differs from the model's");
  require(c.qkv_bias == p.qkv_bias, source, c.qkv_bias ? ": q, k and v have biases; the model's have none"
                                                      : ": q, k and v have no biases; the model's have");
  require(tied == c.tie_word_embeddings, source, ": tie_word_embeddings is ", c.tie_word_embeddings ? "true" : "false",
          "; build the model with tie_weights = ", c.tie_word_embeddings ? "true" : "false");
  require(!head_bias, source, ": Llama's head has no bias; build the model with head_bias = false");
}

void llama_check_preset(const PresetInfo& p) {
  require(llama_shaped(p), "the preset '", p.name, "' (", p.shape(), ") is not Llama-shaped: Llama checkpoints need "
          "pre-norm RMSNorm, SwiGLU, rotary positions and no biases");
}

HfLlamaConfig hf_llama_config_of(const PresetInfo& p, int vocab, bool tied) {
  HfLlamaConfig c;
  c.model_type = p.qkv_bias ? "qwen2" : "llama";
  c.rms_norm_eps = p.norm_eps;
  c.rope_theta = p.rope_theta;
  c.rope_scaling = p.rope_scaling;
  c.qkv_bias = p.qkv_bias;
  c.vocab_size = vocab;
  c.hidden_size = p.d_model;
  c.intermediate_size = p.d_ff;
  c.num_hidden_layers = p.n_layers;
  c.num_attention_heads = p.n_heads;
  c.num_key_value_heads = p.kv_heads();
  c.max_position_embeddings = p.max_t;
  c.tie_word_embeddings = tied;
  return c;
}

void hf_llama_add(SafeTensorsWriter& w, std::string_view xfmr_name, const std::vector<float>& v,
                  const HfLlamaConfig& c) {
  const std::int64_t D = c.hidden_size, F = c.intermediate_size, head = D / c.num_attention_heads,
                     kv = head * c.num_key_value_heads;
  const std::string name(xfmr_name);
  auto add = [&](const std::string& to, std::vector<std::int64_t> shape, std::size_t from, std::size_t n) {
    w.add<float>(to, std::move(shape), std::span<const float>(v).subspan(from, n));
  };
  if (name == "tok_emb.weight") return add("model.embed_tokens.weight", {c.vocab_size, D}, 0, v.size());
  if (name == "ln_f.weight") return add("model.norm.weight", {D}, 0, v.size());
  if (name == "lm_head.weight") return add("lm_head.weight", {c.vocab_size, D}, 0, v.size());
  require(name.starts_with("blocks."), "Llama checkpoint: no counterpart for the model's '", name, "'");
  const std::size_t dot = name.find('.', 7);
  const std::string l = "model.layers." + name.substr(7, dot - 7) + ".", part = name.substr(dot + 1);
  if (part == "ln1.weight") return add(l + "input_layernorm.weight", {D}, 0, v.size());
  if (part == "ln2.weight") return add(l + "post_attention_layernorm.weight", {D}, 0, v.size());
  if (part == "attn.proj.weight") return add(l + "self_attn.o_proj.weight", {D, D}, 0, v.size());
  if (part == "ff.fc2.weight") return add(l + "mlp.down_proj.weight", {D, F}, 0, v.size());
  if (part == "ff.fc1.weight") {  // rows [gate | up]
    add(l + "mlp.gate_proj.weight", {F, D}, 0, std::size_t(F * D));
    return add(l + "mlp.up_proj.weight", {F, D}, std::size_t(F * D), std::size_t(F * D));
  }
  if (part == "attn.qkv.bias" && c.qkv_bias) {  // [q heads | k heads | v heads], each head's pairs as the rows'
    const auto q = rotate_half_heads({v.begin(), v.begin() + D}, c.num_attention_heads, int(head), 1);
    const auto k = rotate_half_heads({v.begin() + D, v.begin() + D + kv}, c.num_key_value_heads, int(head), 1);
    w.add<float>(l + "self_attn.q_proj.bias", {D}, std::span<const float>(q));
    w.add<float>(l + "self_attn.k_proj.bias", {kv}, std::span<const float>(k));
    return add(l + "self_attn.v_proj.bias", {kv}, std::size_t(D + kv), std::size_t(kv));
  }
  require(part == "attn.qkv.weight", "Llama checkpoint: no counterpart for the model's '", name, "'");
  const auto rows = [&](std::int64_t first, std::int64_t n) {
    return std::vector<float>(v.begin() + first * D, v.begin() + (first + n) * D);
  };
  const auto q = rotate_half_heads(rows(0, D), c.num_attention_heads, int(head), int(D));
  const auto k = rotate_half_heads(rows(D, kv), c.num_key_value_heads, int(head), int(D));
  w.add<float>(l + "self_attn.q_proj.weight", {D, D}, std::span<const float>(q));
  w.add<float>(l + "self_attn.k_proj.weight", {kv, D}, std::span<const float>(k));
  add(l + "self_attn.v_proj.weight", {kv, D}, std::size_t((D + kv) * D), std::size_t(kv * D));
}

void hf_llama_write(const fs::path& dir, const SafeTensorsWriter& w, const HfLlamaConfig& c, bool overwrite,
                    std::span<const AttachedFile> attached) {
  write_hf_directory(dir, w, c.to_json(), overwrite, attached);
}

}  // namespace detail
}  // namespace xfmr
