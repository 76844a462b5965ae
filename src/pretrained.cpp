// pretrained.cpp: which format a checkpoint is in, and which preset its
// config names (io/pretrained.hpp).
#include "xfmr/io/pretrained.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "xfmr/text/text.hpp"

namespace fs = std::filesystem;

namespace xfmr {

std::string_view format_name(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::gpt2: return "gpt2";
    case CheckpointFormat::hf_llama: return "llama";
    case CheckpointFormat::llama2c: return "llama2.c";
  }
  return "?";
}

CheckpointFormat checkpoint_format(const fs::path& path) {
  require(fs::exists(path), path.string(), ": no such file or directory (a Hugging Face model directory, its "
          ".safetensors file, or a llama2.c .bin file)");
  if (fs::is_regular_file(path) && path.extension() != ".safetensors") {
    // llama2.c: version 1's magic "ak42", or the legacy header of seven positive int32.
    std::ifstream in(path, std::ios::binary);
    unsigned char head[28] = {};
    in.read(reinterpret_cast<char*>(head), sizeof head);
    std::uint32_t magic = 0;
    std::memcpy(&magic, head, 4);
    // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative
    // when the classifier is its own), seq_len: sizes of a model.
    std::int32_t f[7] = {};
    std::memcpy(f, head, sizeof f);
    const auto size = [](std::int32_t v) { return v > 0 && v <= (1 << 20); };
    const bool legacy = in.gcount() == sizeof head && size(f[0]) && size(f[1]) && size(f[2]) && size(f[3]) &&
                        size(f[4]) && f[0] % f[3] == 0 && f[3] % f[4] == 0 && f[5] != 0 && size(std::abs(f[5])) &&
                        size(f[6]);
    require(magic == 0x616b3432 || legacy, path.string(), ": not a llama2.c checkpoint (no version-1 magic, no legacy "
            "header), nor a .safetensors file");
    return CheckpointFormat::llama2c;
  }
  const fs::path file = fs::is_directory(path) ? path / "model.safetensors" : path;
  const fs::path config = file.parent_path() / "config.json";
  std::string type;
  if (fs::exists(config)) {
    const auto j = nlohmann::json::parse(read_text_file(config), nullptr, false);
    require(j.is_object() && j.contains("model_type") && j["model_type"].is_string(), config.string(),
            ": no model_type (\"gpt2\" or \"llama\")");
    type = j["model_type"];
  } else {
    require(fs::exists(file), file.string(), ": no such file, and no config.json beside it");
    // A GPT-2 file xfmr wrote carries its config in its metadata.
    const SafeTensors st = SafeTensors::load(file);
    require(st.metadata().count("config"), file.string(), ": no config.json beside it to say what model it is");
    type = "gpt2";
  }
  if (type == "gpt2") return CheckpointFormat::gpt2;
  if (type == "llama") return CheckpointFormat::hf_llama;
  detail::fail(config.string(), ": model_type \"", type, "\" is not one xfmr reads (\"gpt2\" or \"llama\")");
}

namespace {

// The preset of `family` whose info has the config's sizes, or the error.
std::string_view find_preset(bool (*family)(const PresetInfo&), const char* family_name, const PresetInfo& want,
                             const std::string& source) {
  std::string have;
  for (const std::string_view name : LanguageModelPresets::names()) {
    const PresetInfo p = LanguageModelPresets::info(name);
    if (!family(p)) continue;
    if (p.d_model == want.d_model && p.n_heads == want.n_heads && p.n_kv_heads == want.n_kv_heads &&
        p.n_layers == want.n_layers && p.d_ff == want.d_ff && p.max_t == want.max_t)
      return name;
    have += (have.empty() ? "" : ", ") + std::string(name) + " (" + p.shape() + ")";
  }
  detail::fail(source, ": a ", family_name, " of shape ", want.shape(), " matches no preset; xfmr has ", have,
               " (a shape of one's own is a preset of one's own: presets.hpp)");
}

PresetInfo shape(int max_t, int d, int heads, int kv_heads, int layers, int d_ff) {
  PresetInfo p;
  p.max_t = max_t, p.d_model = d, p.n_heads = heads, p.n_kv_heads = kv_heads, p.n_layers = layers, p.d_ff = d_ff;
  return p;
}

}  // namespace

std::string_view gpt2_preset(const Gpt2Config& c, const std::string& source) {
  return find_preset(gpt2_shaped, "GPT-2", shape(c.n_positions, c.n_embd, c.n_head, c.n_head, c.n_layer, c.d_ff()),
                     source);
}

std::string_view hf_llama_preset(const HfLlamaConfig& c, const std::string& source) {
  return find_preset(llama_shaped, "Llama",
                     shape(c.max_position_embeddings, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                           c.num_hidden_layers, c.intermediate_size),
                     source);
}

std::string_view llama2c_preset(const Llama2cConfig& c, const std::string& source) {
  return find_preset(llama_shaped, "Llama",
                     shape(c.seq_len, c.dim, c.n_heads, c.n_kv_heads, c.n_layers, c.hidden_dim), source);
}

}  // namespace xfmr
