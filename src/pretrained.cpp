// pretrained.cpp: which format a checkpoint is in, and which preset its
// config names (io/pretrained.hpp).
#include "xfmr/io/pretrained.hpp"

#include "json_bounds.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "xfmr/io/gguf.hpp"
#include "xfmr/text/text.hpp"

namespace fs = std::filesystem;

namespace xfmr {

std::string_view format_name(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::gpt2: return "gpt2";
    case CheckpointFormat::hf_llama: return "llama";
    case CheckpointFormat::llama2c: return "llama2.c";
    case CheckpointFormat::xfmr: return "xfmr";
    case CheckpointFormat::gguf: return "gguf";
  }
  return "?";
}

CheckpointFormat checkpoint_format(const fs::path& path) {
  require(fs::exists(path), path.string(), ": no such file or directory (a Hugging Face model directory, its "
          ".safetensors file, or a llama2.c .bin file)");
  // Any other file is read as llama2.c's: its reader checks the header and
  // names the field it refuses (a legacy header has no magic to test first).
  if (fs::is_regular_file(path) && path.extension() != ".safetensors")
    return is_gguf_file(path) ? CheckpointFormat::gguf : CheckpointFormat::llama2c;
  const fs::path file = fs::is_directory(path) ? path / "model.safetensors" : path;
  const fs::path config = file.parent_path() / "config.json";
  std::string type;
  if (fs::exists(config)) {
    const std::string text = read_text_file(config);
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) (void)detail::parse_json_object(text, config.string(), "a model's config");  // names the fault
    require(j.is_object(), config.string(), ": not a JSON object (a JSON value of another kind)");
    require(j.contains("model_type") && j["model_type"].is_string(), config.string(),
            ": no model_type (\"gpt2\", \"llama\", \"qwen2\" or \"mistral\")");
    type = j["model_type"];
  } else {
    require(fs::exists(file), file.string(), ": no such file, and no config.json beside it");
    // A GPT-2 file xfmr wrote carries its config in its metadata.
    const SafeTensors st = SafeTensors::load(file);
    require(st.metadata().count("config"), file.string(), ": no config.json beside it to say what model it is");
    type = "gpt2";
  }
  if (type == "gpt2") return CheckpointFormat::gpt2;
  if (type == "llama" || type == "qwen2" || type == "mistral") return CheckpointFormat::hf_llama;
  detail::fail(config.string(), ": model_type \"", type,
               "\" is not one xfmr reads (\"gpt2\", \"llama\", \"qwen2\" or \"mistral\")");
}

ChatTemplate model_chat_template(const fs::path& path) {
  if (fs::is_directory(path)) return ChatTemplate::for_model(path);
  if (!is_gguf_file(path)) return ChatTemplate{};
  const GgufFile g = GgufFile::open(path);
  const char* key = "tokenizer.chat_template";
  return g.has(key) ? ChatTemplate::detect(g.string(key)) : ChatTemplate{};
}

PresetInfo llama2c_architecture(const Llama2cConfig& c) {
  HfLlamaConfig h;
  h.max_position_embeddings = c.seq_len, h.hidden_size = c.dim, h.num_attention_heads = c.n_heads;
  h.num_key_value_heads = c.n_kv_heads, h.num_hidden_layers = c.n_layers, h.intermediate_size = c.hidden_dim;
  PresetInfo p = hf_llama_architecture(h);
  if (p.name == "llama") p.name = "llama2.c";
  return p;
}

FoundTokenizer load_model_tokenizer(CheckpointFormat format, const fs::path& weights, const Metadata& metadata,
                                    int vocab, const fs::path& given) {
  const fs::path model = format == CheckpointFormat::xfmr ? weights.parent_path() : weights;
  fs::path source = given;
  if (source.empty() && format == CheckpointFormat::xfmr) {
    source = metadata.count("tokenizer") ? fs::path(metadata.at("tokenizer")) : model;  // an older checkpoint's
    for (const auto& e : fs::directory_iterator(model))
      if (is_tokenizer_file_name(e.path().filename().string())) source = model;
  } else if (source.empty()) {
    source = format == CheckpointFormat::gguf ? fs::absolute(weights) : fs::absolute(weights).parent_path();
  }
  ModelTokenizer tokenizer = ModelTokenizer::load(source);
  const int padding = vocab > 0 ? tokenizer.check_fits(vocab, "the model " + model.string()) : 0;
  return {std::move(tokenizer), fs::absolute(source), padding};
}

}  // namespace xfmr
