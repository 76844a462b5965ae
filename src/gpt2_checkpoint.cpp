// gpt2_checkpoint.cpp: the non-template half of gpt2.hpp: config.json, the
// tensor names, and the transposes of GPT-2's Conv1D weights.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "json_bounds.hpp"
#include "xfmr/io/gpt2.hpp"
#include "xfmr/text/text.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace xfmr {

namespace {

// "h.<i>." when `name` starts so (any block number), else npos.
std::size_t block_prefix_end(std::string_view name) {
  if (!name.starts_with("h.")) return std::string_view::npos;
  std::size_t i = 2;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  return i > 2 && i < name.size() && name[i] == '.' ? i + 1 : std::string_view::npos;
}

// (rows, cols) -> (cols, rows).
template <class S>
std::vector<S> transpose(const std::vector<S>& v, std::int64_t rows, std::int64_t cols) {
  std::vector<S> t(v.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[std::size_t(c * rows + r)] = v[std::size_t(r * cols + c)];
  return t;
}

}  // namespace

Gpt2Config Gpt2Config::from_json(std::string_view text, const std::string& source) {
  json j = detail::parse_json_object(text, source, "a GPT-2 config");
  Gpt2Config c;
  auto integer = [&](const char* key, int& field, std::int64_t hi) {
    if (j.contains(key)) field = int(detail::json_integer(j[key], 1, hi, source + ": " + key));
  };
  integer("vocab_size", c.vocab_size, 1 << 24);
  integer("n_positions", c.n_positions, 1 << 24);
  integer("n_embd", c.n_embd, 1 << 16);
  integer("n_layer", c.n_layer, 1 << 10);
  integer("n_head", c.n_head, 1 << 10);
  if (j.contains("n_inner") && !j["n_inner"].is_null()) integer("n_inner", c.n_inner, 1 << 20);
  if (j.contains("layer_norm_epsilon")) {
    require(j["layer_norm_epsilon"].is_number(), source, ": layer_norm_epsilon ", j["layer_norm_epsilon"].dump(),
            " is not a number");
    c.layer_norm_epsilon = j["layer_norm_epsilon"].get<double>();
    require(c.layer_norm_epsilon > 0 && c.layer_norm_epsilon < 1, source, ": layer_norm_epsilon ",
            c.layer_norm_epsilon, " is not in (0, 1)");
  }
  if (j.contains("activation_function")) {
    require(j["activation_function"].is_string(), source, ": activation_function ", j["activation_function"].dump(),
            " is not a string");
    c.activation_function = j["activation_function"].get<std::string>();
  }
  if (j.contains("model_type") && j["model_type"].is_string())
    require(j["model_type"] == "gpt2", source, ": model_type '", j["model_type"].get<std::string>(),
            "' is not gpt2");
  // Fields that change what the model computes, beyond the blocks xfmr builds.
  auto refused = [&](const char* key, const nlohmann::json& built, const char* what) {
    if (j.contains(key) && !j[key].is_null())
      require(j[key] == built, source, ": ", key, " ", j[key].dump(), " is not built (", what, ")");
  };
  refused("scale_attn_by_inverse_layer_idx", false, "attention scaled by 1/(layer + 1)");
  refused("scale_attn_weights", true, "attention without the 1/sqrt(head width) scale");
  refused("add_cross_attention", false, "cross-attention to an encoder");
  require(c.n_embd % c.n_head == 0, source, ": n_embd ", c.n_embd, " is not a multiple of n_head ", c.n_head);
  return c;
}

std::string Gpt2Config::to_json() const {
  json j = {{"model_type", "gpt2"},
            {"architectures", {"GPT2LMHeadModel"}},
            {"vocab_size", vocab_size},
            {"n_positions", n_positions},
            {"n_ctx", n_positions},
            {"n_embd", n_embd},
            {"n_layer", n_layer},
            {"n_head", n_head},
            {"n_inner", n_inner > 0 ? json(n_inner) : json(nullptr)},
            {"activation_function", activation_function},
            {"layer_norm_epsilon", layer_norm_epsilon},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"tie_word_embeddings", true},
            {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

bool gpt2_shaped(const PresetInfo& p) {
  using Act = ModelParts::Activation;
  using Pos = ModelParts::Positions;
  return p.parts.pre_norm && !p.parts.rms_norm && p.parts.activation == Act::gelu &&
         p.parts.positions == Pos::learned && p.bias && p.kv_heads() == p.n_heads &&
         p.qk_head() * p.n_heads == p.d_model && p.v_head() * p.n_heads == p.d_model;
}

Gpt2Config gpt2_config_of(const PresetInfo& p, int vocab) {
  Gpt2Config c;
  c.vocab_size = vocab;
  c.n_positions = p.max_t;
  c.n_embd = p.d_model;
  c.n_layer = p.n_layers;
  c.n_head = p.n_heads;
  c.n_inner = p.d_ff == 4 * p.d_model ? 0 : p.d_ff;
  c.layer_norm_epsilon = p.norm_eps;
  return c;
}

PresetInfo gpt2_architecture(const Gpt2Config& c) {
  PresetInfo p;
  p.parts = presets::gpt(ModelParts::Activation::gelu);  // pre-norm LayerNorm, GELU, learned positions
  p.max_t = c.n_positions, p.d_model = c.n_embd, p.n_heads = p.n_kv_heads = c.n_head, p.n_layers = c.n_layer;
  p.d_ff = c.d_ff(), p.norm_eps = c.layer_norm_epsilon;
  p.name = preset_name_of(p, "gpt2");
  return p;
}

Gpt2Config read_gpt2_config(const fs::path& model_file, const SafeTensors& st) {
  const auto& meta = st.metadata();
  if (const auto it = meta.find("config"); it != meta.end())
    return Gpt2Config::from_json(it->second, st.source() + ": metadata 'config'");
  const fs::path beside = model_file.parent_path() / "config.json";
  require(fs::exists(beside), st.source(), ": no 'config' in its metadata and no ", beside.string(),
          " beside it to give GPT-2's shape");
  return Gpt2Config::from_json(read_text_file(beside), beside.string());
}

Gpt2Checkpoint open_gpt2(const fs::path& path, const std::string& what) {
  const fs::path file = fs::is_directory(path) ? path / "model.safetensors" : path;
  require(fs::exists(file), what, " ", file.string(),
          ": no such file (a directory with model.safetensors and config.json, or the .safetensors file)");
  Gpt2Checkpoint c{file, SafeTensors::load(file), {}};
  c.config = read_gpt2_config(file, c.tensors);
  // The sizes a model is built with, checked against the tensors the file
  // holds before anything is allocated for them: a config may say anything.
  const Gpt2Config& g = c.config;
  const std::string prefix = detail::gpt2_prefix(c.tensors);
  const auto expect = [&](const std::string& name, std::vector<std::int64_t> shape, const char* fields) {
    const std::string key = prefix + name;
    require(c.tensors.contains(key), file.string(), ": no tensor '", key, "', which its config (", fields,
            ") calls for");
    require(c.tensors.info(key).shape == shape, file.string(), ": tensor '", key, "' has shape ",
            shape_string(c.tensors.info(key).shape), " but its config (", fields, ") gives ", shape_string(shape));
  };
  expect("wte.weight", {g.vocab_size, g.n_embd}, "vocab_size, n_embd");
  expect("wpe.weight", {g.n_positions, g.n_embd}, "n_positions, n_embd");
  expect("h." + std::to_string(g.n_layer - 1) + ".mlp.c_fc.weight", {g.n_embd, g.d_ff()}, "n_layer, n_embd, n_inner");
  require(!c.tensors.contains(prefix + "h." + std::to_string(g.n_layer) + ".mlp.c_fc.weight"), file.string(),
          ": holds more blocks than its config's n_layer ", g.n_layer);
  return c;
}

namespace detail {

Gpt2Tensor gpt2_tensor(std::string_view x) {
  auto leaf = [&](std::string_view name, std::string_view from, std::string_view to) -> std::optional<std::string> {
    if (!name.starts_with(from)) return std::nullopt;
    const auto rest = name.substr(from.size());
    if (rest != "weight" && rest != "bias") return std::nullopt;
    return std::string(to) + std::string(rest);
  };
  if (x == "tok_emb.weight") return {"wte.weight", false};
  if (x == "pos_emb.weight") return {"wpe.weight", false};
  if (auto n = leaf(x, "ln_f.", "ln_f.")) return {*n, false};
  if (x.starts_with("blocks.")) {
    const auto dot = x.find('.', 7);
    if (dot != std::string_view::npos && dot > 7) {
      const std::string block = "h." + std::string(x.substr(7, dot - 7)) + ".";
      const auto rest = x.substr(dot + 1);
      struct Map {
        std::string_view from, to;
        bool conv1d;
      };
      for (const Map& m : {Map{"ln1.", "ln_1.", false}, Map{"attn.qkv.", "attn.c_attn.", true},
                           Map{"attn.proj.", "attn.c_proj.", true}, Map{"ln2.", "ln_2.", false},
                           Map{"ff.fc1.", "mlp.c_fc.", true}, Map{"ff.fc2.", "mlp.c_proj.", true}})
        if (auto n = leaf(rest, m.from, m.to)) return {block + *n, m.conv1d && rest.ends_with("weight")};
    }
  }
  fail("the Decoder's parameter '", x, "' has no GPT-2 counterpart (GPT-2 ties its head to wte and has no head bias)");
}

std::string gpt2_prefix(const SafeTensors& st) { return st.contains("transformer.wte.weight") ? "transformer." : ""; }

std::shared_ptr<const WeightSource> gpt2_source(const SafeTensors& st, const std::string& name,
                                                const std::vector<std::int64_t>& shape, bool transposed) {
  require(st.contains(name), st.source(), ": no tensor '", name, "' (is this a GPT-2 checkpoint of this depth?)");
  const std::vector<std::int64_t> stored = transposed ? std::vector<std::int64_t>{shape[1], shape[0]} : shape;
  const auto& info = st.info(name);
  require(info.shape == stored, st.source(), ": tensor '", name, "' has shape ", shape_string(info.shape),
          " but this model needs ", shape_string(stored));
  const std::int64_t rows = shape.empty() ? 0 : shape[0], cols = shape.size() == 2 ? shape[1] : 1;
  return safetensors_weights(st, {{name, transposed ? WeightPiece::columns : WeightPiece::rows}}, rows, cols);
}

void gpt2_check_rest(const SafeTensors& st, const std::string& prefix, const std::set<std::string>& used) {
  for (const auto& n : st.names()) {
    if (used.count(n)) continue;
    if (n == "lm_head.weight") {
      require(st.values<float>(n) == st.values<float>(prefix + "wte.weight"), st.source(),
              ": 'lm_head.weight' differs from 'wte.weight'; xfmr's GPT-2 ties its head to the token embedding");
      continue;
    }
    const std::string_view local = std::string_view(n).starts_with(prefix) ? std::string_view(n).substr(prefix.size())
                                                                           : std::string_view(n);
    const auto b = block_prefix_end(local);
    const bool mask_buffer = b != std::string_view::npos &&
                             (local.substr(b) == "attn.bias" || local.substr(b) == "attn.masked_bias");
    require(mask_buffer, st.source(), ": tensor '", n, "' is not part of a GPT-2 of this shape");
  }
}

template <class S>
void gpt2_add(SafeTensorsWriter& w, const std::string& name, const std::vector<std::int64_t>& shape,
              const std::vector<S>& values, bool transposed) {
  std::vector<float> f(values.begin(), values.end());
  if (transposed) w.add<float>(name, {shape[1], shape[0]}, std::span<const float>(transpose(f, shape[0], shape[1])));
  else w.add<float>(name, shape, std::span<const float>(f));
}
template void gpt2_add<float>(SafeTensorsWriter&, const std::string&, const std::vector<std::int64_t>&,
                              const std::vector<float>&, bool);
template void gpt2_add<double>(SafeTensorsWriter&, const std::string&, const std::vector<std::int64_t>&,
                               const std::vector<double>&, bool);

void gpt2_write(const fs::path& dir, const SafeTensorsWriter& written, const Gpt2Config& config, bool overwrite,
                std::span<const AttachedFile> attached) {
  SafeTensorsWriter w = written;
  w.set_metadata("config", config.to_json());
  write_hf_directory(dir, w, config.to_json(), overwrite, attached);
}

void gpt2_check_config(const Gpt2Config& c, const std::string& source, int vocab, const PresetInfo& p) {
  const int max_t = p.max_t, d = p.d_model, layers = p.n_layers, heads = p.n_heads, d_ff = p.d_ff;
  auto same = [&](const char* field, int file, const char* ours, int model) {
    require(file == model, source, ": ", field, " is ", file, " but the model's ", ours, " is ", model);
  };
  same("vocab_size", c.vocab_size, "vocabulary", vocab);
  same("n_positions", c.n_positions, "MAX_T", max_t);
  same("n_embd", c.n_embd, "D_MODEL", d);
  same("n_layer", c.n_layer, "N_LAYERS", layers);
  same("n_head", c.n_head, "N_HEADS", heads);
  same("n_inner", c.d_ff(), "D_FF", d_ff);
  require(c.activation_function == "gelu_new" || c.activation_function == "gelu_pytorch_tanh", source,
          ": activation_function '", c.activation_function,
          "' is not GELU's tanh approximation (gelu_new or gelu_pytorch_tanh), which xfmr's Gelu computes");
  require(std::abs(c.layer_norm_epsilon - p.norm_eps) <= 1e-12 * p.norm_eps, source, ": layer_norm_epsilon ",
          c.layer_norm_epsilon, " but the model's norms' epsilon is ", p.norm_eps);
}

void gpt2_check_preset(const PresetInfo& p) {
  require(gpt2_shaped(p), "GPT-2 needs a pre-norm LayerNorm decoder with GELU, learned positions and biases; the preset '",
          p.name, "' (", p.shape(), ") is not one");
}

void gpt2_check_options(const DecoderOptions& o) {
  require(o.tie_weights && !o.head_bias,
          "a GPT-2 checkpoint needs a Decoder built with tie_weights and without head_bias, as GPT-2 is");
}

}  // namespace detail
}  // namespace xfmr
